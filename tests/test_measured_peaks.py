"""Achievable peaks (hardware.peaks=measured): measured once per device, dtype and torch version, then cached.

The CUDA measurement is replaced by fixed rates, so this runs anywhere; tests/test_gpu_calibration.py measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments import calibration, measured_peaks
from llm_perf_opt.instruments.calibration import AchievedRate, Workload
from llm_perf_opt.instruments.measured_peaks import (
    cache_path,
    check_peaks_setting,
    measured_peak_bandwidth,
    measured_peak_compute,
)

GPU = torch.device("cuda", 1)
NAME = "NVIDIA H100 80GB HBM3"
RATES = {"gemm_bfloat16": 731.8e12, "gemm_float16": 735.0e12, "gemm_float32": 390.0e12, "copy": 2.9e12}


@pytest.fixture
def fake_gpu(monkeypatch):
    """CUDA replaced: workloads are named stubs, rates come from RATES, every measurement is logged."""
    log: list[tuple[str, bool]] = []

    def gemm_workload(device, dtype=torch.bfloat16, size=8192):
        assert device == GPU
        name = str(dtype).removeprefix("torch.")
        return Workload(f"gemm_{name}", lambda: None, 2.0 * size**3, "FLOP", f"{size}³ {name} GEMM (torch.matmul)")

    def copy_workload(device, gib=1.0):
        assert device == GPU
        return Workload("copy", lambda: None, 2.0 * gib * 2**30, "byte", f"{gib:g} GiB copy")

    def achieved_rate(workload, device, **_):
        log.append((workload.name, torch.backends.cuda.matmul.allow_tf32))
        unit = "FLOP/s" if workload.unit == "FLOP" else "B/s"
        return AchievedRate(RATES[workload.name], unit, f"{workload.description}, median of 5 × 20 runs")

    monkeypatch.setattr(calibration, "gemm_workload", gemm_workload)
    monkeypatch.setattr(calibration, "copy_workload", copy_workload)
    monkeypatch.setattr(calibration, "achieved_rate", achieved_rate)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: NAME)
    return log


def test_measured_once_then_read_from_the_cache(fake_gpu, tmp_path: Path) -> None:
    first = measured_peak_compute(GPU, "bfloat16", cache_dir=tmp_path)
    again = measured_peak_compute(GPU, "torch.bfloat16", cache_dir=tmp_path)
    assert fake_gpu == [("gemm_bfloat16", torch.backends.cuda.matmul.allow_tf32)]  # one measurement
    assert first is not None and again == first
    assert (first.value, first.unit, first.dtype_key, first.device_name) == (731.8e12, "FLOP/s", "bf16", NAME)
    assert first.source.startswith("measured on this device: 8192³ bfloat16 GEMM (torch.matmul), median of 5")
    path = cache_path(NAME, tmp_path)
    assert path.name == f"peaks-nvidia-h100-80gb-hbm3-{measured_peaks._slug(torch.__version__)}.json"
    assert str(path) in first.source and torch.__version__ in first.source
    cached = json.loads(path.read_text())
    assert cached["device_name"] == NAME and cached["torch"] == torch.__version__
    assert cached["figures"]["bf16"]["value"] == 731.8e12


def test_each_dtype_and_the_bandwidth_are_measured_once_into_one_file(fake_gpu, tmp_path: Path) -> None:
    fp16 = measured_peak_compute(GPU, "float16", cache_dir=tmp_path)
    bw = measured_peak_bandwidth(GPU, cache_dir=tmp_path)
    assert fp16 is not None and fp16.value == 735.0e12
    assert bw is not None and (bw.value, bw.unit, bw.dtype_key) == (2.9e12, "B/s", None)
    assert bw.source.startswith("measured on this device: 1 GiB copy")
    measured_peak_bandwidth(GPU, cache_dir=tmp_path)
    measured_peak_compute(GPU, "float16", cache_dir=tmp_path)
    assert [name for name, _ in fake_gpu] == ["gemm_float16", "copy"]
    assert set(json.loads(cache_path(NAME, tmp_path).read_text())["figures"]) == {"fp16", "bandwidth"}


def test_fp32_is_measured_with_and_without_tf32_and_the_setting_is_restored(fake_gpu, tmp_path: Path) -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    tf32 = measured_peak_compute(GPU, "float32", tf32_matmul=True, cache_dir=tmp_path)
    fp32 = measured_peak_compute(GPU, "float32", tf32_matmul=False, cache_dir=tmp_path)
    assert fake_gpu == [("gemm_float32", True), ("gemm_float32", False)]
    assert tf32 is not None and tf32.dtype_key == "tf32"
    assert fp32 is not None and fp32.dtype_key == "fp32"
    assert torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"device_name": NAME}), json.dumps({"device_name": NAME, "torch": "0.1", "figures": {}})],
    ids=["damaged", "incomplete", "other-torch"],
)
def test_a_bad_or_foreign_cache_is_measured_again_and_rewritten(fake_gpu, tmp_path: Path, content: str) -> None:
    path = cache_path(NAME, tmp_path)
    path.write_text(content)
    peak = measured_peak_compute(GPU, "bf16", cache_dir=tmp_path)
    assert peak is not None and peak.value == 731.8e12 and len(fake_gpu) == 1
    assert json.loads(path.read_text())["torch"] == torch.__version__


def test_a_cache_of_another_device_is_not_used(fake_gpu, tmp_path: Path) -> None:
    path = cache_path(NAME, tmp_path)
    other = {"device_name": "NVIDIA A100-SXM4-80GB", "torch": torch.__version__, "figures": {"bf16": {
        "value": 1.0, "unit": "FLOP/s", "method": "x", "measured": "2026-01-01T00:00:00+00:00"}}}  # fmt: skip
    path.write_text(json.dumps(other))
    peak = measured_peak_compute(GPU, "bf16", cache_dir=tmp_path)
    assert peak is not None and peak.value == 731.8e12


def test_nothing_is_measured_off_cuda_or_for_fp8(fake_gpu, tmp_path: Path) -> None:
    assert measured_peak_compute(torch.device("cpu"), "bfloat16", cache_dir=tmp_path) is None
    assert measured_peak_bandwidth(torch.device("cpu"), cache_dir=tmp_path) is None
    assert measured_peak_compute(GPU, "fp8", cache_dir=tmp_path) is None
    assert fake_gpu == [] and not list(tmp_path.iterdir())


def test_out_of_memory_is_a_user_error(fake_gpu, tmp_path: Path, monkeypatch) -> None:
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(calibration, "copy_workload", no_memory)
    with pytest.raises(UserError, match=r"hardware\.peaks=datasheet"):
        measured_peak_bandwidth(GPU, cache_dir=tmp_path)
    assert not cache_path(NAME, tmp_path).exists()


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_path(NAME).parent == tmp_path / "llm_perf_opt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_path(NAME).parent == Path.home() / ".cache" / "llm_perf_opt"


@pytest.mark.parametrize("value", ["datasheet", "measured"])
def test_peaks_settings(value: str) -> None:
    assert check_peaks_setting(value) == value


@pytest.mark.parametrize("value", ["Measured", "both", None, 1])
def test_bad_peaks_setting_is_a_user_error(value: object) -> None:
    with pytest.raises(UserError, match=r"hardware\.peaks"):
        check_peaks_setting(value)


def test_stage1_config_defaults_to_datasheet_peaks() -> None:
    assert check_peaks_setting(compose_config("stage1").hardware.peaks) == "datasheet"

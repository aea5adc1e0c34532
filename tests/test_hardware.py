"""GPU peak table: name matching, dense values against the reference, sources and overrides."""

from __future__ import annotations

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.hardware import (
    DTYPE_KEYS,
    GpuSpec,
    compute_dtype_key,
    load_gpu_table,
    match_gpu,
    peak_bandwidth,
    peak_compute,
)

H100_SXM = "NVIDIA H100 80GB HBM3"

# Names as torch.cuda.get_device_name() reports them.
REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100_sxm",
    "NVIDIA H100 PCIe": "h100_pcie",
    "NVIDIA H100 NVL": "h100_nvl",
    "NVIDIA H200": "h200_sxm",
    "NVIDIA H200 NVL": "h200_nvl",
    "NVIDIA A100-SXM4-80GB": "a100_sxm4_80gb",
    "NVIDIA A100 80GB PCIe": "a100_pcie_80gb",
    "NVIDIA A100-SXM4-40GB": "a100_40gb",
    "NVIDIA A100-PCIE-40GB": "a100_40gb",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx_4090",
    "NVIDIA GeForce RTX 5090": "rtx_5090",
    "NVIDIA B200": "b200",
}

# Dense values from /work/shared/reference/deepseek-ocr-facts.md section 6 (TFLOP/s, GB/s).
REFERENCE_ROWS = {
    "a100_sxm4_80gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 80, 2039),
    "a100_pcie_80gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 80, 1935),
    "a100_40gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 40, 1555),
    "h100_sxm": ({"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979}, 80, 3350),
    "h100_pcie": ({"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513}, 80, 2000),
    "h100_nvl": ({"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, 94, 3900),
    "h200_sxm": ({"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979}, 141, 4800),
    "h200_nvl": ({"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, 141, 4800),
    "l4": ({"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5}, 24, 300),
    "l40s": ({"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733}, 48, 864),
    # GeForce: FP32-accumulate figures.
    "rtx_4090": ({"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3}, 24, 1008),
    # fp8 absent: the FP32-accumulate FP8 rate is marked uncertain in the reference.
    "rtx_5090": ({"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5}, 32, 1792),
    "b200": ({"fp32": 75, "tf32": 1100, "bf16": 2250, "fp16": 2250, "fp8": 4500}, 180, 7700),
}


@pytest.mark.parametrize(("name", "key"), sorted(REAL_NAMES.items()))
def test_real_device_names_match(name: str, key: str) -> None:
    spec = match_gpu(name)
    assert spec is not None and spec.key == key


def test_matching_is_case_insensitive() -> None:
    spec = match_gpu("nvidia h100 nvl")
    assert spec is not None and spec.key == "h100_nvl"


def test_l4_and_l40s_stay_apart() -> None:
    l4, l40s = match_gpu("NVIDIA L4"), match_gpu("NVIDIA L40S")
    assert l4 is not None and l4.key == "l4"
    assert l40s is not None and l40s.key == "l40s"
    assert match_gpu("NVIDIA L40") is None


@pytest.mark.parametrize(
    "name",
    [
        "cpu",
        "",
        "AMD EPYC 7763 64-Core Processor",
        "AMD Instinct MI300X",
        "NVIDIA GeForce RTX 3090",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA GH200 480GB",
        "NVIDIA GB200",
        "NVIDIA A10",
        "NVIDIA H800",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
    ],
)
def test_unknown_or_partial_devices_have_no_peak(name: str) -> None:
    assert match_gpu(name) is None
    assert peak_compute(name, "bfloat16") is None
    assert peak_bandwidth(name) is None


def test_table_covers_reference_exactly() -> None:
    assert [s.key for s in load_gpu_table()] == [
        "a100_sxm4_80gb", "a100_pcie_80gb", "a100_40gb", "h100_nvl", "h100_pcie", "h100_sxm",
        "h200_nvl", "h200_sxm", "l4", "l40s", "rtx_4090", "rtx_5090", "b200",
    ]  # fmt: skip
    assert set(REFERENCE_ROWS) == {s.key for s in load_gpu_table()}


@pytest.mark.parametrize("key", sorted(REFERENCE_ROWS))
def test_dense_values_equal_reference(key: str) -> None:
    tflops, memory_gb, bandwidth_gbps = REFERENCE_ROWS[key]
    spec = next(s for s in load_gpu_table() if s.key == key)
    assert dict(spec.dense_tflops) == tflops
    assert spec.memory_gb == memory_gb
    assert spec.bandwidth_gbps == bandwidth_gbps


@pytest.mark.parametrize("spec", load_gpu_table(), ids=lambda s: s.key)
def test_entry_sanity(spec: GpuSpec) -> None:
    assert spec.sources and all(s.startswith("https://") for s in spec.sources)
    assert set(spec.dense_tflops) <= set(DTYPE_KEYS)
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(spec.dense_tflops)
    d = spec.dense_tflops
    assert d["bf16"] >= d["tf32"] >= d["fp32"] > 0
    assert d["fp16"] == d["bf16"]
    if "fp8" in d:
        assert d["fp8"] >= d["bf16"]
    assert spec.memory_gb > 0 and spec.bandwidth_gbps > 0


def test_h100_sxm_bf16_peak_and_source() -> None:
    peak = peak_compute(H100_SXM, "bfloat16")
    assert peak is not None
    assert peak.value == pytest.approx(989.4e12, rel=1e-12)
    assert peak.unit == "FLOP/s" and peak.dtype_key == "bf16" and peak.device_name == H100_SXM
    assert peak.source.startswith("datasheet: NVIDIA H100 SXM5, dense BF16 tensor core (https://")


def test_fp32_picks_tf32_or_plain_fp32() -> None:
    on = peak_compute(H100_SXM, "float32", tf32_matmul=True)
    off = peak_compute(H100_SXM, "float32", tf32_matmul=False)
    assert on is not None and on.dtype_key == "tf32" and on.value == pytest.approx(494.7e12)
    assert off is not None and off.dtype_key == "fp32" and off.value == pytest.approx(67e12)
    assert "TF32" in on.source and "FP32 (non-tensor-core)" in off.source


def test_missing_dtype_figure_is_none() -> None:
    assert peak_compute("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_compute("NVIDIA GeForce RTX 5090", "float8_e4m3fn") is None
    fp8 = peak_compute(H100_SXM, "float8_e4m3fn")
    assert fp8 is not None and fp8.value == pytest.approx(1979e12)


def test_geforce_uses_fp32_accumulate_rate() -> None:
    peak = peak_compute("NVIDIA GeForce RTX 4090", "float16")
    assert peak is not None and peak.value == pytest.approx(165.2e12)


def test_overrides_win() -> None:
    peak = peak_compute(H100_SXM, "bf16", override_tflops=500.0)
    assert peak is not None and peak.value == pytest.approx(500e12)
    assert peak.source == "user override: hardware.peak_tflops=500"
    cpu = peak_compute("cpu", "float32", override_tflops=1.5)
    assert cpu is not None and cpu.value == pytest.approx(1.5e12) and cpu.dtype_key == "fp32"
    bw = peak_bandwidth("cpu", override_gbps=204.8)
    assert bw is not None and bw.value == pytest.approx(204.8e9) and bw.unit == "B/s"
    assert bw.source == "user override: hardware.peak_bandwidth_gbps=204.8"
    bw_known = peak_bandwidth(H100_SXM, override_gbps=3000)
    assert bw_known is not None and bw_known.value == pytest.approx(3e12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_overrides_raise(bad: float) -> None:
    with pytest.raises(UserError):
        peak_compute(H100_SXM, "bf16", override_tflops=bad)
    with pytest.raises(UserError):
        peak_bandwidth(H100_SXM, override_gbps=bad)


def test_h100_sxm_bandwidth() -> None:
    bw = peak_bandwidth(H100_SXM)
    assert bw is not None
    assert bw.value == pytest.approx(3.35e12, rel=1e-12)
    assert bw.unit == "B/s" and bw.dtype_key is None
    assert bw.source.startswith("datasheet: NVIDIA H100 SXM5") and "https://" in bw.source


@pytest.mark.parametrize(
    ("dtype", "tf32", "key"),
    [
        ("bfloat16", False, "bf16"),
        ("bf16", False, "bf16"),
        ("torch.bfloat16", False, "bf16"),
        ("float16", False, "fp16"),
        ("fp16", False, "fp16"),
        ("half", False, "fp16"),
        ("float32", False, "fp32"),
        ("float32", True, "tf32"),
        ("fp32", True, "tf32"),
        ("float8_e4m3fn", False, "fp8"),
        ("fp8", False, "fp8"),
    ],
)
def test_compute_dtype_key(dtype: str, tf32: bool, key: str) -> None:
    assert compute_dtype_key(dtype, tf32_matmul=tf32) == key


@pytest.mark.parametrize("dtype", ["int8", "float64", "", "bogus"])
def test_compute_dtype_key_unknown_raises(dtype: str) -> None:
    with pytest.raises(ValueError, match="unknown compute dtype"):
        compute_dtype_key(dtype, tf32_matmul=False)


def test_table_is_cached() -> None:
    assert load_gpu_table() is load_gpu_table()

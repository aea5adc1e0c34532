"""Stage 2 without a GPU: override forwarding, workload command, and re-rendering from real H100 exports."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from helpers import run_cli, unpack_nsys_fixture
from llm_perf_opt.cli.common import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline.stage2 import CAPTURE_FILE, TARGETS_FILE, forwarded_overrides, render, workload_argv

FIXTURES = Path(__file__).parent / "fixtures"


def compose_stage2(*overrides: str) -> DictConfig:
    return compose_config("stage2", *overrides)


def test_every_workload_override_is_forwarded() -> None:
    task = [
        "model=deepseek_ocr2_tiny",
        "model.dtype=float16",
        "model.preprocess.max_tiles=2",
        "infer.max_new_tokens=9",
        "dataset.root=/data",
        "dataset.subset_filelist=l.txt",
        "stage2.mode=deep",
        "pipeline.ncu.clock_control=base",
        "pipeline/nsys=default",
        "hydra.run.dir=/x",
        "+model.extra=1",
    ]
    assert forwarded_overrides(task) == [
        "model=deepseek_ocr2_tiny",
        "model.dtype=float16",
        "model.preprocess.max_tiles=2",
        "infer.max_new_tokens=9",
        "dataset.root=/data",
        "dataset.subset_filelist=l.txt",
        "+model.extra=1",
    ]


def test_workload_argv_adds_stage2_settings(tmp_path: Path) -> None:
    cfg = compose_stage2()
    argv = workload_argv(cfg, ["model=deepseek_ocr2_tiny", "run.repeats=3"], tmp_path, name="nsys")
    assert argv[:3] == [sys.executable, "-m", "llm_perf_opt.cli.stage1"]
    assert "model=deepseek_ocr2_tiny" in argv
    assert "pipeline.torch_profiler.enable=false" in argv
    assert "run.repeats=3" in argv and "run.repeats=1" not in argv  # the user's value wins
    assert "run.warmup=1" in argv
    assert argv[-1] == f"hydra.run.dir={tmp_path / 'workload' / 'nsys'}"
    ncu = workload_argv(cfg, ["infer.max_new_tokens=32"], tmp_path, name="ncu-decode", ncu=True)
    assert "dataset.max_images=1" in ncu and ncu.index("infer.max_new_tokens=4") > ncu.index("infer.max_new_tokens=32")


def test_stage2_config_composes_with_stage1_keys() -> None:
    cfg = compose_stage2("stage2.mode=deep")
    assert cfg.model.name == "deepseek_ocr"  # the default model
    assert cfg.stage2.modes[cfg.stage2.mode].top_kernels == 20
    assert list(cfg.pipeline.nsys.trace) == ["cuda", "nvtx", "osrt"]
    assert cfg.pipeline.ncu.clock_control == "none"


def _stage2_folder(root: Path) -> Path:
    """A Stage 2 folder assembled from the H100 fixtures (as stage2-profile leaves it)."""
    folder = root / "run"
    unpack_nsys_fixture(folder)
    (folder / "ncu" / "decode").mkdir(parents=True)
    shutil.copy(FIXTURES / "ncu" / "h100_tiny_decode_raw.csv", folder / "ncu" / "decode" / "raw.csv")
    (folder / CAPTURE_FILE).write_text(
        json.dumps(
            {
                "run_id": "fixture",
                "mode": "light",
                "ncu_clock_control": "none",
                "tools": {
                    "nsys": {"path": "/opt/nsys", "version": "2025.3.1"},
                    "ncu": {"path": "/opt/ncu", "version": "2025.3.1"},
                },
                "runs": {"nsys_profile": {"seconds": 30.0, "returncode": 0}},
                "forwarded_overrides": ["model=deepseek_ocr2_tiny"],
            }
        )
    )
    (folder / TARGETS_FILE).write_text(
        json.dumps(
            {
                "mode": "light",
                "stages": {
                    "decode": {
                        "kernels": ["indexSelectSmallIndex", "no_such_kernel"],
                        "calls": {"indexSelectSmallIndex": 6},
                        "instances": 6,
                        "rounds": [
                            {
                                "folder": "ncu/decode",
                                "kernels": ["indexSelectSmallIndex", "no_such_kernel"],
                                "launch_skip": 0,
                                "launch_count": 6,
                                "regex": "^(indexSelectSmallIndex|no_such_kernel)$",
                            }
                        ],
                    }
                },
            }
        )
    )
    (folder / "env.json").write_text(json.dumps({"gpu": {"driver": "580.159.04"}}))
    return folder


def test_render_from_h100_exports(tmp_path: Path) -> None:
    folder = render(_stage2_folder(tmp_path))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["stage"] == "stage2" and metrics["schema_version"] == "1.0"
    assert metrics["device"]["name"] == "NVIDIA H100 80GB HBM3"
    stages = {s["stage"]: s for s in metrics["stages"]}
    assert {"prefill", "decode", "decode/step", "vision/sam", "vision/encoder"} <= set(stages)
    assert 0 < stages["decode"]["busy_fraction"] <= 1
    assert metrics["decode_steps"]["steps"] == 6
    assert metrics["top_kernels"] and metrics["kernel_count"] > 1000
    assert any(r["stage"] == "decode" for r in metrics["ncu_kernels"])
    assert any("no_such_kernel" in w for w in metrics["warnings"])
    kernels = (folder / "kernels.md").read_text()
    assert "## decode" in kernels and "TFLOP/s (ncu)" in kernels
    report = (folder / "report.md").read_text()
    assert "GPU time per stage" in report and "Decode: 6 steps" in report
    assert (folder / "stakeholder_summary.md").read_text().count("Recommendations") == 1


def test_rerender_command_on_a_copied_folder(tmp_path: Path) -> None:
    copy = tmp_path / "copied"
    shutil.copytree(_stage2_folder(tmp_path), copy)
    done = run_cli("llm_perf_opt.cli.stage2_report", str(copy), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (copy / "kernels.md").is_file() and (copy / "report.md").is_file()


def test_render_rejects_a_folder_without_exports(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a complete Stage 2 folder"):
        render(tmp_path)
    done = run_cli("llm_perf_opt.cli.stage2_report", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "nsys/report.sqlite" in done.stderr


def test_stage2_without_gpu_fails_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU error")
    out = tmp_path / "s2"
    done = run_cli("llm_perf_opt.cli.stage2", "model=deepseek_ocr2_tiny", f"hydra.run.dir={out}", timeout=120)
    assert done.returncode == 2
    assert "GPU" in done.stderr and "Traceback" not in done.stderr
    status = json.loads((out / "run_status.json").read_text())
    assert status["state"] == "failed" and status["stage"] == "stage2"


def test_launch_window_lands_in_a_middle_decode_step() -> None:
    from llm_perf_opt.pipeline.stage2 import Stage2Run

    cfg = compose_stage2("stage2.ncu_workload.max_new_tokens=9")
    run = Stage2Run(cfg, Path("/nonexistent"), run_id="x", task_overrides=[])
    target = {"calls": {"gemm": 310, "add": 620, "lm_head": 31}, "instances": 31}
    # 30 matching launches per step; the ncu workload decodes 8 steps: skip 4 steps, count one step (capped).
    assert run._launch_window("decode", ["gemm", "add"], target, 1) == (120, 8)
    assert run._launch_window("decode", ["lm_head"], target, 1) == (4, 1)
    assert run._launch_window("prefill", ["gemm"], {"calls": {"gemm": 50}, "instances": 5}, 2) == (0, 8)


def test_later_rounds_take_the_rarest_missing_kernels() -> None:
    from llm_perf_opt.pipeline.stage2 import Stage2Run

    run = Stage2Run(compose_stage2(), Path("/nonexistent"), run_id="x", task_overrides=[])
    target = {"calls": {"device_kernel": 3410, "lm_head": 155, "norm": 310}, "instances": 155}
    # per step: lm_head 1, norm 2, device_kernel 22; the window for k kernels holds 4k launches.
    assert run._rarest_fitting(["device_kernel", "lm_head", "norm"], target, 1) == ["lm_head", "norm"]
    assert run._rarest_fitting(["device_kernel"], target, 1) == ["device_kernel"]


def test_render_adds_mfu_and_mbu_from_the_workload_metrics(tmp_path: Path) -> None:
    folder = _stage2_folder(tmp_path)
    workload = {
        "model": {"name": "deepseek_ocr2_tiny", "weights_detail": "random weights"},
        "records": [],
        "flops_per_image": {},
        "mfu": [{"stage": "prefill", "peak": {"value": 989.4e12, "source": "datasheet"}}],
        "efficiency": [{"stage": "prefill", "bytes": 2.0e9}, {"stage": "decode", "bytes": 1.0e9}],
        "bandwidth_peak": {"value": 3.35e12, "source": "datasheet"},
    }
    (folder / "workload" / "nsys").mkdir(parents=True)
    (folder / "workload" / "nsys" / "metrics.json").write_text(json.dumps(workload))
    metrics = json.loads((render(folder) / "metrics.json").read_text())
    prefill = next(s for s in metrics["stages"] if s["stage"] == "prefill")
    assert prefill["bytes"] == 2.0e9
    assert prefill["mbu_on_busy_time"] == pytest.approx(2.0e9 / (prefill["gpu_busy_ms"] / 1e3) / 3.35e12)
    assert "MBU on busy time" in (folder / "report.md").read_text()

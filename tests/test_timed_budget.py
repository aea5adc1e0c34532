"""The device default's budget for timed passes: long passes take fewer of them (never under 3), short ones all."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import run_main
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.pipeline.stage1_settings import (
    MIN_TIMED_PASSES,
    ResolvedSettings,
    resolve_settings,
    with_timed_budget,
)


def _gpu_defaults() -> ResolvedSettings:
    cfg = compose_config("stage1")
    return resolve_settings(command_config(cfg), torch.device("cuda", 0))


def test_a_gpu_run_with_repeats_unset_has_a_budget_and_a_cpu_run_none() -> None:
    gpu = _gpu_defaults()
    assert (gpu.repeats, gpu.warmup, gpu.timed_seconds) == (5, 1, 30.0)
    cfg = compose_config("stage1")
    assert resolve_settings(command_config(cfg), torch.device("cpu")).timed_seconds is None


def test_the_first_timed_pass_fixes_how_many_fit() -> None:
    gpu = _gpu_defaults()
    assert with_timed_budget(gpu, 0.7) is gpu  # 5 passes of 0.7 s fit 30 s: all five
    assert with_timed_budget(gpu, 4.7) is gpu  # a 256-token eager pass on an H200: all five
    assert with_timed_budget(gpu, 7.8).repeats == 4
    long = with_timed_budget(gpu, 12.5)  # e.g. 1,024 tokens eager
    assert long.repeats == MIN_TIMED_PASSES == 3
    assert long.timed_seconds is None  # fixed once
    assert "cut to 3 by its timed_seconds=30" in long.sources["run.repeats"]
    assert "took 12.5 s" in long.sources["run.repeats"]
    assert with_timed_budget(gpu, 60.0).repeats == MIN_TIMED_PASSES  # never fewer than an interval needs


def test_a_run_cut_by_its_budget_records_the_passes_it_timed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "device=cpu",
        "infer.max_new_tokens=2",
        "pipeline/torch_profiler=min",
        "dataset.max_images=1",
        "report.render=false",
        "run.device_defaults.cpu.repeats=6",
        "run.device_defaults.cpu.timed_seconds=0.001",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["settings"]["repeats"] == 3
    assert metrics["settings"]["measured_passes"] == 3
    assert "cut to 3" in metrics["settings"]["sources"]["run.repeats"]

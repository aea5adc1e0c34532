"""GPU: `stage2-profile` light on the tiny DeepSeek-OCR-2 measures DRAM bytes for one instance of each stage (the
prefill with its vision sub-stages, the middle decode step) beside the analytic bytes. Needs nsys and ncu on PATH.

Set LLO_GPU_TEST_OUT to a folder to keep the run's report.md, metrics.json and ncu/targets.json there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import require_tools, run_cli
from llm_perf_opt.records.folders import METRICS_FILE, NCU_TARGETS_FILE, load_ncu_targets, load_stage2_metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VISION = ("vision/sam", "vision/encoder", "vision/projector")


def test_stage2_light_measures_bytes_per_stage_instance(tmp_path: Path) -> None:
    require_tools("nsys", "ncu")
    out = tmp_path / "s2"
    done = run_cli(
        "llm_perf_opt.cli.stage2",
        "model=deepseek_ocr2_tiny",
        "infer.max_new_tokens=6",
        "dataset.max_images=1",
        "pipeline.ncu.bytes_pass=true",
        f"hydra.run.dir={out}",
        timeout=900,
    )
    keep = os.environ.get("LLO_GPU_TEST_OUT")
    if keep:
        for name in ("report.md", METRICS_FILE, NCU_TARGETS_FILE, "ncu/bytes/cmd.txt"):
            if (out / name).is_file():
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(out / name, Path(keep) / name.replace("/", "_"))
    assert done.returncode == 0, done.stderr[-3000:]

    targets = load_ncu_targets(out)
    assert targets is not None
    passes = {p.stage: p for p in targets.bytes_passes}
    assert set(passes) == {"prefill", "decode"} and all(p.note is None for p in passes.values())
    assert passes["decode"].instance == "decode step 2 of 3" and all(p.profiler_window for p in passes.values())
    assert {p.folder for p in passes.values()} == {"ncu/bytes"}  # one process for both stage instances

    metrics = load_stage2_metrics(out / METRICS_FILE)
    measured = metrics.measured_bytes
    assert measured is not None and measured.cache_control == "none"
    rows = {r.stage: r for r in measured.rows}
    assert {"prefill", *VISION, "decode/step"} <= set(rows), metrics.warnings
    for row in rows.values():
        assert row.kernels > 0 and row.kernel_ms > 0 and row.measured_bytes > 0, row
        assert row.measured_bytes == row.dram_read_bytes + row.dram_write_bytes
    prefill, step = rows["prefill"], rows["decode/step"]
    assert prefill.kernels == passes["prefill"].expected_kernels  # the whole prefill of the image nsys saw first
    assert step.kernels == passes["decode"].expected_kernels
    assert prefill.kernels > sum(rows[v].kernels for v in VISION)  # vision is nested inside prefill
    assert prefill.measured_bytes > max(rows[v].measured_bytes for v in VISION)
    # the tiny model has an analytic model: every row has its analytic figure and a ratio
    for row in rows.values():
        assert row.analytic_bytes is not None and row.analytic_bytes > 0 and row.ratio is not None and row.ratio > 0
        assert row.analytic_source is not None and "workload/ncu-bytes" in row.analytic_source
    assert not [w for w in metrics.warnings if "bytes pass" in w or "measured bytes" in w.lower()], metrics.warnings
    # the targeted kernels: one process for every stage, each stage's rows inside its own range
    rounds = [r for t in targets.stages.values() for r in t.rounds]
    assert {r.folder for r in rounds} == {"ncu/targets"} and all(r.note is None for r in rounds)
    assert {r.stage for r in metrics.ncu_kernels} == {"prefill", "decode"}
    report = (out / "report.md").read_text()
    assert "## Measured DRAM bytes per stage instance (Nsight Compute)" in report
    assert "|decode/step|decode step 2 of 3|" in report

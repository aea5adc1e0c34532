"""The shipped H100 what-if example (examples/whatif-h100-decode): its record loads, its figures are the ones the
README quotes, its report re-renders from the record alone, and the baseline's report cites it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.pipeline.stage1 import render
from llm_perf_opt.records.folders import load_whatif
from llm_perf_opt.records.whatif import FAILED
from llm_perf_opt.report import whatif_report

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "whatif-h100-decode"


def test_the_example_record_holds_the_quoted_ladder() -> None:
    record = load_whatif(EXAMPLE)
    assert record.device == "NVIDIA H100 80GB HBM3" and record.weights == "random"
    assert record.best == "cuda_graphs"
    best = record.rung("cuda_graphs")
    assert best is not None and best.figures is not None and best.speedup is not None
    assert best.figures.decode_ms_per_token is not None
    assert best.figures.decode_ms_per_token.p50 == pytest.approx(1.56, abs=0.01)
    assert best.speedup.value == pytest.approx(15.67, abs=0.01) and best.speedup.verdict == "beyond noise"
    assert best.figures.kernels_per_step == 365 and best.attribution is not None
    assert best.attribution.idle_ms == pytest.approx(-21.80, abs=0.01)
    stopped = record.rung("ladder-2-experts_batched_mm")
    assert stopped is not None and stopped.state == FAILED and "420 s" in (stopped.reason or "")


def test_the_example_report_rerenders_from_its_record(tmp_path: Path) -> None:
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    art = ArtifactsManager(copy, stage="whatif")
    art.written.append("whatif.json")  # the runner writes the record first
    whatif_report.write_all(art, load_whatif(copy))
    assert (copy / "whatif.md").read_text() == (EXAMPLE / "whatif.md").read_text()
    render(copy / "rungs" / "00-baseline")  # inside the what-if folder: "What to try" cites it
    assert "cuda_graphs cut decode ms/token (p50) from 24.43 to 1.56 ms" in (
        copy / "rungs" / "00-baseline" / "report.md"
    ).read_text()

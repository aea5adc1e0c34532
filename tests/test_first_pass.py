"""Each input's first (warm-up) pass in report.md: beside its timed median where a run kept one, absent otherwise."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.report.stage1_reports import report_md

FIXTURES = Path(__file__).parent / "fixtures"
H100 = load_stage1_metrics(FIXTURES / "metrics" / "h100_full_stage1.json")  # 5 pages x 5 timed passes, no first ones


def test_a_run_without_first_passes_shows_no_column() -> None:
    assert H100.first_passes == ()
    assert "first pass" not in report_md(H100, None, []).lower()


def test_first_passes_slower_by_their_setup_are_shown_with_the_range_and_why() -> None:
    """A first pass 1.3 s slower than each input's median (what new attention shapes cost on an H200) is in the
    per-input table, and the paragraph below gives the range of the extra time and what lands there."""
    median = {image: s.summary.p50 for image, stats in H100.per_image.items() for s in stats if s.stage == "e2e"}
    firsts = []
    for image, p50 in median.items():
        rec = next(r for r in H100.records if r.image == image)
        firsts.append(attrs.evolve(rec, decode_ms=rec.decode_ms + (p50 - rec.e2e_ms) + 1300.0))
    report = report_md(attrs.evolve(H100, first_passes=tuple(firsts)), None, [])
    assert "|e2e|first pass e2e|" in report
    assert ": +1,300.0 to +1,300.0 ms against the input's timed median. Setup done once per new shape" in report
    assert "cuDNN" in report
    assert "The largest of these is the first-pass extra that perf-whatif judges" in report
    assert attrs.evolve(H100, first_passes=tuple(firsts)).first_pass_extra_ms == pytest.approx(1300.0)

"""Where a command's time went: the ledger's parts add up to its total, the line shown, and the records that keep
it (older folders without one still load and render)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from helpers import FIXTURES
from llm_perf_opt.records.common import OTHER_PART, TimeBudget, TimePart
from llm_perf_opt.records.folders import load_stage1_metrics, load_stage2_metrics, load_whatif
from llm_perf_opt.records.io import dumps, load_file
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report.stage1_reports import report_md
from llm_perf_opt.report.stage2_reports import report_md as stage2_report_md
from llm_perf_opt.report.whatif_report import whatif_md
from llm_perf_opt.time_ledger import START_PART, TimeLedger, process_age_s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BUDGET = TimeBudget(
    total_s=38.4,
    parts=(
        TimePart("start", 3.2),
        TimePart("build", 1.3),
        TimePart("passes", 24.1),
        TimePart("profiled pass", 2.4),
        TimePart("reports", 6.6),
        TimePart(OTHER_PART, 0.8),
    ),
)


def _check_adds_up(budget: TimeBudget) -> None:
    assert all(p.seconds >= 0 for p in budget.parts)
    assert sum(p.seconds for p in budget.parts) == pytest.approx(budget.total_s)


def test_the_ledger_parts_add_up_to_the_total_none_negative() -> None:
    ledger = TimeLedger()
    with ledger.part("build"):
        pass
    with ledger.part("reports"):
        with ledger.part("render"):  # nested: counted in its own part only
            pass
        open_budget = ledger.budget()  # taken inside a part: the open parts count up to now
    with ledger.part("build"):  # a part that recurs adds up
        pass
    budget = ledger.budget(note="2 rungs")
    for taken in (open_budget, budget):
        _check_adds_up(taken)
        names = [p.name for p in taken.parts]
        assert names[0] == START_PART and names[-1] == OTHER_PART and len(names) == len(set(names))
    assert [p.name for p in budget.parts] == [START_PART, "build", "reports", "render", OTHER_PART]
    assert budget.note == "2 rungs" and budget.line.endswith("; 2 rungs")


def test_start_is_the_process_age_where_it_can_be_read() -> None:
    age = process_age_s()
    start = TimeLedger().budget().parts[0]
    if age is None:  # no /proc: counted from the toolkit's import
        assert start.seconds >= 0
    else:
        assert age > 0 and start.seconds >= 0


def test_the_line_shows_parts_that_add_up_to_its_total() -> None:
    _check_adds_up(BUDGET)
    assert BUDGET.line == "took 38 s: start 3, build 1, passes 24, profiled pass 2, reports 7, other 1"
    short = TimeBudget(total_s=2.0, parts=(TimePart("start", 1.46), TimePart("build", 0.54), TimePart("other", 0.0)))
    assert short.line == "took 2.0 s: start 1.5, build 0.5"  # tenths under 10 s; a part of nothing left out
    assert TimeBudget(total_s=0.0).line == "took 0.0 s"


def test_metrics_keep_the_budget_and_older_metrics_load_and_render_without_one(tmp_path: Path) -> None:
    older = load_stage1_metrics(FIXTURES / "metrics" / "cpu_tiny_stage1.json")
    assert older.time_budget is None
    assert "Time budget" not in report_md(older, None, [])
    kept = attrs.evolve(older, time_budget=BUDGET)
    path = tmp_path / "metrics.json"
    path.write_text(dumps(kept))
    assert load_file(path, Stage1Metrics).time_budget == BUDGET
    assert f"Time budget: {BUDGET.line}" in report_md(kept, None, [])


def test_stage2_and_whatif_records_without_a_budget_load_and_render() -> None:
    stage2 = load_stage2_metrics(EXAMPLES / "stage2-h100-tiny" / "metrics.json")
    assert stage2.time_budget is None and "Time budget" not in stage2_report_md(stage2, [])
    assert f"Time budget: {BUDGET.line}" in stage2_report_md(attrs.evolve(stage2, time_budget=BUDGET), [])
    whatif = load_whatif(EXAMPLES / "whatif-h100-decode")
    assert whatif.time_budget is None and "Time budget" not in whatif_md(whatif)
    assert f"Time budget: {BUDGET.line}" in whatif_md(attrs.evolve(whatif, time_budget=BUDGET))


def test_a_stage2_rebuild_keeps_the_recorded_budget(tmp_path: Path) -> None:
    from llm_perf_opt.pipeline.stage2 import _recorded_budget

    assert _recorded_budget(tmp_path) is None  # no metrics.json
    (tmp_path / "metrics.json").write_text((EXAMPLES / "stage2-h100-tiny" / "metrics.json").read_text())
    assert _recorded_budget(tmp_path) is None  # an older one, without a budget
    stage2 = load_stage2_metrics(tmp_path / "metrics.json")
    (tmp_path / "metrics.json").write_text(dumps(attrs.evolve(stage2, time_budget=BUDGET)))
    assert _recorded_budget(tmp_path) == BUDGET

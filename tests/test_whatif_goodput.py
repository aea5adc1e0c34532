"""Goodput in the what-if (`measure.whatif_objectives.goodput`, `report.whatif_goodput`): the most pages/s among the
rungs whose per-page p90 latency meets `whatif.latency_target`, the frontier of pages/s against that latency, an
unreachable target said plainly, the target read from a preset or the command line, and the per-rung figures taken
from each rung's `Stage1Metrics.pages`."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, whatif_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.throughput import page_throughput
from llm_perf_opt.measure.whatif import objective, rung_figures
from llm_perf_opt.measure.whatif_objectives import best_per_goal, frontier, goodput, pareto
from llm_perf_opt.pipeline.whatif import check_whatif_settings
from llm_perf_opt.pipeline.whatif_judge import latency_target
from llm_perf_opt.records import io
from llm_perf_opt.records.folders import load_stage1, load_whatif
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    LADDER,
    MEASURED,
    SAME,
    TTFT_P90,
    Judgement,
    LatencyTarget,
    Rung,
    WhatIfRecord,
)
from llm_perf_opt.report.whatif_goodput import goodput_line, goodput_summary
from llm_perf_opt.report.whatif_plots import write_whatif_plots
from llm_perf_opt.report.whatif_report import whatif_md
from llm_perf_opt.settings_schema import check_config
from whatif_fixtures import copy_stage1_run, figures, minimal, realistic

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# (pages/s, p90 ms to first token, p90 ms to last token) of a batch ladder on one GPU.
LADDER_FIGURES = {
    "baseline": (1.0, 150.0, 1000.0),
    "static_cache": (0.95, 160.0, 1100.0),  # slower on both: off the frontier
    "batch_2": (1.8, 300.0, 1400.0),
    "batch_4": (3.0, 600.0, 2500.0),
    "batch_8": (4.5, 1200.0, 5200.0),
    "batch_16": (5.0, 2400.0, 9800.0),
}


def _rung(name: str, pages: float, ttft: float, ttlt: float, **changes: object) -> Rung:
    f = attrs.evolve(figures(20.0, kernels=None, busy=None), pages_per_s=pages, ttft_p90_ms=ttft, ttlt_p90_ms=ttlt)
    phase = BASELINE if name == "baseline" else ALONE
    rung = Rung(name, phase, () if phase == BASELINE else (name,), (), False, MEASURED, figures=f)
    return attrs.evolve(rung, **changes)


def ladder_rungs() -> list[Rung]:
    rungs = [_rung(name, *values) for name, values in LADDER_FIGURES.items()]
    rungs.append(_rung("fewer_tiles", 9.0, 50.0, 200.0, changes_workload=True))  # other work: left out
    rungs.append(_rung("experts_grouped_mm", 1.2, 140.0, 900.0, no_change="the baseline already ran grouped_mm"))
    rungs.append(_rung("ladder-1-batch_8", 4.5, 1200.0, 5200.0, phase=LADDER, reused="batch_8"))
    return rungs


def test_the_goodput_is_the_most_pages_per_s_within_the_target() -> None:
    g = goodput(ladder_rungs(), LatencyTarget(ttlt_p90_ms=5000.0))
    assert g is not None
    assert g.considered == tuple(LADDER_FIGURES)  # neither other work, nor a no-op, nor a reused rung
    assert g.frontier == ("baseline", "batch_2", "batch_4", "batch_8", "batch_16")  # lowest latency first
    assert g.met == ("batch_4", "batch_2", "baseline", "static_cache") and g.best == "batch_4"
    assert g.nearest is None


def test_both_latencies_must_be_met_and_the_frontier_follows_the_target() -> None:
    g = goodput(ladder_rungs(), LatencyTarget(ttlt_p90_ms=6000.0, ttft_p90_ms=500.0))
    assert g is not None and g.best == "batch_2"  # batch_8 meets the last token, not the first
    first = goodput(ladder_rungs(), LatencyTarget(ttft_p90_ms=1300.0))
    assert first is not None and first.figure == TTFT_P90 and first.best == "batch_8"


def test_an_unreachable_target_is_said_plainly_with_the_best_measured() -> None:
    record = _record(ladder_rungs(), LatencyTarget(ttlt_p90_ms=800.0))
    assert record.goodput is not None and record.goodput.best is None and record.goodput.nearest == "baseline"
    assert goodput_line(record) == (
        "No rung met p90 time to last token per page ≤ 800 ms; the lowest was 1,000 ms at baseline."
    )
    assert goodput_summary(record) == "no rung met p90 time to last token per page ≤ 800 ms (nearest: baseline)"
    both = _record(ladder_rungs(), LatencyTarget(ttlt_p90_ms=800.0, ttft_p90_ms=100.0))
    assert goodput_line(both) == (
        "No rung met p90 time to last token per page ≤ 800 ms and p90 time to first token per page ≤ 100 ms; the "
        "nearest was baseline (p90 last token 1,000 ms, first token 150 ms)."
    )


def test_the_frontier_keeps_only_undominated_points() -> None:
    points = {"a": (100.0, 1.0), "b": (100.0, 2.0), "c": (50.0, 0.5), "d": (200.0, 2.0), "e": (300.0, 3.0)}
    assert pareto(points) == ("c", "b", "e")  # a: b as fast with more; d: b as many sooner


def with_goals(record: WhatIfRecord) -> WhatIfRecord:
    """The record with the best rung per goal, the frontier and the goodput of its rungs (as the analysis gives)."""
    rungs = record.rungs
    return attrs.evolve(
        record,
        best_per_goal=best_per_goal(rungs, record.decode_tokens),
        frontier=frontier(rungs),
        goodput=goodput(rungs, record.latency_target),
    )


def _record(rungs: list[Rung], target: LatencyTarget | None) -> WhatIfRecord:
    return with_goals(attrs.evolve(minimal(), rungs=tuple(rungs), levers=(), verdicts=(), latency_target=target))


def test_the_report_and_the_plot(tmp_path: Path) -> None:
    record = _record(ladder_rungs(), LatencyTarget(ttlt_p90_ms=5000.0))
    plots = {name: str(path.relative_to(tmp_path)) for name, path in write_whatif_plots(record, tmp_path).items()}
    assert (tmp_path / plots["pages_latency"]).stat().st_size > 0
    text = whatif_md(record, plots)
    assert "### Pages/s against per-page latency" in text
    assert (
        "Goodput at p90 time to last token per page ≤ 5,000 ms: **batch_4**, 3.00 pages/s (p90 last token 2,500 ms); "
        "4 of 6 rungs meet the target (batch_4, batch_2, baseline, static_cache)."
    ) in text
    assert "lowest latency first: baseline 1.00 pages/s at 1,000 ms; batch_2 1.80 pages/s at 1,400 ms" in text
    assert "plots/pages_latency.png" in text
    no_target = _record(ladder_rungs(), None)
    assert no_target.goodput is not None and no_target.goodput.best is None
    assert goodput_line(no_target) is None and "set whatif.latency_target.ttlt_p90_ms" in whatif_md(no_target)


def test_records_written_before_goodput_load_and_render_without_it(tmp_path: Path) -> None:
    old = load_whatif(EXAMPLES / "whatif-h100-all")
    assert old.goodput is None and old.latency_target is None
    assert all(r.figures is None or r.figures.ttlt_p90_ms is None for r in old.rungs)
    assert with_goals(old).goodput is None  # no per-page latencies recorded: no frontier
    assert "Pages/s against per-page latency" not in whatif_md(old)
    assert "pages_latency" not in write_whatif_plots(realistic(), tmp_path)
    record = _record(ladder_rungs(), LatencyTarget(ttlt_p90_ms=5000.0))
    io.save(record, tmp_path / "whatif.json")
    assert load_whatif(tmp_path).goodput == record.goodput


PRESET = """defaults:
  - batch
  - _self_
name: goodput_test
objective: throughput
latency_target:
  ttlt_p90_ms: 5000
"""


def test_the_target_comes_from_the_preset_or_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "whatif").mkdir()
    (tmp_path / "whatif" / "goodput_test.yaml").write_text(PRESET)
    search = f"hydra.searchpath=[file://{tmp_path}]"
    assert latency_target(compose_config("whatif").whatif.latency_target) is None  # none by default
    preset = compose_config("whatif", search, "whatif=goodput_test")
    assert latency_target(preset.whatif.latency_target) == LatencyTarget(ttlt_p90_ms=5000.0)
    given = compose_config(
        "whatif", search, "whatif=goodput_test", "whatif.latency_target.ttlt_p90_ms=null",
        "whatif.latency_target.ttft_p90_ms=800",
    )  # fmt: skip
    assert latency_target(given.whatif.latency_target) == LatencyTarget(ttft_p90_ms=800.0)
    check_whatif_settings(command_config(given), whatif_nodes(given))


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"ttlt_p90_ms": -5}, "whatif.latency_target.ttlt_p90_ms=-5 is not a positive number of ms"),
        ({"ttft_p90_ms": "soon"}, "whatif.latency_target.ttft_p90_ms=soon is not a positive number of ms"),
        ({"p99_ms": 5}, "whatif.latency_target has p99_ms, which is not one of its latencies"),
        (5000, "whatif.latency_target=5000 is not a mapping"),
    ],
)
def test_a_bad_target_is_one_paragraph(raw: object, says: str) -> None:
    with pytest.raises(UserError, match=r"whatif\.latency_target\.ttlt_p90_ms=5000") as refused:
        latency_target(raw)
    assert says in str(refused.value)


def test_the_settings_check_refuses_a_bad_target_before_anything_starts() -> None:
    with pytest.raises(UserError, match=r"whatif.latency_target.ttlt_p90_ms=0(\.0)? is out of range"):
        check_config(compose_config("whatif", "whatif.latency_target.ttlt_p90_ms=0"))


def test_a_rungs_figures_are_its_stage1_pages(tmp_path: Path) -> None:
    """Over the fixture rung (as a run of today writes it, with `Stage1Metrics.pages`): the pages/s objective's values
    and the per-page latencies are that record's, one figure per quantity."""
    folder = load_stage1(copy_stage1_run(tmp_path / "rung"))
    pages = page_throughput(folder.metrics.forwards, folder.metrics.efficiency)
    assert pages is not None
    folder = attrs.evolve(folder, metrics=attrs.evolve(folder.metrics, pages=pages))
    measured = rung_figures(folder, objective("throughput"))
    assert measured.objective == pages.pages_per_s
    assert measured.pages_per_s == pages.pages_per_s.p50
    assert (measured.ttft_p90_ms, measured.ttlt_p90_ms) == (pages.ttft_ms.p90, pages.ttlt_ms.p90)


def test_the_goodput_says_when_its_pages_per_s_is_within_the_baselines_noise() -> None:
    same = Judgement("pages_per_s", "pages/s", "pages/s", 1.0, 3.0, SAME)
    rungs = [attrs.evolve(r, judgements=(same,)) if r.name == "batch_4" else r for r in ladder_rungs()]
    line = goodput_line(_record(rungs, LatencyTarget(ttlt_p90_ms=5000.0)))
    assert line is not None and "(p90 last token 2,500 ms; pages/s against the baseline's: within noise)" in line

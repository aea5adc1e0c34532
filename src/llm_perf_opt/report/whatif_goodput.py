"""The goodput lines of `whatif.md`: the most pages/s among the rungs that meet the latency target (or, plainly, that
none did and the nearest), and the frontier of pages/s against per-page latency, from `WhatIfRecord.goodput`."""

from __future__ import annotations

from llm_perf_opt.records.whatif import (
    BETTER,
    LATENCY_FIGURES,
    TTFT_P90,
    TTLT_P90,
    Goodput,
    LatencyTarget,
    WhatIfRecord,
)
from llm_perf_opt.report.markdown import Doc, ms

SHORT = {TTLT_P90: "last token", TTFT_P90: "first token"}
PAGES_PER_S = "pages_per_s"  # the judged figure (`Judgement.objective`)


def target_text(target: LatencyTarget) -> str:
    """`p90 time to last token per page ≤ 5,000 ms` (and the first token's, where set)."""
    return " and ".join(f"{LATENCY_FIGURES[figure]} ≤ {ms(limit, 0)} ms" for figure, limit in target.limits.items())


def _latency(record: WhatIfRecord, name: str, figure: str) -> float | None:
    rung = record.rung(name)
    return None if rung is None or rung.figures is None else rung.figures.latency_ms(figure)


def _latencies(record: WhatIfRecord, name: str, figures: tuple[str, ...]) -> str:
    """`last token 4,120 ms, first token 900 ms` for a rung."""
    return ", ".join(f"{SHORT[x]} {ms(_latency(record, name, x), 0)} ms" for x in figures)


def _pages(record: WhatIfRecord, name: str) -> str:
    rung = record.rung(name)
    value = None if rung is None or rung.figures is None else rung.figures.pages_per_s
    return f"{ms(value, 2)} pages/s"


def _against_baseline(record: WhatIfRecord, name: str) -> str:
    """`; pages/s against the baseline's: within noise` where a rung's pages/s is not better beyond noise."""
    rung = record.rung(name)
    judged = None if rung is None else rung.judgement(PAGES_PER_S)
    if judged is None or judged.verdict == BETTER:
        return ""
    return f"; pages/s against the baseline's: {judged.verdict}"


def goodput_line(record: WhatIfRecord) -> str | None:
    """The goodput against the record's latency target in one sentence; None without a target."""
    g = record.goodput
    if g is None or g.target is None or not g.target.limits:
        return None
    target = g.target
    figures = tuple(target.limits)
    if g.best is not None:
        verb = "meets" if len(g.met) == 1 else "meet"
        others = f" ({', '.join(g.met)})" if len(g.met) > 1 else ""
        return (
            f"Goodput at {target_text(target)}: **{g.best}**, {_pages(record, g.best)} (p90 "
            f"{_latencies(record, g.best, figures)}{_against_baseline(record, g.best)}); {len(g.met)} of "
            f"{len(g.considered)} rungs {verb} the target{others}."
        )
    if g.nearest is None:
        return f"No rung met {target_text(target)}: no rung measured that latency."
    if len(figures) == 1:
        value = _latency(record, g.nearest, figures[0])
        return f"No rung met {target_text(target)}; the lowest was {ms(value, 0)} ms at {g.nearest}."
    nearest = _latencies(record, g.nearest, figures)
    return f"No rung met {target_text(target)}; the nearest was {g.nearest} (p90 {nearest})."


def goodput_summary(record: WhatIfRecord) -> str | None:
    """The goodput for a command's closing lines: `batch_4, 3.21 pages/s`, or that no rung met the target."""
    g = record.goodput
    if g is None or g.target is None:
        return None
    if g.best is not None:
        return f"{g.best}, {_pages(record, g.best)} within {target_text(g.target)}"
    nearest = "" if g.nearest is None else f" (nearest: {g.nearest})"
    return f"no rung met {target_text(g.target)}{nearest}"


def frontier_line(record: WhatIfRecord, g: Goodput) -> str:
    """The rungs on the pages/s–latency frontier, lowest latency first, each with both figures."""
    points = "; ".join(
        f"{name} {_pages(record, name)} at {ms(_latency(record, name, g.figure), 0)} ms" for name in g.frontier
    )
    return (
        f"Frontier of pages/s against {LATENCY_FIGURES[g.figure]} (no other rung has more pages/s at a latency as low "
        f"or lower), lowest latency first: {points}."
    )


def goodput_section(doc: Doc, record: WhatIfRecord, plot: str | None) -> None:
    """Goodput and the pages/s–latency frontier (records written before them: nothing)."""
    g = record.goodput
    if g is None:
        return
    doc.h3("Pages/s against per-page latency")
    doc.bullets([line for line in (goodput_line(record), frontier_line(record, g)) if line])
    doc.para(
        "Per-page latency: p90 over a rung's timed passes at the measured decode length, every page of a batch pass "
        "given its pass's times (first token: preprocessing and prefill; last token: the pass end to end); pages/s: "
        "p50 over the same passes. Rungs that change the workload, or ran as the baseline did, are left out"
        + ("" if g.target is not None else "; set whatif.latency_target.ttlt_p90_ms (ms) for the goodput")
        + "."
    )
    if plot:
        doc.image(f"Pages/s against {LATENCY_FIGURES[g.figure]}, the frontier joined", plot)

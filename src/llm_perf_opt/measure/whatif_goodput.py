"""Goodput of a what-if run: pages/s against per-page latency over its rungs. The frontier is the rungs no other
rung beats on both (more pages/s at a latency as low or lower); with a latency target (`whatif.latency_target`), the
goodput rung is the one with the most pages/s among those whose per-page p90 latency meets it.

Each rung's figures are its `RungFigures`: pages/s (p50 over the timed passes, `Stage1Metrics.pages`' series) and the
p90 time to first and last token per page (every page of a batch pass gets its pass's times).
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_perf_opt.records.whatif import MEASURED, Goodput, LatencyTarget, Rung, RungFigures

Point = tuple[float, float]  # (latency ms, pages/s)


def _eligible(rung: Rung) -> RungFigures | None:
    """A rung's figures when it counts: measured on its own (not a reused ladder rung), on the baseline's workload,
    and not a rung that ran as the baseline did (its figures are the baseline's, with noise)."""
    if rung.state != MEASURED or rung.reused is not None or rung.changes_workload or rung.no_change is not None:
        return None
    return rung.figures


def _point(figures: RungFigures, figure: str) -> Point | None:
    latency = figures.latency_ms(figure)
    if latency is None or figures.pages_per_s is None:
        return None
    return latency, figures.pages_per_s


def pareto(points: dict[str, Point]) -> tuple[str, ...]:
    """The names whose point no other dominates (latency as low or lower and pages/s as high or higher, one of them
    strictly), lowest latency first."""

    def dominated(p: Point) -> bool:
        return any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points.values())

    kept = [name for name, p in points.items() if not dominated(p)]
    return tuple(sorted(kept, key=lambda name: (points[name][0], -points[name][1])))


def meets(figures: RungFigures, target: LatencyTarget) -> bool:
    """Every latency the target sets is measured and within its limit."""
    return all(
        (value := figures.latency_ms(figure)) is not None and value <= limit for figure, limit in target.limits.items()
    )


def _distance(figures: RungFigures, target: LatencyTarget) -> float | None:
    """How far a rung is from the target: the largest ratio of a latency to its limit (≤ 1: it meets it)."""
    ratios = [
        value / limit
        for figure, limit in target.limits.items()
        if (value := figures.latency_ms(figure)) is not None and limit > 0
    ]
    return max(ratios) if len(ratios) == len(target.limits) and ratios else None


def goodput(rungs: Sequence[Rung], target: LatencyTarget | None) -> Goodput | None:
    """The pages/s–latency frontier of `rungs` and, with `target`, the goodput rung (or the nearest one when none
    meets it); None when no rung has both figures (records written before per-page latencies)."""
    figure = (target or LatencyTarget()).figure
    eligible = {rung.name: f for rung in rungs if (f := _eligible(rung)) is not None}
    points = {name: p for name, f in eligible.items() if (p := _point(f, figure)) is not None}
    if not points:
        return None
    considered = tuple(points)
    frontier = pareto(points)
    if target is None or not target.limits:
        return Goodput(figure=figure, considered=considered, frontier=frontier)
    judged = {name: eligible[name] for name in considered}
    met = sorted(
        (name for name, f in judged.items() if meets(f, target)), key=lambda name: -(judged[name].pages_per_s or 0.0)
    )
    distances = {name: d for name, f in judged.items() if (d := _distance(f, target)) is not None}
    nearest = None if met or not distances else min(distances, key=lambda name: distances[name])
    return Goodput(
        figure=figure,
        considered=considered,
        frontier=frontier,
        target=target,
        met=tuple(met),
        best=met[0] if met else None,
        nearest=nearest,
    )

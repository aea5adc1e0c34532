"""Every objective of a what-if rung judged against the baseline (`FIGURES`), the trade-offs those verdicts reveal,
the best rung per goal, the trade-off (Pareto) frontier, and goodput: the most pages/s among the rungs whose per-page
p90 latency meets `whatif.latency_target`, beside the pages/s–latency frontier.

Timed figures are judged on their passes with the noise rule every reader uses (`measure.noise`: 95% intervals
apart); figures with one value per rung (peak memory, compile time, energy) against a named threshold.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import attrs

from llm_perf_opt.measure.noise import BEYOND, WITHIN, noise_verdict
from llm_perf_opt.measure.outputs import near_tie_text
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI, summarize
from llm_perf_opt.measure.thresholds import (
    COMPILE_NOTICE_S,
    ENERGY_TOLERANCE,
    FIRST_PASS_FLOOR,
    FIRST_PASS_TOLERANCE,
    MEMORY_TOLERANCE,
    first_pass_floor_ms,
    same_setup_cost,
)
from llm_perf_opt.measure.whatif import (
    GIB,
    GOAL_FIGURES,
    PAGE_LATENCY_MS,
    PEAK_MEMORY_GIB,
    HostDrift,
    comparable,
    least_gain,
    page_values,
    pages_per_pass,
    pass_values,
)
from llm_perf_opt.measure.whatif import ratio_interval_95 as _ratio_interval
from llm_perf_opt.records.memory import EnergyReport, MemoryReport
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.whatif import (
    BASELINE,
    BETTER,
    FIRST_TOKEN,
    MEASURED,
    MEMORY,
    NOT_JUDGED,
    PAGE_LATENCY,
    SAME,
    THROUGHPUT,
    WORSE,
    GoalChoice,
    Goodput,
    Judgement,
    LatencyTarget,
    Objective,
    OutputAgreement,
    Rung,
    RungFigures,
    Speedup,
)

# A peak memory above this multiple of the baseline's is flagged, whatever the budget.
FAR_ABOVE_BASELINE = 1.5
# Gains quoted in a trade-off flag (the largest first); every loss is quoted.
GAINS_QUOTED = 2
# A gain left unquoted when another says it: pages/s when whole-page latency gained too (at the same pages per
# pass: a page's latency then sets the pages/s).
SAID_BY = {"pages_per_s": PAGE_LATENCY_MS}


PASS_FIGURES = (
    Objective(PAGE_LATENCY_MS, "whole-page latency", "ms", higher_is_better=False),
    Objective("ttft_ms", "time to first token", "ms", higher_is_better=False),
    Objective("vision_ms", "vision", "ms", higher_is_better=False),
    Objective("prefill_ms", "prefill", "ms", higher_is_better=False),
    Objective("decode_ms_per_token", "decode", "ms/token", higher_is_better=False),
    Objective("pages_per_s", "pages/s", "pages/s", higher_is_better=True),
)
PEAK_MEMORY = Objective(PEAK_MEMORY_GIB, "peak memory", "GiB", higher_is_better=False)
COMPILE = Objective("compile_s", "warm-up/compile", "s", higher_is_better=False)
# What an input of shapes not met before waits for beyond a timed pass: the most an input's first pass took beyond
# its timed median (compilation, CUDA-graph capture, cuDNN's per-length plans), `Stage1Metrics.first_pass_extra_ms`.
FIRST_PASS = Objective("first_pass_extra_ms", "first-pass extra", "ms", higher_is_better=False)
MEMORY_PASS = Objective("memory_pass_peak_gib", "memory-pass peak", "GiB", higher_is_better=False)
ENERGY = Objective("joules_per_decode_token", "energy per decode token", "J/token", higher_is_better=False)
OUTPUTS = Objective("outputs", "outputs", "", higher_is_better=False)
FIGURES = (*PASS_FIGURES, PEAK_MEMORY, COMPILE, FIRST_PASS, MEMORY_PASS, ENERGY, OUTPUTS)
# Figures whose change is said in their unit, not in percent (a setup cost: the baseline's may be nil)
ABSOLUTE_CHANGE = frozenset({COMPILE.name, FIRST_PASS.name})
# The pass times that are parts of a pass's work, not of a page's wait: where the rung's passes hold other numbers of
# pages than the baseline's (a batch against one page), each is judged per page (the pass's time over its pages; a
# decode step's per page-token). A page's own latencies (first token, whole page) and pages/s are judged as they are.
PER_PAGE = {"vision_ms": "page", "prefill_ms": "page", "decode_ms_per_token": "page-token"}

GOAL_LABELS = {
    PAGE_LATENCY: "whole-page latency",
    FIRST_TOKEN: "first token",
    THROUGHPUT: "throughput (pages/s)",
    MEMORY: "peak GPU memory",
}


# --------------------------------------------------------------------------------------------- verdicts


def _improved(figure: Objective, base: float, value: float) -> bool:
    return value > base if figure.higher_is_better else value < base


def _change(base: float | None, value: float | None) -> float | None:
    return None if base is None or value is None or base <= 0 else value / base - 1


def _not_judged(figure: Objective, base: float | None, value: float | None, why: str) -> Judgement:
    return Judgement(figure.name, figure.label, figure.unit, base, value, NOT_JUDGED, _change(base, value), why=why)


def judge_passes(
    figure: Objective, base: Sequence[float], other: Sequence[float], note: str | None = None
) -> Judgement:
    """A timed figure on its passes: better or worse when the two 95% intervals are apart, within noise when they
    overlap, not judged below 3 passes a side or when one side did not measure it."""
    b, v = (statistics.median(base) if base else None), (statistics.median(other) if other else None)
    if b is None or v is None:
        return _not_judged(figure, b, v, f"not measured by {'the baseline' if b is None else 'this rung'}")
    verdict = noise_verdict(summarize(other, figure.unit), summarize(base, figure.unit))
    if verdict not in (BEYOND, WITHIN):
        why = f"{len(base)} vs {len(other)} timed passes; an interval needs ≥ {MIN_VALUES_FOR_CI} per side"
        return _not_judged(figure, b, v, why)
    judged = SAME if verdict == WITHIN else BETTER if _improved(figure, b, v) else WORSE
    low, high = _ratio_interval(base, other) or (None, None)
    return Judgement(figure.name, figure.label, figure.unit, b, v, judged, _change(b, v), low, high, note)


def judge_value(
    figure: Objective, base: float | None, value: float | None, *, same: Callable[[float, float], bool], how: str
) -> Judgement:
    """A figure with one value per rung: the same when `same(base, value)`, else better or worse; `how` says the
    threshold that stands in for noise."""
    if base is None or value is None:
        return _not_judged(figure, base, value, f"not measured by {'the baseline' if base is None else 'this rung'}")
    verdict = SAME if same(base, value) else BETTER if _improved(figure, base, value) else WORSE
    return Judgement(figure.name, figure.label, figure.unit, base, value, verdict, _change(base, value), why=how)


def _relative(tolerance: float) -> Callable[[float, float], bool]:
    return lambda base, value: abs(value - base) <= tolerance * max(abs(base), 1e-12)


def _absolute(tolerance: float) -> Callable[[float, float], bool]:
    return lambda base, value: abs(value - base) <= tolerance


def _peak_gib(metrics: Stage1Metrics) -> float | None:
    peaks = [f.peak_memory_bytes for f in metrics.forwards if f.peak_memory_bytes is not None]
    return max(peaks) / GIB if peaks else None


def _compile_s(metrics: Stage1Metrics) -> float:
    return 0.0 if metrics.compile is None else metrics.compile.compile_ms / 1e3


def _memory_pass(report: MemoryReport | None) -> tuple[float | None, str]:
    """The memory pass's largest stage peak (GiB) and its parts, or None and why there is none."""
    if report is None:
        return None, "the run recorded no memory pass"
    if not report.available or not report.breakdown:
        return None, f"memory pass not available: {report.reason or 'no breakdown'}"
    top = max(report.breakdown, key=lambda b: b.peak_allocated_bytes)
    parts = (
        f"{top.stage}: weights {top.weights_bytes / GIB:.2f}, KV cache {top.kv_cache_bytes / GIB:.2f}, "
        f"activations {top.activations_bytes / GIB:.2f} GiB"
    )
    return top.peak_allocated_bytes / GIB, parts


def _first_pass(metrics: Stage1Metrics) -> tuple[float | None, str]:
    """The first-pass extra (ms), or None and why there is none."""
    if (extra := metrics.first_pass_extra_ms) is None:
        why = (
            "no warm-up pass (run.warmup=0)"
            if metrics.settings.warmup == 0
            else "written before they were kept, or run in a process an earlier job had warmed"
        )
        return None, f"the run kept no first pass: {why}"
    return extra, ""


def _first_pass_same(base: Stage1Metrics) -> Callable[[float, float], bool]:
    """Within `FIRST_PASS_TOLERANCE` of the baseline's extra, or within `FIRST_PASS_FLOOR` of its timed pass."""
    floor = first_pass_floor_ms(base)
    return lambda b, value: same_setup_cost(b, value, FIRST_PASS_TOLERANCE, floor)


def _energy(report: EnergyReport | None) -> tuple[float | None, str]:
    if report is None:
        return None, "the run recorded no energy pass"
    if not report.available or report.joules_per_decode_token is None:
        return None, f"energy not available: {report.reason or 'no decode tokens measured'}"
    return report.joules_per_decode_token, ""


def _optional(
    figure: Objective,
    base: tuple[float | None, str],
    own: tuple[float | None, str],
    same: Callable[[float, float], bool],
    how: str,
) -> Judgement:
    """A memory-pass, energy or first-pass figure: the same where `same(base, value)`; not judged (with the first
    reason) where either run lacks it."""
    if base[0] is None or own[0] is None:
        why = f"baseline: {base[1]}" if base[0] is None else f"this rung: {own[1]}"
        return _not_judged(figure, base[0], own[0], why)
    detail = f"; baseline {base[1]} → this rung {own[1]}" if base[1] and own[1] else ""
    return judge_value(figure, base[0], own[0], same=same, how=how + detail)


def judge_outputs(outputs: OutputAgreement | None, repeats_until: int | None = None) -> Judgement:
    """Outputs against the baseline's: identical is the same, a departing token is worse (unless at or after
    `repeats_until`, the token from which the baseline's own outputs do not repeat run to run: the same), none
    compared: not judged."""
    if outputs is None:
        return _not_judged(OUTPUTS, None, None, "outputs were not compared with the baseline")
    departs, same = outputs.first_departure, outputs.within_tolerance
    if outputs.identical:
        why = f"identical for {outputs.compared_tokens} tokens"
    else:
        why = f"depart at token {departs} of {outputs.compared_tokens}"
        if outputs.near_tie is not None:
            why += f" at {near_tie_text(outputs.near_tie)}"
        if not same and repeats_until is not None and departs is not None and departs >= repeats_until:
            why += f", where the baseline's own outputs no longer repeat (from token {repeats_until})"
            same = True
    return Judgement(OUTPUTS.name, OUTPUTS.label, "", None, None, SAME if same else WORSE, why=why)


def _pages_text(pages: Sequence[int]) -> str:
    """The pages a run's passes hold: "1 page", "64 pages", "2–4 pages"."""
    if len(pages) == 1:
        return f"{pages[0]} page{'s' if pages[0] != 1 else ''}"
    return f"{pages[0]}–{pages[-1]} pages"


def judge_per_page(
    figure: Objective, base: Stage1Metrics, rung: Stage1Metrics, decode_tokens: int | None = None
) -> Judgement:
    """A pass-time figure (`PER_PAGE`) judged per page: each pass's value over the pages it holds, labelled so
    ("vision per page", "decode per page-token")."""
    per = PER_PAGE[figure.name]
    what = (
        "each decode step's time over the pages it decodes a token for"
        if per == "page-token"
        else f"each pass's {figure.label} time over the pages it holds"
    )
    pages = (
        f"{_pages_text(pages_per_pass(rung))} a pass in this rung, {_pages_text(pages_per_pass(base))} in the baseline"
    )
    why = f"{what} ({pages})"
    labelled = attrs.evolve(figure, label=f"{figure.label} per {per}")
    b, v = page_values(base, figure.name, decode_tokens), page_values(rung, figure.name, decode_tokens)
    judged = judge_passes(labelled, b, v, why)
    return attrs.evolve(judged, per=per, why=why if judged.verdict != NOT_JUDGED else judged.why)


def judge(
    base: Stage1Metrics, rung: Stage1Metrics, outputs: OutputAgreement | None, decode_tokens: int | None
) -> tuple[Judgement, ...]:
    """Every objective of `rung` against `base` (whole-page latency at `decode_tokens`, or each pass's own); the pass
    times per page where the two runs' passes hold other numbers of pages (`PER_PAGE`)."""
    out = []
    per_page = pages_per_pass(base) != pages_per_pass(rung)
    for figure in PASS_FIGURES:
        if per_page and figure.name in PER_PAGE:
            out.append(judge_per_page(figure, base, rung, decode_tokens))
            continue
        note = _extrapolation(rung, decode_tokens) if figure.name == PAGE_LATENCY_MS else None
        b, v = pass_values(base, figure.name, decode_tokens), pass_values(rung, figure.name, decode_tokens)
        out.append(judge_passes(figure, b, v, note))
    memory_how = f"one peak per rung; within {MEMORY_TOLERANCE:.0%} of the baseline's counts as the same"
    compile_how = f"one value per rung; within {COMPILE_NOTICE_S:g} s of the baseline's counts as the same"
    energy_how = f"one NVML energy pass per rung; within {ENERGY_TOLERANCE:.0%} counts as the same"
    first_how = (
        "the most an input's first pass (outside every timed figure) took beyond its timed median; within "
        f"{FIRST_PASS_TOLERANCE:.0%} of the baseline's, or {FIRST_PASS_FLOOR:.0%} of its timed pass, counts as the same"
    )
    return (
        *out,
        judge_value(PEAK_MEMORY, _peak_gib(base), _peak_gib(rung), same=_relative(MEMORY_TOLERANCE), how=memory_how),
        judge_value(COMPILE, _compile_s(base), _compile_s(rung), same=_absolute(COMPILE_NOTICE_S), how=compile_how),
        _optional(FIRST_PASS, _first_pass(base), _first_pass(rung), _first_pass_same(base), first_how),
        _optional(
            MEMORY_PASS, _memory_pass(base.memory), _memory_pass(rung.memory), _relative(MEMORY_TOLERANCE), memory_how
        ),
        _optional(ENERGY, _energy(base.energy), _energy(rung.energy), _relative(ENERGY_TOLERANCE), energy_how),
        judge_outputs(outputs),
    )


def _extrapolation(metrics: Stage1Metrics, decode_tokens: int | None) -> str:
    measured = metrics.settings.max_new_tokens
    if decode_tokens is None or decode_tokens == measured:
        return f"TTFT + (N − 1) × decode ms/token per pass at the measured N = {measured} tokens"
    return (
        f"TTFT + (N − 1) × decode ms/token per pass at the workload's N = {decode_tokens} tokens, extrapolated from "
        f"{measured} measured (decode step time taken as constant over the context)"
    )


# --------------------------------------------------------------------------------------------- trade-offs


def change_text(j: Judgement) -> str:
    """One judged change in plain words: "decode −91%", "warm-up/compile +45.4 s", "outputs depart at token 18 …"."""
    if j.objective == OUTPUTS.name:
        return f"outputs {j.why}" if j.why else "outputs"
    if j.change is None or j.objective in ABSOLUTE_CHANGE:
        if j.base is None or j.value is None:
            return j.label
        return f"{j.label} {signed_amount(j.value - j.base)} {j.unit}"
    sign = "+" if j.change >= 0 else "−"
    return f"{j.label} {sign}{abs(j.change):.{percent_digits(j.change)}%}"


def signed_amount(delta: float) -> str:
    """A change in a figure's own unit to one decimal, signed as it reads (no sign where it rounds to 0.0)."""
    shown = f"{abs(delta):,.1f}"
    return shown if shown == "0.0" else ("+" if delta > 0 else "−") + shown


def percent_digits(change: float) -> int:
    """The decimals a change in percent is shown with: none, or as many as keep a near-total saving from reading
    −100% (−99.8%), up to 3."""
    digits = 0
    while digits < 3 and -1 < change < 0 and f"{-change:.{digits}%}" == f"{1:.{digits}%}":
        digits += 1
    return digits


def changes_text(judgements: Sequence[Judgement]) -> str:
    """Judged changes in plain words, joined: "vision −64% and prefill −43%"."""
    items = [change_text(j) for j in judgements]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def tradeoffs(
    judgements: Sequence[Judgement], budget_gib: float | None, peak_gib: float | None = None
) -> tuple[str, ...]:
    """Plain-words flags: a gain beyond noise on one objective with a loss on another ("decode −91%, but time to
    first token +130% and prefill +56%"), a peak over the budget, a peak far above the baseline's."""
    flags = []
    # at other pages per pass (a figure judged per page) a page's latency no longer sets the pages/s: both are said
    said_by = {} if any(j.per is not None for j in judgements) else SAID_BY
    better = {j.objective for j in judgements if j.verdict == BETTER}
    gains = sorted(
        (j for j in judgements if j.verdict == BETTER and said_by.get(j.objective) not in better),
        # the figures said in percent first, by size; a setup cost said in its unit (its percent of a near-nil
        # baseline means little) after them
        key=lambda j: (j.objective in ABSOLUTE_CHANGE, -abs(j.change or 0.0)),
    )
    losses = [j for j in judgements if j.verdict == WORSE]
    if gains and losses:
        flags.append(f"{changes_text(gains[:GAINS_QUOTED])}, but {changes_text(losses)}")
    memory = next((j for j in judgements if j.objective == PEAK_MEMORY.name), None)
    peak = peak_gib if peak_gib is not None else None if memory is None else memory.value
    if budget_gib is not None and peak is not None and peak > budget_gib:
        flags.append(f"peak memory {peak:.1f} GiB is over the {budget_gib:g} GiB budget (whatif.memory_budget_gib)")
    base = None if memory is None else memory.base
    if peak is not None and base and peak > FAR_ABOVE_BASELINE * base:
        flags.append(
            f"peak memory {peak:.1f} GiB is {peak / base:.1f}× the baseline's {base:.1f} GiB "
            f"(flagged above {FAR_ABOVE_BASELINE:g}×)"
        )
    return tuple(flags)


# --------------------------------------------------------------------------------------------- goals


def _candidates(rungs: Sequence[Rung]) -> list[Rung]:
    """Rungs a goal may name: judged and `comparable`."""
    return [r for r in rungs if comparable(r) and r.phase != BASELINE and r.judgements]


def goal_label(goal: str, decode_tokens: int | None) -> str:
    if goal == PAGE_LATENCY and decode_tokens is not None:
        return f"whole-page latency at {decode_tokens} decode tokens"
    return GOAL_LABELS[goal]


def best_per_goal(rungs: Sequence[Rung], decode_tokens: int | None) -> tuple[GoalChoice, ...]:
    """The best rung for each goal: the best value among the rungs better than the baseline beyond noise (or the
    threshold); the baseline when none is; none when no rung could be judged on the goal."""
    base = next((r for r in rungs if r.phase == BASELINE and r.state == MEASURED), None)
    candidates = _candidates(rungs)
    out = []
    for goal, name in GOAL_FIGURES.items():
        figure = next(f for f in FIGURES if f.name == name)
        label = goal_label(goal, decode_tokens)
        judged = [(r, j) for r in candidates if (j := r.judgement(name)) is not None and j.verdict != NOT_JUDGED]
        better = [(r, j) for r, j in judged if j.verdict == BETTER and j.value is not None]
        if better:
            pick = max if figure.higher_is_better else min
            rung, j = pick(better, key=lambda pair: pair[1].value or 0.0)
            out.append(GoalChoice(goal, label, rung.name, j.value, figure.unit, "better than the baseline"))
        elif judged and base is not None:
            out.append(GoalChoice(goal, label, base.name, judged[0][1].base, figure.unit, "no rung beat the baseline"))
        else:
            out.append(GoalChoice(goal, label, None, None, figure.unit, "no rung could be judged on it"))
    return tuple(out)


def _point(rung: Rung) -> dict[str, float]:
    """A rung's value per goal, lower is better; a figure within noise of the baseline counts as the baseline's
    (the runs cannot tell them apart), a figure not judged is left out."""
    point = {}
    for goal, name in GOAL_FIGURES.items():
        j = rung.judgement(name)
        value = None if j is None or j.verdict == NOT_JUDGED else j.base if j.verdict == SAME else j.value
        if value is not None:
            point[goal] = _lower_is_better(name, value)
    return point


def _base_point(rungs: Sequence[Rung]) -> dict[str, float]:
    point: dict[str, float] = {}
    for rung in _candidates(rungs):
        for goal, name in GOAL_FIGURES.items():
            j = rung.judgement(name)
            if j is not None and j.base is not None and goal not in point:
                point[goal] = _lower_is_better(name, j.base)
    return point


def _lower_is_better(name: str, value: float) -> float:
    """A figure's value signed so that lower is better."""
    return -value if next(f for f in FIGURES if f.name == name).higher_is_better else value


def _dominates(a: dict[str, float], b: dict[str, float]) -> bool:
    shared = set(a) & set(b)
    return bool(shared) and all(a[g] <= b[g] for g in shared) and any(a[g] < b[g] for g in shared)


def frontier(rungs: Sequence[Rung]) -> tuple[str, ...]:
    """The rungs (the baseline among them) that no other rung beats on every goal: better or as good on each of
    whole-page latency, first token, throughput and memory, and better on one."""
    base = next((r for r in rungs if r.phase == BASELINE and r.state == MEASURED), None)
    points = {r.name: _point(r) for r in _candidates(rungs)}
    if base is not None and (base_point := _base_point(rungs)):
        points = {base.name: base_point, **points}
    return tuple(
        name
        for name, point in points.items()
        if point and not any(_dominates(other, point) for o, other in points.items() if o != name)
    )


def within_drift(gain: Speedup | None, parts: Sequence[Judgement], drift: HostDrift | None) -> str | None:
    """Why a lever that helped stays off the ladder when its gain (`least_gain`) is no larger than the host's
    measured drift between processes, or None (no drift measured, or a gain beyond it)."""
    least = least_gain(gain, parts)
    if drift is None or least is None or least > drift.factor:
        return None
    what = f"its parts' gain ({changes_text(parts)})" if parts else "its gain"
    return (
        f"{what}, {least:.2f}× at least by the 95% interval, is no larger than the host's drift between processes "
        f"({drift.factor:.2f}×, measured by {drift.rung}, which ran as the baseline did)"
    )


# --------------------------------------------------------------------------------------------- goodput

Point = tuple[float, float]  # (latency ms, pages/s)


def latency_point(figures: RungFigures, figure: str) -> Point | None:
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
    eligible = {rung.name: rung.figures for rung in rungs if comparable(rung) and rung.figures is not None}
    points = {name: p for name, f in eligible.items() if (p := latency_point(f, figure)) is not None}
    if not points:
        return None
    frontier_only = Goodput(figure=figure, considered=tuple(points), frontier=pareto(points))
    if target is None or not target.limits:
        return frontier_only
    judged = {name: eligible[name] for name in points}
    met = sorted(
        (name for name, f in judged.items() if meets(f, target)), key=lambda name: -(judged[name].pages_per_s or 0.0)
    )
    distances = {name: d for name, f in judged.items() if (d := _distance(f, target)) is not None}
    nearest = None if met or not distances else min(distances, key=lambda name: distances[name])
    return attrs.evolve(frontier_only, target=target, met=tuple(met), best=met[0] if met else None, nearest=nearest)

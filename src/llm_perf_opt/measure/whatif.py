"""The figures of `perf-whatif` from typed Stage 1 records: each rung's measurements, its speed-up against a
reference rung (95% interval, noise verdict), its outputs against the baseline's, where its decode-step change came
from, and the order of the ladder. `pipeline.whatif` runs the rungs; `report.whatif_report` renders the result."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from llm_perf_opt.measure.noise import BEYOND, WITHIN, noise_verdict
from llm_perf_opt.measure.outputs import first_departure, load_prefill_logits, load_top_two, near_tie, near_tie_text
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI, summarize, t_critical_95
from llm_perf_opt.measure.throughput import pages_per_s_values, run_pages
from llm_perf_opt.override_text import override_key
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import Stage1Folder
from llm_perf_opt.records.stage1 import BatchRecord, ImageRecord, Stage1Metrics
from llm_perf_opt.records.whatif import (
    BETTER,
    FIRST_TOKEN,
    MEASURED,
    MEMORY,
    PAGE_LATENCY,
    THROUGHPUT,
    WORSE,
    Attribution,
    Judgement,
    Lever,
    Objective,
    OutputAgreement,
    Rung,
    RungFigures,
    Speedup,
    StepFloor,
)

CI_LOG_RATIO = "Welch t on log values (ratio of geometric means)"

GIB = 2**30
PAGE_LATENCY_MS = "page_latency_ms"
PEAK_MEMORY_GIB = "peak_memory_gib"

OBJECTIVES: Mapping[str, Objective] = {
    o.name: o
    for o in (
        Objective(PAGE_LATENCY_MS, "whole-page latency (p50)", "ms", higher_is_better=False),
        Objective("decode_ms_per_token", "decode ms/token (p50)", "ms", higher_is_better=False),
        Objective("ttft_ms", "time to first token (p50)", "ms", higher_is_better=False),
        Objective(
            "aggregate_decode_tokens_per_s", "aggregate decode tokens/s (p50)", "tokens/s", higher_is_better=True
        ),
        Objective("pages_per_s", "pages/s end to end (p50)", "pages/s", higher_is_better=True),
        Objective(PEAK_MEMORY_GIB, "peak GPU memory (p50 over passes)", "GiB", higher_is_better=False),
    )
}
# The goals `whatif.objective` takes by name (besides the figures above): the figure each one ranks by.
GOAL_FIGURES: Mapping[str, str] = {
    PAGE_LATENCY: PAGE_LATENCY_MS,
    FIRST_TOKEN: "ttft_ms",
    THROUGHPUT: "pages_per_s",
    MEMORY: PEAK_MEMORY_GIB,
}
DEFAULT_OBJECTIVE = PAGE_LATENCY


def objective_names() -> list[str]:
    """Every name `whatif.objective` takes: the goals, then the figures."""
    return [*GOAL_FIGURES, *OBJECTIVES]


def objective(name: str, decode_tokens: int | None = None) -> Objective:
    """The objective called `name`, a goal (`page_latency`, …) or a figure (`decode_ms_per_token`, …); whole-page
    latency is labelled with its decode length. KeyError for an unknown name (the caller turns it into a UserError)."""
    found = OBJECTIVES[GOAL_FIGURES.get(name, name)]
    if found.name != PAGE_LATENCY_MS:
        return found
    length = "the measured decode length" if decode_tokens is None else f"{decode_tokens} decode tokens"
    return attrs.evolve(found, label=f"whole-page latency at {length} (p50)")


# --------------------------------------------------------------------------------------------- per-pass values


def pass_values(metrics: Stage1Metrics, name: str, decode_tokens: int | None = None) -> list[float]:
    """One value of objective `name` per timed pass: per batch pass when the run batched inputs, else per input
    pass (decode ms/token: the pass's mean step time; aggregate tokens/s: every input's decode tokens; whole-page
    latency: TTFT + (N − 1) × the pass's mean step, N = `decode_tokens` or the pass's own new tokens; pages/s: the
    series of `Stage1Metrics.pages`, the passes at the run's batch, `measure.throughput.pages_per_s_values`)."""
    if name == "pages_per_s":
        return pages_per_s_values(metrics.forwards)
    values = (_forward_value(f, name, decode_tokens) for f in metrics.forwards)
    return [v for v in values if v is not None]


def page_values(metrics: Stage1Metrics, name: str, decode_tokens: int | None = None) -> list[float]:
    """One value of a pass-time objective `name` per timed pass, per page: the pass's value over the pages the pass
    holds (vision or prefill: the pass's time per page; decode ms/token: the step's time per page-token)."""
    values = ((_forward_value(f, name, decode_tokens), f.size) for f in metrics.forwards)
    return [v / size for v, size in values if v is not None and size > 0]


def pages_per_pass(metrics: Stage1Metrics) -> tuple[int, ...]:
    """The numbers of pages the timed passes hold, smallest first, each once (one per batch size; a batch run's last
    pass may hold fewer unless `run.fill_batches`)."""
    return tuple(sorted({f.size for f in metrics.forwards}))


def _page_latency(ttft: float, steps: Sequence[float], tokens: int) -> float | None:
    """TTFT + (tokens − 1) × the mean decode step (the first token comes from prefill)."""
    if tokens <= 1:
        return ttft
    return ttft + (tokens - 1) * statistics.fmean(steps) if steps else None


def _forward_value(forward: ImageRecord | BatchRecord, name: str, decode_tokens: int | None) -> float | None:
    """One timed forward's value of objective `name`, an input's pass or a batch's (KeyError: no such figure)."""
    steps = forward.decode_step_ms
    mean_step = statistics.fmean(steps) if steps else None
    if name == "decode_ms_per_token":
        return mean_step
    if name == "aggregate_decode_tokens_per_s":
        if isinstance(forward, BatchRecord):
            return forward.aggregate_decode_tokens_per_s
        return None if mean_step is None else 1e3 / mean_step
    if name == "ttft_ms":
        return forward.ttft_ms
    if name == "prefill_ms":
        return forward.prefill_ms
    if name == "vision_ms":
        return sum(forward.vision_ms.values()) if forward.vision_ms else None
    if name == PAGE_LATENCY_MS:
        return _page_latency(forward.ttft_ms, steps, decode_tokens or forward.new_tokens)
    if name == PEAK_MEMORY_GIB:
        return None if forward.peak_memory_bytes is None else forward.peak_memory_bytes / GIB
    raise KeyError(name)


# --------------------------------------------------------------------------------------------- comparison


def ratio_interval_95(base: Sequence[float], other: Sequence[float]) -> tuple[float, float] | None:
    """95% interval of geomean(other) / geomean(base) (Welch t on log values); None below 3 positive values each."""
    if min(len(base), len(other)) < MIN_VALUES_FOR_CI or min(*base, *other) <= 0:
        return None
    lb, lo = [math.log(v) for v in base], [math.log(v) for v in other]
    vb, vo = statistics.variance(lb) / len(lb), statistics.variance(lo) / len(lo)
    centre = statistics.fmean(lo) - statistics.fmean(lb)
    se = math.sqrt(vb + vo)
    if se == 0:
        return math.exp(centre), math.exp(centre)
    df = (vb + vo) ** 2 / (vb**2 / (len(lb) - 1) + vo**2 / (len(lo) - 1))
    half = t_critical_95(max(1, int(df))) * se
    return math.exp(centre - half), math.exp(centre + half)


def speedup(goal: Objective, base: Sequence[float], other: Sequence[float]) -> Speedup | None:
    """`other` against `base` on `goal`: > 1 is better; None when either has no value."""
    if not base or not other:
        return None
    base_p50, other_p50 = statistics.median(base), statistics.median(other)
    if base_p50 <= 0 or other_p50 <= 0:
        return None
    value = other_p50 / base_p50 if goal.higher_is_better else base_p50 / other_p50
    interval = ratio_interval_95(base, other)
    low = high = None
    if interval is not None:
        low, high = interval if goal.higher_is_better else (1 / interval[1], 1 / interval[0])
    return Speedup(
        value=value,
        ci95_low=low,
        ci95_high=high,
        ci_method=CI_LOG_RATIO if interval is not None else None,
        verdict=noise_verdict(summarize(other, goal.unit), summarize(base, goal.unit)),
    )


def comparable(rung: Rung) -> bool:
    """Whether a choice (best, best per goal, goodput) may name a rung: measured on its own (not a reused ladder
    rung), on the baseline's workload, and changed something (one that ran as the baseline did differs by noise)."""
    return rung.state == MEASURED and rung.reused is None and not rung.changes_workload and rung.no_change is None


def judged(s: Speedup | None) -> bool:
    """Whether a speed-up has a noise verdict: both sides had the ≥ 3 timed passes an interval needs."""
    return s is not None and s.verdict in (BEYOND, WITHIN)


def helped(s: Speedup | None) -> bool:
    """A lever helped when it is faster beyond the noise: only on intervals (≥ 3 passes per side). A ratio of fewer
    passes is reported as such, never called a gain."""
    return s is not None and s.verdict == BEYOND and s.value > 1.0


def outputs_against(
    base: Stage1Folder, other: Stage1Folder, near_tie_tolerance: float | None = None
) -> OutputAgreement | None:
    """Tokens (first timed pass of each input) and prefill logits of `other` against `base`, over shared inputs;
    where tokens depart, whether at a near-tie of the baseline's own top two logits (its top-two pass, judged
    against `near_tie_tolerance`, a fraction of the top logit)."""
    base_tokens = {p.image: p.token_ids for p in base.predictions}
    other_tokens = {p.image: p.token_ids for p in other.predictions}
    shared = [k for k in base_tokens if k in other_tokens]
    if not shared:
        return None
    departures = {k: first_departure(other_tokens[k], base_tokens[k]) for k in shared}
    found = [d for d in departures.values() if d is not None]
    compared = min(min(len(other_tokens[k]), len(base_tokens[k])) for k in shared)
    base_logits, other_logits = load_prefill_logits(base.path), load_prefill_logits(other.path)
    diffs = [
        float((other_logits[k] - base_logits[k]).abs().max())
        for k in shared
        if k in base_logits and k in other_logits and base_logits[k].shape == other_logits[k].shape
    ]
    top2 = load_top_two(base.path)
    ties = [
        near_tie(other_tokens[k], base_tokens[k], top2.get(k), near_tie_tolerance)
        for k in shared
        if departures[k] is not None
    ]
    known = [t for t in ties if t is not None]
    widest = max(known, key=lambda t: t.relative_gap) if known else None
    return OutputAgreement(
        inputs=len(shared),
        first_departure=min(found) if found else None,
        compared_tokens=compared,
        prefill_logits_max_abs_diff=max(diffs) if diffs else None,
        near_tie=widest if known and len(known) == len(ties) else None,
    )


# --------------------------------------------------------------------------------------------- rung figures


def _per_step(total: float | None, steps: int) -> float | None:
    return None if total is None or steps == 0 else total / steps


def rung_figures(folder: Stage1Folder, goal: Objective, decode_tokens: int | None = None) -> RungFigures:
    """What one rung's folder measured, brought to per-page / per-step figures."""
    m = folder.metrics
    values = pass_values(m, goal.name, decode_tokens)
    if not values:
        raise ValueError(f"{folder.path}: no timed pass has a {goal.label}")
    steps = sum(len(f.decode_step_ms) for f in m.forwards)  # decode steps timed (a batch's once, not per input)
    decode = m.efficiency_of(vocab.DECODE)
    prefill = m.efficiency_of(vocab.PREFILL)
    activity = None if m.profiler is None else m.profiler.activity  # kernels per decode step (a profiled CUDA pass)
    prefill_activity = None if activity is None else activity.prefill
    decode_summary = m.stage_stat(vocab.DECODE_STEP)
    # (summed kernel ms, GPU-busy ms) of a decode step and of the prefill, from the profiled pass
    decode_gpu = (None, None) if activity is None else (activity.kernel_ms_mean, activity.busy_ms_mean)
    prefill_gpu = (None, None) if prefill_activity is None else (prefill_activity.kernel_ms, prefill_activity.busy_ms)
    floors = tuple(
        StepFloor(
            stage=stage,
            speed_of_light_ms=_per_step(None if efficiency is None else efficiency.speed_of_light_ms, count),
            kernel_ms=kernel_ms,
            busy_ms=busy_ms,
            wall_ms=wall.summary.p50,
        )
        # per decode step (the speed of light over the steps timed) and per prefill (over the timed passes)
        for stage, wall, efficiency, count, (kernel_ms, busy_ms) in (
            (vocab.DECODE_STEP, decode_summary, decode, steps, decode_gpu),
            (vocab.PREFILL, m.stage_stat(vocab.PREFILL), prefill, len(m.forwards), prefill_gpu),
        )
        if wall is not None
    )
    pages = pass_values(m, "pages_per_s")
    per_page = run_pages(m)
    aggregate = pass_values(m, "aggregate_decode_tokens_per_s")
    peaks = [r.peak_memory_bytes for r in m.records if r.peak_memory_bytes is not None]
    return RungFigures(
        objective=summarize(values, goal.unit),
        decode_ms_per_token=None if decode_summary is None else decode_summary.summary,
        ttft_ms=None if (s := m.stage_stat(vocab.TTFT)) is None else s.summary,
        pages_per_s=statistics.median(pages) if pages else None,
        aggregate_decode_tokens_per_s=statistics.median(aggregate) if aggregate else None,
        kernels_per_step=None if activity is None else activity.kernels_mean,
        gpu_busy_fraction=None if activity is None else activity.busy_fraction,
        flops_per_step=_per_step(None if decode is None else decode.flops, steps),
        bytes_per_step=_per_step(None if decode is None else decode.bytes, steps),
        bound=None if decode is None else decode.bound,
        peak_memory_bytes=max(peaks) if peaks else None,
        compile_ms=None if m.compile is None else m.compile.compile_ms,
        warmup_passes=m.settings.warmup,
        batch_size=m.settings.batch_size,
        floors=floors,
        ttft_p90_ms=None if per_page is None else per_page.ttft_ms.p90,
        ttlt_p90_ms=None if per_page is None else per_page.ttlt_ms.p90,
    )


# --------------------------------------------------------------------------------------------- attribution

SMALL = 0.05  # a relative change below 5% in FLOPs or bytes is not a cause


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _idle(f: RungFigures) -> float | None:
    decode = next((x for x in f.floors if x.stage == vocab.DECODE_STEP), None)
    busy = _busy(f)
    return None if decode is None or busy is None else max(decode.wall_ms - busy, 0.0)


def _busy(f: RungFigures) -> float | None:
    return next((x.busy_ms for x in f.floors if x.stage == vocab.DECODE_STEP), None)


def _moved(new: float | None, old: float | None) -> bool:
    return new is not None and old is not None and old > 0 and abs(new - old) / old > SMALL


def attribute(figures: RungFigures, against: str, ref: RungFigures) -> Attribution | None:
    """Split a rung's decode-step change against `ref` into GPU-idle (launch and host overhead) and GPU-busy
    (kernel work), and name the cause: fewer launches, fewer bytes, fewer FLOPs or faster kernels."""
    if figures.decode_ms_per_token is None or ref.decode_ms_per_token is None:
        return None
    wall = figures.decode_ms_per_token.p50 - ref.decode_ms_per_token.p50
    idle, busy = _delta(_idle(figures), _idle(ref)), _delta(_busy(figures), _busy(ref))
    return Attribution(
        against=against,
        wall_ms=wall,
        idle_ms=idle,
        busy_ms=busy,
        kernels_per_step=_delta(figures.kernels_per_step, ref.kernels_per_step),
        flops_per_step=_delta(figures.flops_per_step, ref.flops_per_step),
        bytes_per_step=_delta(figures.bytes_per_step, ref.bytes_per_step),
        cause=_cause(figures, ref, wall, idle, busy),
    )


def _cause(f: RungFigures, ref: RungFigures, wall: float, idle: float | None, busy: float | None) -> str:
    direction = "saves" if wall < 0 else "adds"
    if idle is None or busy is None:
        return f"{direction} {abs(wall):.3g} ms/step; not split (no kernel timeline: CPU, or no profiled pass)"
    if abs(idle) >= abs(busy):
        if f.kernels_per_step is None or ref.kernels_per_step is None:
            return f"launch and host overhead: GPU idle {idle:+.3g} ms/step"
        if round(f.kernels_per_step) == round(ref.kernels_per_step) and not _moved(_busy(f), _busy(ref)):
            return (
                f"host time alone: the same {f.kernels_per_step:.0f} kernels/step and GPU-busy time, GPU idle "
                f"{idle:+.3g} ms/step (the lever's host-side work, or the host's pace drifting between the processes)"
            )
        launches = f" ({ref.kernels_per_step:.0f} → {f.kernels_per_step:.0f} kernels/step)"
        return f"launch and host overhead: GPU idle {idle:+.3g} ms/step{launches}"
    if _moved(f.bytes_per_step, ref.bytes_per_step) and f.bound == "memory":
        return (
            f"bytes moved: {_ratio_text(f.bytes_per_step, ref.bytes_per_step)} per step; GPU busy {busy:+.3g} ms/step"
        )
    if _moved(f.flops_per_step, ref.flops_per_step):
        return f"FLOPs: {_ratio_text(f.flops_per_step, ref.flops_per_step)} per step; GPU busy {busy:+.3g} ms/step"
    return f"kernel speed (same FLOPs and bytes): GPU busy {busy:+.3g} ms/step"


def _ratio_text(new: float | None, old: float | None) -> str:
    assert new is not None and old is not None
    return f"{new / old:.2f}× of the reference"


# --------------------------------------------------------------------------------------------- the ladder


@attrs.frozen
class LadderStep:
    """One rung of the cumulative ladder: the levers on so far and their merged overrides."""

    levers: tuple[str, ...]
    overrides: tuple[str, ...]


@attrs.frozen
class LadderPlan:
    steps: tuple[LadderStep, ...]
    left_out: tuple[tuple[str, str], ...]  # (lever, why it is not stacked)
    # levers stacked for the objective's parts they shortened (its own change within noise), with those parts
    stacked_by_parts: tuple[tuple[str, str], ...] = ()


# Lever settings whose effect a rung's folder records as built: the model's implementations (`ModelInfo`, read from
# the built model) and the decoder's runtime (`RunSettings.runtime`).
_RECORDED_MODEL_KEYS: Mapping[str, str] = {
    "model.attn_implementation": "attn_implementation",
    "model.experts_implementation": "experts_implementation",
}
_RUNTIME_KEYS = "runtime."


def no_effective_change(overrides: Sequence[str], base: Stage1Metrics, rung: Stage1Metrics) -> str | None:
    """Why a rung ran as the baseline did, or None: its overrides set only recorded settings (the model's attention
    and experts implementations, the decoder's runtime) and its folder recorded the baseline's values for every one,
    e.g. `model.experts_implementation=grouped_mm` where transformers already picks grouped_mm."""
    keys = [override_key(o) for o in overrides]
    if not keys or any(k not in _RECORDED_MODEL_KEYS and not k.startswith(_RUNTIME_KEYS) for k in keys):
        return None
    if rung.settings.runtime != base.settings.runtime:
        return None
    same = []
    for field in dict.fromkeys(_RECORDED_MODEL_KEYS[k] for k in keys if k in _RECORDED_MODEL_KEYS):
        value = getattr(rung.model, field)
        if value is None or value != getattr(base.model, field):
            return None
        same.append(f"{field.replace('_implementation', '')} {value}")
    if any(k.startswith(_RUNTIME_KEYS) for k in keys):
        same.append(f"its runtime ({base.settings.runtime.label})")
    return (
        f"the baseline already ran {' and '.join(same)}, so this rung changed nothing and its differences from the "
        "baseline are run-to-run noise"
    )


def plan_ladder(ranked: Sequence[Lever]) -> LadderPlan:
    """Stack `ranked` levers (best first) one at a time; a lever whose overrides are already on adds nothing and
    one that sets a key to another value than an earlier lever conflicts: both are left out with the reason."""
    merged: dict[str, str] = {}
    owner: dict[str, str] = {}
    names: list[str] = []
    steps: list[LadderStep] = []
    left_out: list[tuple[str, str]] = []
    for lever in ranked:
        wanted = {override_key(o): o for o in lever.overrides}
        clash = next((k for k, o in wanted.items() if k in merged and merged[k] != o), None)
        if clash is not None:
            left_out.append((lever.name, f"sets {clash} unlike {owner[clash]}, which is already on"))
            continue
        if all(merged.get(k) == o for k, o in wanted.items()):
            left_out.append((lever.name, f"already on through {', '.join(sorted({owner[k] for k in wanted}))}"))
            continue
        for k, o in wanted.items():
            merged.setdefault(k, o)
            owner.setdefault(k, lever.name)
        names.append(lever.name)
        steps.append(LadderStep(levers=tuple(names), overrides=tuple(merged.values())))
    return LadderPlan(steps=tuple(steps), left_out=tuple(left_out))


def outputs_departure(
    outputs: OutputAgreement | None, max_logit_diff: float | None, repeats_until: int | None = None
) -> str | None:
    """Why a rung's outputs are beyond the ladder's tolerance against the baseline's (a generated token differing
    before `repeats_until`, the token from which the baseline's own outputs do not repeat run to run, if known; with
    `max_logit_diff`, the last prompt position's logits further apart than it), or None when they are within."""
    if outputs is None:
        return "its outputs were not compared with the baseline's"
    departs = outputs.first_departure
    if departs is not None and not outputs.within_tolerance and (repeats_until is None or departs < repeats_until):
        where = "" if repeats_until is None else f" up to token {repeats_until}, where the baseline's stop repeating"
        tie = "" if outputs.near_tie is None else f", {near_tie_text(outputs.near_tie)}"
        return (
            f"its generated tokens depart from the baseline's at token {departs} of {outputs.compared_tokens}{tie} "
            f"(the ladder stacks only levers whose outputs are identical{where}, or depart only at a near-tie "
            "within whatif_run.near_tie_tolerance)"
        )
    diff = outputs.prefill_logits_max_abs_diff
    if max_logit_diff is not None and diff is not None and diff > max_logit_diff:
        return f"its prefill logits differ from the baseline's by up to {diff:.3g} (tolerance {max_logit_diff:g})"
    return None


def rank(levers: Sequence[Lever], gains: Mapping[str, Speedup | None]) -> list[Lever]:
    """The levers that helped, best measured speed-up first (ties in preset order)."""
    scored = [(lever, gain) for lever in levers if (gain := gains.get(lever.name)) is not None and helped(gain)]
    return [lever for lever, _ in sorted(scored, key=lambda pair: -pair[1].value)]


# An objective's figure and the judged figures inside it: the first token holds the prefill (vision inside) beside the
# page's preprocessing, a whole page its first token and decode steps. A lever that shortens a part beyond noise can
# leave the whole within noise when another part is noisy (preprocessing on the host, a host-paced decode).
OBJECTIVE_PARTS: Mapping[str, tuple[str, ...]] = {
    "ttft_ms": ("vision_ms", "prefill_ms"),
    PAGE_LATENCY_MS: ("ttft_ms", "decode_ms_per_token"),
}


def helped_by_parts(objective: str, gain: Speedup | None, judgements: Sequence[Judgement]) -> tuple[Judgement, ...]:
    """The parts of `objective` a lever shortened beyond noise while the objective itself moved only within noise
    (either way: its noise is another part's) and no part got worse beyond noise; empty when it did not help so. A
    part judged per page (`Judgement.per`: the rung's passes hold other numbers of pages) is no part of a page's wait.
    """
    parts = [j for j in judgements if j.objective in OBJECTIVE_PARTS.get(objective, ()) and not j.per]
    if gain is None or gain.verdict != WITHIN or any(j.verdict == WORSE for j in parts):
        return ()
    return tuple(j for j in parts if j.verdict == BETTER)


def rank_by_parts(
    levers: Sequence[Lever],
    objective: str,
    gains: Mapping[str, Speedup | None],
    judged: Mapping[str, Sequence[Judgement]],
) -> list[tuple[Lever, tuple[Judgement, ...]]]:
    """The levers that helped only through the objective's parts (`helped_by_parts`), best point speed-up of the
    objective first, each with those parts: they go on the ladder after the levers that helped the objective itself."""
    found = [
        (lever, parts, gain)
        for lever in levers
        if (parts := helped_by_parts(objective, gain := gains.get(lever.name), judged.get(lever.name, ())))
    ]
    return [(lever, parts) for lever, parts, _ in sorted(found, key=lambda t: -(t[2].value if t[2] else 0.0))]


@attrs.frozen
class HostDrift:
    """How far the host's pace drifted between two rungs' processes: a rung that ran as the baseline did (`rung`)
    measured `speedup` × the baseline beyond noise, which no interval over one process's passes sees."""

    rung: str
    speedup: float  # the no-op rung's speed-up against the baseline (> 1: it ran faster)

    @property
    def factor(self) -> float:
        """The drift as a ratio ≥ 1, either way."""
        return max(self.speedup, 1.0 / self.speedup)


def host_drifts(rungs: Iterable[Rung]) -> list[HostDrift]:
    """The drift each rung that changed nothing measured beyond noise against the baseline."""
    return [
        HostDrift(r.name, s.value)
        for r in rungs
        if r.no_change is not None and (s := r.speedup) is not None and s.verdict == BEYOND and s.value > 0
    ]


def host_drift(rungs: Iterable[Rung]) -> HostDrift | None:
    """The largest drift a rung that changed nothing measured beyond noise, or None (no such rung, or within noise)."""
    return max(host_drifts(rungs), key=lambda d: d.factor, default=None)


def least_gain(gain: Speedup | None, parts: Sequence[Judgement] = ()) -> float | None:
    """The smallest gain the intervals allow, as a factor above 1 is better: of the best part a lever was stacked for
    (`parts`, lower-is-better figures: 1 / the upper bound of value / base), else of its objective (the lower bound
    of its speed-up); the point value where there is no interval."""
    if parts:
        bounds = [1.0 / high for j in parts if (high := _highest_ratio(j)) is not None and high > 0]
        return max(bounds) if bounds else None
    if gain is None:
        return None
    return gain.ci95_low if gain.ci95_low is not None else gain.value


def _highest_ratio(j: Judgement) -> float | None:
    """The largest value / base the judgement allows: its interval's upper bound, else its point change."""
    if j.ci95_high is not None:
        return j.ci95_high
    return None if j.change is None else 1 + j.change


def folder_name(index: int, name: str) -> str:
    """A rung's folder under `rungs/`: its order and name, e.g. `03-cuda_graphs`."""
    return f"{index:02d}-{name}"


def relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)

"""The regression gate of `perf-compare --fail-on`: the figures a rule can name, the 95% interval of a change
between two runs, and each rule's verdict.

A rule is judged on the change of a figure's mean over the timed passes (new - baseline), its allowed increase T, and
the 95% interval [low, high] of the change (Welch t over the timed passes, per input when both runs timed the same
inputs with ≥ 3 passes each). The verdict, in this order: **regressed** when the change exceeds T and low > 0;
**improved** when high < 0; **pass** when high ≤ T (the runs rule out a larger increase); else **inconclusive**, as
when there is no interval at all (fewer than 3 passes on a side, a Stage 2 capture, pooled decode steps); **not
judged** when a run does not measure the figure. So "can't tell" is never a pass.

A gate's result is fail when a rule regressed, inconclusive when none did but one was inconclusive or not judged
(fail instead with `fail_on_unjudged`), else pass; `pipeline.compare` adds unusable (a folder failed, interrupted,
missing, or the same run twice) and parses the rules; `report.comparison` renders the `Gate` record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from llm_perf_opt.measure import host_difference
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI, summarize, t_critical_95
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.comparison import (
    GATE_FAILED,
    GATE_INCONCLUSIVE,
    GATE_PASSED,
    IMPROVED,
    INCONCLUSIVE,
    NOT_JUDGED,
    PASS,
    REGRESSED,
    UNDECIDED,
    Gate,
    GateCheck,
    GateRule,
)
from llm_perf_opt.records.folders import Stage1Folder, Stage2Folder
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.stage2 import Stage2Metrics

MS = "ms"
BYTES = "B"
STAGE_SUFFIX = "_ms"  # `<stage>_ms`: any stage of the runs' stage table (vision/sam_ms, decode/step_ms)


@attrs.frozen
class Sample:
    """A figure of one run: its summary over the timed passes and, where recorded, per input."""

    overall: Summary
    per_input: Mapping[str, Summary] = attrs.field(factory=dict)
    no_interval: str | None = None  # why these values give no interval to judge noise by (None: they do)


@attrs.frozen
class Figure:
    """A gateable figure: its name in rules, unit, label, and how to read it from a loaded run (higher is worse)."""

    name: str
    unit: str  # MS or BYTES
    label: str
    stage1: Callable[[Stage1Metrics], Sample | None]
    stage2: Callable[[Stage2Metrics], Sample | None] = lambda _: None  # Stage 2: one capture, never judged


def _stage(name: str) -> Callable[[Stage1Metrics], Sample | None]:
    """The stage `name` of a Stage 1 run: its summary over passes and its per-input summaries."""

    def read(m: Stage1Metrics) -> Sample | None:
        stat = m.stage_stat(name)
        if stat is None:
            return None
        per_input = {image: s.summary for image, stats in m.per_image.items() for s in stats if s.stage == name}
        return Sample(stat.summary, per_input)

    return read


def _decode_step(m: Stage1Metrics) -> Sample | None:
    """Decode ms per token: a pass's mean step. Runs of older releases pooled single steps into this summary
    (more values than decode passes), whose interval is several times too narrow: those give none."""
    sample, decode = _stage(vocab.DECODE_STEP)(m), m.stage_stat(vocab.DECODE)
    if sample is None or decode is None or sample.overall.n <= decode.summary.n:
        return sample
    why = f"run {m.run_id} pooled {sample.overall.n} single decode steps (an older release), not one per pass"
    return attrs.evolve(sample, no_interval=why)


def _peak_memory(m: Stage1Metrics) -> Sample | None:
    """Each timed pass's peak GPU memory (none off the GPU, or in trimmed records)."""
    values = [(f.cost_key, f.peak_memory_bytes) for f in m.forwards if f.peak_memory_bytes is not None]
    if not values:
        return None
    per_input: dict[str, list[float]] = {}
    for key, value in values:
        per_input.setdefault(key, []).append(float(value))
    return Sample(
        summarize([float(v) for _, v in values], BYTES), {k: summarize(v, BYTES) for k, v in per_input.items()}
    )


def _stage2_decode_step(m: Stage2Metrics) -> Sample | None:
    steps = m.decode_steps
    return None if steps is None else Sample(summarize([steps.step_wall_ms], MS))


# Every figure a rule can name besides `<stage>_ms`: a new figure is one line. All are "higher is worse".
FIGURES: Mapping[str, Figure] = {
    f.name: f
    for f in (
        Figure("preprocess_ms", MS, "preprocess time", _stage(vocab.PREPROCESS)),
        Figure("prefill_ms", MS, "prefill time (vision included)", _stage(vocab.PREFILL)),
        Figure("ttft_ms", MS, "time to first token", _stage(vocab.TTFT)),
        Figure("decode_ms", MS, "decode time", _stage(vocab.DECODE)),
        Figure("decode_ms_per_token", MS, "decode ms per token", _decode_step, _stage2_decode_step),
        Figure("e2e_ms", MS, "end-to-end time", _stage(vocab.E2E)),
        Figure("peak_gpu_memory", BYTES, "peak GPU memory of a pass", _peak_memory),
    )
}


def figures_for(stages: Sequence[str]) -> dict[str, Figure]:
    """The figures rules may name for runs with these stage names: `FIGURES` and `<stage>_ms` for every other
    stage (the vision sub-stages, e.g. `vision/sam_ms`)."""
    named = dict(FIGURES)
    for stage in (s for s in stages if s != vocab.DECODE_STEP):  # decode/step is decode_ms_per_token
        named.setdefault(f"{stage}{STAGE_SUFFIX}", Figure(f"{stage}{STAGE_SUFFIX}", MS, f"{stage} time", _stage(stage)))
    return named


def read(figure: Figure, folder: Stage1Folder | Stage2Folder) -> Sample | None:
    """`figure` of a loaded run (None: not measured there)."""
    return figure.stage1(folder.metrics) if isinstance(folder, Stage1Folder) else figure.stage2(folder.metrics)


# --------------------------------------------------------------------------------------------- the interval


def welch_interval(pairs: Sequence[tuple[Summary, Summary]]) -> tuple[float, float] | None:
    """95% interval of the mean over `pairs` of (new mean - base mean), Welch t with Satterthwaite's degrees of
    freedom; None when any side has fewer than 3 values."""
    if not pairs or any(min(b.n, n.n) < MIN_VALUES_FOR_CI for b, n in pairs):
        return None
    k = len(pairs)
    centre = sum(n.mean - b.mean for b, n in pairs) / k
    parts = [(s.std**2 / s.n, s.n) for pair in pairs for s in pair]
    var = sum(v for v, _ in parts)
    if var == 0:
        return centre, centre
    df = var**2 / sum(v**2 / (n - 1) for v, n in parts)
    half = t_critical_95(max(1, int(df))) * math.sqrt(var) / k
    return centre - half, centre + half


def difference_interval(base: Sample, new: Sample) -> tuple[float, float, str] | None:
    """(low, high, basis) of the 95% interval of new - base: per input when both runs timed the same two or more
    inputs with ≥ 3 passes each (the image mix left out of the noise), else over all passes; None below 3."""
    if base.no_interval is not None or new.no_interval is not None:
        return None
    inputs = list(base.per_input)
    if len(inputs) >= 2 and set(inputs) == set(new.per_input):
        interval = welch_interval([(base.per_input[i], new.per_input[i]) for i in inputs])
        if interval is not None:
            return (*interval, f"per input ({len(inputs)} inputs)")
    interval = welch_interval([(base.overall, new.overall)])
    return None if interval is None else (*interval, "over all passes")


# --------------------------------------------------------------------------------------------- the verdicts


def amount_text(value: float, unit: str) -> str:
    """A signed amount in a figure's unit: `+1.25 ms`, `+1.50 GiB`."""
    if unit == BYTES:
        for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= scale:
                return f"{value / scale:+,.2f} {name}"
        return f"{value:+,.0f} B"
    return f"{value:+,.2f} {unit}"


def allowed(rule: GateRule, base_value: float) -> float:
    """The increase over `base_value` the rule allows, in the figure's unit."""
    return rule.amount if rule.amount is not None else abs(base_value) * (rule.percent or 0.0) / 100


def check(rule: GateRule, label: str, base: Sample | None, new: Sample | None) -> GateCheck:
    """One rule judged on the run `label` against the baseline."""
    empty = GateCheck(rule.text, rule.figure, label, rule.unit, None, None, None, None, None, None, None, None, "", "")
    if base is None or new is None:
        where = "either run" if base is None and new is None else ("the baseline" if base is None else label)
        return attrs.evolve(empty, verdict=NOT_JUDGED, reason=f"not judged: {rule.figure} is not measured in {where}")
    b, n = base.overall.mean, new.overall.mean
    change, threshold = n - b, allowed(rule, b)
    interval = difference_interval(base, new)
    low, high, basis = interval if interval is not None else (None, None, None)
    passes = min(base.overall.n, new.overall.n)
    too_few = f"too few passes ({passes}; an interval needs ≥ {MIN_VALUES_FOR_CI} on each side)"
    why = base.no_interval or new.no_interval or too_few
    verdict, reason = _verdict(rule, change, threshold, low, high, why)
    return attrs.evolve(
        empty,
        base_value=b,
        new_value=n,
        change=change,
        change_pct=change / b * 100 if b else None,
        threshold=threshold,
        noise_low=low,
        noise_high=high,
        noise_basis=basis,
        verdict=verdict,
        reason=reason,
    )


def _verdict(
    rule: GateRule, change: float, threshold: float, low: float | None, high: float | None, no_interval: str
) -> tuple[str, str]:
    """The verdict and its reason (the module's rule); `no_interval` says why there is no interval when `low`/`high`
    are None."""
    shown = f"change {amount_text(change, rule.unit)}, allowed {amount_text(threshold, rule.unit)}"
    if low is None or high is None:
        return INCONCLUSIVE, f"no interval to judge it by: {no_interval} ({shown})"
    noise = f"95% interval of the change {amount_text(low, rule.unit)} to {amount_text(high, rule.unit)}"
    if change > threshold and low > 0:
        return REGRESSED, f"beyond the allowed increase and beyond noise ({shown}; {noise})"
    if high < 0:
        return IMPROVED, f"lower beyond noise ({shown}; {noise})"
    if high <= threshold:
        return PASS, f"within the allowed increase beyond noise ({shown}; {noise})"
    if change > threshold:
        return INCONCLUSIVE, f"beyond the allowed increase, but the runs cannot tell it from noise ({shown}; {noise})"
    return INCONCLUSIVE, f"within the allowed increase, but a larger increase is not ruled out ({shown}; {noise})"


def gate(
    rules: Sequence[GateRule],
    figures: Mapping[str, Figure],
    runs: Sequence[tuple[str, Stage1Folder | Stage2Folder]],
    *,
    fail_on_unjudged: bool = False,
    differences: Sequence[str] = (),
) -> Gate:
    """Every rule on every run after the first (the baseline) of `runs`, and the gate's result."""
    (_, base), others = runs[0], runs[1:]
    checks = tuple(
        check(rule, label, read(figures[rule.figure], base), read(figures[rule.figure], folder))
        for rule in rules
        for label, folder in others
    )
    undecided = any(c.verdict in UNDECIDED for c in checks)
    if any(c.verdict == REGRESSED for c in checks) or (fail_on_unjudged and undecided):
        result = GATE_FAILED
    else:
        result = GATE_INCONCLUSIVE if undecided else GATE_PASSED
    return Gate(
        rules=tuple(rules),
        checks=checks,
        fail_on_unjudged=fail_on_unjudged,
        result=result,
        differences=tuple(differences),
        hint=undecided_hint(checks, runs),
        host_differences=_host_differences(runs),
    )


PIN_THREADS = "on a shared CPU, pin the threads (OMP_NUM_THREADS=1, or run.cpu_affinity=auto) and keep the host quiet"


def undecided_hint(checks: Sequence[GateCheck], runs: Sequence[tuple[str, Stage1Folder | Stage2Folder]]) -> str | None:
    """What would let the gate judge the rules it could not: more timed passes and a quieter host for an
    inconclusive rule, the figure's absence for a rule not judged; None when every rule was judged."""
    hints = []
    if any(c.verdict == INCONCLUSIVE for c in checks):
        repeats = [f.metrics.settings.repeats for _, f in runs if isinstance(f, Stage1Folder)]
        if repeats:
            more = max(10, 2 * max(repeats))
            hints.append(
                f"time more passes so the 95% interval narrows (about as 1/√passes): rerun both with "
                f"run.repeats={more} (these runs timed {', '.join(str(r) for r in repeats)}); {PIN_THREADS}"
            )
        else:
            hints.append("a Stage 2 capture is one value per run, with no interval: gate Stage 1 runs instead")
    if any(c.verdict == NOT_JUDGED for c in checks):
        hints.append("a figure a run did not measure cannot be judged: measure it in both runs, or drop its rule")
    return "; ".join(hints) or None


def _host_differences(runs: Sequence[tuple[str, Stage1Folder | Stage2Folder]]) -> tuple[str, ...]:
    """How each Stage 1 run's host usage differed from the baseline's (measure.host_difference), in words."""
    usage = [(label, f.metrics.host_usage) for label, f in runs if isinstance(f, Stage1Folder)]
    return tuple(line for lines in host_difference.run_differences(usage) for line in lines)


# --------------------------------------------------------------------------------------------- same workload?


def _workload(f: Stage1Folder | Stage2Folder) -> dict[str, object]:
    """What the gate compares of a run's workload and device (a Stage 2 run's: its workload's; None: not recorded)."""
    model = f.metrics.model
    settings = f.metrics.settings if isinstance(f, Stage1Folder) else f.metrics.workload_settings
    fields: dict[str, object] = {
        "model": None if model is None else model.name,
        "dtype": None if model is None else model.dtype,
        "device": f.metrics.device.name,
    }
    for key in ("max_new_tokens", "max_images", "batch_size"):
        fields[key] = None if settings is None else getattr(settings, key)
    if isinstance(f, Stage1Folder):  # None: trimmed records, not compared
        fields["inputs"] = ", ".join(f.metrics.images) if f.metrics.records else None
    return fields


def workload_differences(runs: Sequence[tuple[str, Stage1Folder | Stage2Folder]]) -> tuple[str, ...]:
    """What differs in workload or device between each run and the first (model, dtype, device, tokens, inputs,
    batch size), one line each; a field a run did not record is not compared."""
    fields = [_workload(f) for _, f in runs]
    base_label, base = runs[0][0], fields[0]
    lines = []
    for (label, _), other in zip(runs[1:], fields[1:], strict=True):
        for key, value in other.items():
            was = base.get(key)
            if key == "inputs" and (value is None or was is None):
                continue
            if value != was:
                lines.append(f"{key}: {was} ({base_label}) vs {value} ({label})")
    return tuple(lines)

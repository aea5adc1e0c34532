"""`perf-whatif` records (`whatif.json`): the levers tried, every rung measured (baseline, each lever alone, the
cumulative ladder), what each changed and why, and the recommendations they back."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import attrs
from cattrs.gen import make_dict_unstructure_fn

from llm_perf_opt.records.advice import Advice
from llm_perf_opt.records.common import Summary, TimeBudget
from llm_perf_opt.records.io import converter
from llm_perf_opt.records.modules import ModuleAttribution, StageModuleChanges

# What a lever may change: only the time of the same work, or the work itself (mode, tiles, dtype, …).
LATENCY = "latency"
WORKLOAD = "workload"

# Phases of a what-if run, in the order they run.
BASELINE = "baseline"
ALONE = "alone"  # one lever against the baseline
LADDER = "ladder"  # the levers that helped, added one at a time in order of measured gain


class RungState(enum.StrEnum):
    """What became of a rung (`Rung.state`); a str, so `whatif.json` holds the same words and older records load."""

    MEASURED = "complete"
    FAILED = "failed"  # failed while running
    SKIPPED = "skipped"  # skipped before running (with the reason)
    INVALID = "invalid"  # refused by validation
    PENDING = "pending"  # planned, not run yet (only in a record written while the run was still going)
    # Stopped with the what-if run (Ctrl-C, SIGTERM): its figures cover the passes it measured; it is not judged.
    INTERRUPTED = "interrupted"


MEASURED = RungState.MEASURED
FAILED = RungState.FAILED
SKIPPED = RungState.SKIPPED
INVALID = RungState.INVALID
PENDING = RungState.PENDING
INTERRUPTED = RungState.INTERRUPTED

# How one objective of a rung compares with the baseline's (`Judgement.verdict`).
BETTER = "better"
WORSE = "worse"
SAME = "within noise"
NOT_JUDGED = "not judged"

# The goals a what-if run names a best rung for (`whatif.objective` picks the headline one).
PAGE_LATENCY = "page_latency"
FIRST_TOKEN = "first_token"
THROUGHPUT = "throughput"
MEMORY = "memory"

# The per-page latencies a latency target and the pages/s frontier read (p90 over a rung's timed passes).
TTLT_P90 = "ttlt_p90_ms"  # time to last token of a page
TTFT_P90 = "ttft_p90_ms"  # time to first token of a page
LATENCY_FIGURES = {TTLT_P90: "p90 time to last token per page", TTFT_P90: "p90 time to first token per page"}

# How the rungs ran: each its own `stage1-run` process started by perf-whatif, or one Hydra multirun per phase.
LOCAL_LAUNCHER = "local"
HYDRA_LAUNCHER = "hydra"


def hydra_launcher_name(overrides: Sequence[str]) -> str:
    """The Hydra launcher that `hydra/launcher=<name>` among `overrides` chooses (`basic` when none does)."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("hydra/launcher=")]
    return chosen[-1] if chosen else "basic"


@attrs.frozen
class Lever:
    """One optimisation lever: a name, the overrides that turn it on and what it may change."""

    name: str
    overrides: tuple[str, ...]  # Hydra overrides of `stage1-run`, e.g. ("runtime.kv_cache=static",)
    about: str = ""
    changes: str = LATENCY  # LATENCY | WORKLOAD
    needs: str | None = None  # "cuda" for levers that cannot run elsewhere
    # whatif=advised: the advice it comes from, with its predicted saving per page (None: a preset's own lever)
    advice: Advice | None = None


@attrs.frozen
class Objective:
    """A figure: the one a preset ranks levers by, or one each rung is judged on (`measure.whatif_objectives`)."""

    name: str  # e.g. "decode_ms_per_token"
    label: str  # e.g. "decode ms/token (p50)"
    unit: str
    higher_is_better: bool


@attrs.frozen
class Speedup:
    """A rung's objective against a reference rung: > 1 is better whatever the objective's direction."""

    value: float  # reference p50 / rung p50 (lower-is-better) or rung p50 / reference p50
    ci95_low: float | None  # interval of the ratio of geometric means over passes (None below 3 passes each)
    ci95_high: float | None
    ci_method: str | None
    verdict: str  # measure.noise verdict on the two objective summaries


@attrs.frozen
class NearTie:
    """Where a rung's tokens depart from the baseline's, when the two tokens there were the baseline's own top two
    candidates (its top-two pass, `run.save_top2_logits`, on the same tokens before): how far apart their logits
    were, against the what-if's tolerance."""

    token: int  # the generated index of the departure
    gap: float  # the baseline's top logit there minus its second
    top_logit: float
    tolerance: float | None  # the largest gap counted as a tie, as a fraction of |top logit|; None: none counts

    @property
    def relative_gap(self) -> float:
        """The gap as a fraction of |top logit| (0 for an exact tie)."""
        if self.gap <= 0:
            return 0.0
        return self.gap / abs(self.top_logit) if self.top_logit else math.inf

    @property
    def within(self) -> bool:
        """The two candidates were tied within the tolerance: either choice is greedy decoding's own rounding."""
        return self.tolerance is not None and self.relative_gap <= self.tolerance


@attrs.frozen
class OutputAgreement:
    """A rung's outputs against the baseline's, over the inputs both ran."""

    inputs: int  # inputs compared
    first_departure: int | None  # smallest generated index where any input's tokens differ; None: all identical
    compared_tokens: int  # generated tokens compared per input (the shorter of the two)
    prefill_logits_max_abs_diff: float | None  # largest |Δ logit| at the last prompt position; None: not recorded
    # Set when every input that departs does so between the baseline's top two candidates (the widest gap of them);
    # None: identical, no top-two pass recorded, or some input departs to another token
    near_tie: NearTie | None = None

    @property
    def identical(self) -> bool:
        return self.first_departure is None

    @property
    def within_tolerance(self) -> bool:
        """Identical, or departing only at near-ties within the what-if's tolerance."""
        return self.identical or (self.near_tie is not None and self.near_tie.within)


@attrs.frozen
class StepFloor:
    """One stage of one rung from its floor up (ms per decode step, or per prefill): speed of light (analytic
    bytes over peak bandwidth or FLOPs over peak compute) → summed kernel time → GPU-busy time → wall time."""

    stage: str  # "decode/step" | "prefill"
    speed_of_light_ms: float | None
    kernel_ms: float | None  # summed kernel durations (profiled pass)
    busy_ms: float | None  # union of kernel intervals (profiled pass)
    wall_ms: float  # p50 over the timed passes

    @property
    def layers(self) -> tuple[float | None, ...]:
        """Speed of light, summed kernels, GPU busy and wall, floor first."""
        return self.speed_of_light_ms, self.kernel_ms, self.busy_ms, self.wall_ms


@attrs.frozen
class RungFigures:
    """What one rung measured (`stage1-run` figures of its folder), per page unless said."""

    objective: Summary  # the preset's objective, one value per timed pass
    decode_ms_per_token: Summary | None
    ttft_ms: Summary | None
    pages_per_s: float | None  # median over passes
    aggregate_decode_tokens_per_s: float | None  # whole batch, median over passes
    kernels_per_step: float | None  # decode, profiled pass
    gpu_busy_fraction: float | None  # decode steps, profiled pass
    flops_per_step: float | None  # counted, per decode step of the batch
    bytes_per_step: float | None  # analytic, per decode step of the batch
    bound: str | None  # decode's roofline verdict ("memory" | "compute")
    peak_memory_bytes: int | None  # max over timed passes
    compile_ms: float | None  # host time of every call that compiled (warm-up included)
    warmup_passes: int
    batch_size: int
    floors: tuple[StepFloor, ...] = ()
    # Per-page latency at the measured decode length (`Stage1Metrics.pages`: every page of a batch pass gets its
    # pass's times), p90 over the timed passes; None in records written before them
    ttft_p90_ms: float | None = None  # time to first token
    ttlt_p90_ms: float | None = None  # time to last token

    def latency_ms(self, figure: str) -> float | None:
        """The per-page p90 latency `figure` names (TTLT_P90 | TTFT_P90)."""
        return {TTLT_P90: self.ttlt_p90_ms, TTFT_P90: self.ttft_p90_ms}[figure]


@attrs.frozen
class Attribution:
    """Where a rung's decode-step change against a reference rung came from (ms per step; negative = saved)."""

    against: str  # the reference rung's name
    wall_ms: float
    idle_ms: float | None  # change of (wall − GPU busy): launch and host overhead
    busy_ms: float | None  # change of GPU-busy time: the kernels' own work
    kernels_per_step: float | None  # change in kernel launches per step
    flops_per_step: float | None
    bytes_per_step: float | None
    cause: str  # one line, e.g. "fewer launches: 912 → 6 kernels/step; GPU idle −15.3 ms/step"


@attrs.frozen
class Judgement:
    """One objective of a rung against the baseline's: both values, the change and the verdict (with why)."""

    objective: str  # the figure's key, e.g. "ttft_ms" (measure.whatif.FIGURES)
    label: str  # plain words, e.g. "time to first token"
    unit: str  # of `base` and `value`, e.g. "ms"
    base: float | None  # the baseline's p50 (or its one value)
    value: float | None  # the rung's p50 (or its one value)
    verdict: str  # BETTER | WORSE | SAME | NOT_JUDGED
    change: float | None = None  # value / base − 1 (+1.30: 130% more); None where there is no ratio
    ci95_low: float | None = None  # 95% interval of value / base (ratio of geometric means over passes)
    ci95_high: float | None = None
    why: str | None = None  # why it is not judged, or how it was judged (a threshold, an extrapolation)
    # A pass-time figure judged per page ("page") or per page-token ("page-token": a decode step over its pages)
    # where the rung's passes hold other numbers of pages than the baseline's; None: per pass, as measured
    per: str | None = None


@attrs.frozen
class GoalChoice:
    """The best rung for one goal (whole-page latency, first token, throughput, memory)."""

    goal: str  # PAGE_LATENCY | FIRST_TOKEN | THROUGHPUT | MEMORY
    label: str  # e.g. "whole-page latency at 256 decode tokens"
    rung: str | None  # None: no rung could be judged on this goal
    value: float | None = None
    unit: str = ""
    why: str = ""  # e.g. "no rung beat the baseline beyond noise"


@attrs.frozen
class LatencyTarget:
    """`whatif.latency_target`: the per-page p90 latency a configuration must meet to count for goodput (each figure
    set must be met; None: not asked)."""

    ttlt_p90_ms: float | None = None
    ttft_p90_ms: float | None = None

    @property
    def limits(self) -> dict[str, float]:
        """The figures set (LATENCY_FIGURES keys) and their limits in ms, last token first."""
        pairs = ((TTLT_P90, self.ttlt_p90_ms), (TTFT_P90, self.ttft_p90_ms))
        return {figure: limit for figure, limit in pairs if limit is not None}

    @property
    def figure(self) -> str:
        """The latency the frontier is drawn against: the target's last-token figure where it has one, else its
        first-token one (a target on the first token alone), else the last token."""
        return TTFT_P90 if self.ttft_p90_ms is not None and self.ttlt_p90_ms is None else TTLT_P90


@attrs.frozen
class Goodput:
    """Pages/s against per-page latency: the rungs on the frontier (none has both more pages/s and a lower latency),
    and with a latency target the highest pages/s among the rungs that meet it (goodput)."""

    figure: str  # the latency of the frontier: TTLT_P90 | TTFT_P90
    considered: tuple[str, ...]  # rungs with pages/s and per-page latency, measured on the baseline's workload
    frontier: tuple[str, ...]  # the Pareto set of `considered`, lowest latency first
    target: LatencyTarget | None = None
    met: tuple[str, ...] = ()  # rungs meeting the target, most pages/s first
    best: str | None = None  # goodput: the first of `met`; None without a target or when no rung met it
    # No rung met the target: the rung nearest to it (the smallest worst ratio of latency to limit)
    nearest: str | None = None


@attrs.frozen
class AdvisedFrom:
    """`whatif=advised`: the Stage 1 run whose advice named the levers (`whatif.from_run`), what it ran, and its advice
    that became no lever (code changes, and levers past the most a run takes)."""

    folder: str
    model: str
    device: str | None
    max_new_tokens: int
    not_run: tuple[Advice, ...] = ()
    max_levers: int = 0  # the most advised levers one run takes (those past it are in `not_run`)


@attrs.frozen
class PredictionCheck:
    """One advised lever: the saving per page its advice predicted against the saving its rung measured, on the
    parts of the page its bound lies in (`Advice.parts`; the whole objective where it names none). `why_not`: why
    nothing was measured (not runnable, skipped, failed)."""

    lever: str  # the rung's name, or the advice's words for one that did not run
    kind: str  # the calibration's key
    objective: str  # the advice's ("page latency", "first token", "throughput")
    parts: tuple[str, ...]  # where the saving is measured
    bound_ms: float
    predicted_ms: float
    predicted_low_ms: float
    predicted_high_ms: float
    advised_ms: float  # the objective's time per page in the advised run
    baseline_ms: float | None = None  # the objective's time per page in this run's baseline
    measured_ms: float | None = None  # the baseline's time per page on `parts` less the rung's (p50 over passes)
    measured_low_ms: float | None = None  # its 95% interval (≥ 3 timed passes a side)
    measured_high_ms: float | None = None
    objective_saving_ms: float | None = None  # the same over the whole objective (side effects included)
    why_not: str | None = None

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured: +0.25 predicted a quarter too much; None where nothing was saved."""
        if self.measured_ms is None or self.measured_ms <= 0:
            return None
        return (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def inside(self) -> bool | None:
        """Whether the measured saving lies inside the predicted interval (None: not measured)."""
        if self.measured_ms is None:
            return None
        return self.predicted_low_ms <= self.measured_ms <= self.predicted_high_ms


@attrs.frozen
class Rung:
    """One configuration of the what-if run and what became of it."""

    name: str
    phase: str  # BASELINE | ALONE | LADDER
    levers: tuple[str, ...]  # levers on, in order
    overrides: tuple[str, ...]  # the overrides the rung ran with (workload overrides not repeated)
    changes_workload: bool
    state: RungState  # PENDING only while the run goes on
    reason: str | None = None  # why it failed, was skipped, refused or interrupted
    folder: str | None = None  # its stage1-run folder, relative to the what-if folder
    wall_s: float | None = None  # the rung's process from start to end (model build, compilation, passes)
    figures: RungFigures | None = None
    speedup: Speedup | None = None  # against the baseline
    outputs: OutputAgreement | None = None  # against the baseline
    attribution: Attribution | None = None  # against the baseline (alone) or the previous rung (ladder)
    reused: str | None = None  # a ladder rung identical to an earlier rung: that rung's name (not run again)
    # Every objective against the baseline (empty in records written before per-objective verdicts)
    judgements: tuple[Judgement, ...] = ()
    # Plain-words flags: a gain on one objective with a loss on another beyond noise, memory over the budget or far
    # above the baseline's, e.g. "decode −91%, but time to first token +130% and prefill +56%"
    tradeoffs: tuple[str, ...] = ()
    # Which modules the rung moved against the baseline, per stage (both runs with module attribution; else empty)
    modules: tuple[StageModuleChanges, ...] = ()
    # Set when the rung ran with the baseline's effective settings (its levers set what the baseline already ran,
    # e.g. experts grouped_mm where that is transformers' default): why, in plain words; its differences are noise
    no_change: str | None = None
    # What holds the rung's own decode step and prefill: the modules furthest above their floor (a few per stage,
    # `measure.module_changes.held_by`); None without module attribution
    held: ModuleAttribution | None = None

    def judgement(self, objective: str) -> Judgement | None:
        return next((j for j in self.judgements if j.objective == objective), None)


@attrs.frozen
class Verdict:
    """One lever's outcome in one line, for the report and the recommendations."""

    lever: str
    helped: bool
    line: str  # e.g. "static cache: 1.34× (beyond noise), outputs identical for 32 tokens"
    # Measured with a noise verdict (≥ 3 passes per side); False: not run, or too few passes to tell (older
    # records: True, their verdicts list unmeasured levers among those that did not help)
    judged: bool = True


@attrs.frozen
class BaselineSettings:
    """How the baseline rung ran (`WhatIfRecord.settings`): passes, warm-up passes, new tokens, inputs. All None when
    no baseline was measured; the file then holds `{}`, as it always has (the Nones are left out)."""

    repeats: int | None = None
    warmup: int | None = None
    max_new_tokens: int | None = None
    inputs: int | None = None


converter.register_unstructure_hook(
    BaselineSettings, make_dict_unstructure_fn(BaselineSettings, converter, _cattrs_omit_if_default=True)
)


@attrs.frozen
class WhatIfRecord:
    """`whatif.json`."""

    schema_version: str
    run_id: str
    stage: str  # "whatif"
    created: str
    preset: str
    objective: Objective
    model: str
    weights: str | None  # "random" | "checkpoint" (from the baseline run)
    device: str | None
    workload_overrides: tuple[str, ...]
    levers: tuple[Lever, ...]
    rungs: tuple[Rung, ...]
    best: str | None  # the ladder rung (or lever) with the best objective among those whose outputs were checked
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...] = ()
    settings: BaselineSettings = BaselineSettings()
    device_type: str | None = None  # "cuda" | "cpu" (the baseline's `DeviceInfo.type`); None: not recorded
    # How the rungs ran (whatif_run.launcher): LOCAL_LAUNCHER or HYDRA_LAUNCHER; None: not recorded (older runs)
    launcher: str | None = None
    launcher_overrides: tuple[str, ...] = ()  # HYDRA_LAUNCHER: whatif_run.hydra_launcher, e.g. hydra/launcher=joblib
    # LOCAL_LAUNCHER with whatif_run.devices: the devices rungs ran on, one rung per device at a time (several: rungs
    # ran at the same time on one host); empty: one rung after another on the `device` setting
    devices: tuple[str, ...] = ()
    # The decode length whole-page latency is judged at, and where it comes from ("workload ocr1-a4-page", "measured")
    decode_tokens: int | None = None
    decode_tokens_source: str | None = None
    memory_budget_gib: float | None = None  # whatif.memory_budget_gib (None: no budget)
    # whatif_run.near_tie_tolerance: a departure between the baseline's top two tokens within this fraction of its
    # top logit counts as the same output (None: every departure counts; older records: not recorded)
    near_tie_tolerance: float | None = None
    best_per_goal: tuple[GoalChoice, ...] = ()  # one per goal (empty in older records)
    frontier: tuple[str, ...] = ()  # rungs no other rung beats on every goal (the trade-off frontier)
    time_budget: TimeBudget | None = None  # where perf-whatif's wall time went, by phase (None in older records)
    latency_target: LatencyTarget | None = None  # whatif.latency_target (None: none set, or an older record)
    goodput: Goodput | None = None  # pages/s against per-page latency (None: no rung has both, or an older record)
    # whatif=advised: the run whose advice named the levers, and each advised lever predicted against measured
    advised_from: AdvisedFrom | None = None
    predictions: tuple[PredictionCheck, ...] = ()
    ladder: bool | None = None  # whatif_run.ladder as the run had it (None: an older record)

    def rung(self, name: str) -> Rung | None:
        return next((r for r in self.rungs if r.name == name), None)

    @property
    def baseline(self) -> Rung | None:
        return next((r for r in self.rungs if r.phase == BASELINE), None)

    @property
    def best_rung(self) -> Rung | None:
        return None if self.best is None else self.rung(self.best)

    @property
    def device_phrase(self) -> str:
        """How the reports name where the rungs ran: "this GPU (NVIDIA H100 …)", "this CPU (…)"."""
        kind = {"cuda": "this GPU", "cpu": "this CPU"}.get(self.device_type or "", "this device")
        return f"{kind} ({self.device})" if self.device else kind

    def figures_of(self, rung: Rung) -> RungFigures | None:
        """A rung's figures, or those of the rung it reused (a ladder rung identical to an earlier one)."""
        if rung.figures is not None or rung.reused is None:
            return rung.figures
        earlier = self.rung(rung.reused)
        return None if earlier is None else earlier.figures

    def unjudged_levers(self) -> list[str]:
        """The levers measured without a noise verdict (too few timed passes on a side for an interval)."""
        return [v.lever for v in self.verdicts if not v.judged and (r := self.rung(v.lever)) and r.state == MEASURED]

    def measured_overrides(self) -> tuple[str, ...]:
        """The overrides the measured rungs ran with (each once, in rung order)."""
        return tuple(dict.fromkeys(o for r in self.rungs if r.state == MEASURED for o in r.overrides))

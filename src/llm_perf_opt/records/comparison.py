"""The comparison `perf-compare` writes (`compare.json`, rendered as `compare.md`): runs of one kind side by side,
against the first usable run of that kind as baseline.

Per-run figures are tuples in run order (baseline first); per-other-run figures (ratios, noise verdicts) are
tuples in the order of the runs after the baseline. None: not measured in that run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

from llm_perf_opt.records.io import load_file

STAGE1 = "stage1"
STAGE2 = "stage2"
KINDS = {STAGE1: "Stage 1", STAGE2: "Stage 2"}


@attrs.frozen
class ComparedRun:
    """One usable run folder: its label in the tables and what the run list says about it."""

    path: Path
    label: str  # the folder name, made unique with `#2`, `#3`
    kind: str  # STAGE1 | STAGE2
    model: str | None  # None: a Stage 2 run without its workload's model
    device: str | None
    created: str
    repeats: int | None = None  # Stage 1
    mode: str | None = None  # Stage 2


@attrs.frozen
class Skipped:
    """A folder left out, and why."""

    path: Path
    reason: str


@attrs.frozen
class FieldDifference:
    """A configuration or environment field whose value differs between the runs (values as shown, per run)."""

    field: str
    values: tuple[str | None, ...]


@attrs.frozen
class Mover:
    """An operator or kernel whose time moved between the baseline and one other run (None: not recorded there)."""

    name: str
    base_calls: int | None
    other_calls: int | None
    base_ms: float | None
    other_ms: float | None
    delta_ms: float  # other - baseline, a missing entry counted as 0


@attrs.frozen
class MoverTable:
    """The entries that moved most between the baseline and `other`, largest absolute change first."""

    other: str  # label
    base_key: str  # the time column the baseline is ranked by ("self_device_ms", "self_cpu_ms", "total_ms")
    other_key: str
    movers: tuple[Mover, ...]


# --------------------------------------------------------------------------------------------- Stage 1


@attrs.frozen
class StageChange:
    """One stage of one run against the baseline."""

    p50_ms: float | None
    ratio: float | None  # run p50 / baseline p50
    beyond_noise: str  # measure.noise.noise_verdict
    noise_side: str | None = None  # the side of the two runs' noise the verdict rests on (StageVariation.noise_side)
    # The stage may be paced by the host (not known to be GPU-side) and the two runs' host usage differed
    # (measure.host_difference): its change may be the host's load, not a setting's
    host_differed: bool = False


@attrs.frozen
class StageTimeRow:
    stage: str
    nested_in: str | None
    base_p50_ms: float | None
    others: tuple[StageChange, ...]


@attrs.frozen
class EfficiencyRow:
    """MFU, achieved TFLOP/s and MBU of one stage, per run."""

    stage: str
    mfu: tuple[float | None, ...]
    achieved_tflops: tuple[float | None, ...]
    mbu: tuple[float | None, ...]


@attrs.frozen
class ResourceRow:
    """One memory or energy figure per run (the memory and energy passes: one value per run, so a change is judged
    against a stated tolerance, not an interval)."""

    figure: str  # e.g. "peak allocated (GiB)", "J per decode token"
    values: tuple[float | None, ...]  # per run, the baseline first; None: not measured there
    changes: tuple[str, ...]  # per run after the baseline: "higher", "lower", "same within 2%", "n/a"
    tolerance: float  # relative


@attrs.frozen
class RateChange:
    """One run's rate against the baseline's (higher is better)."""

    p50: float | None
    ratio: float | None  # run p50 / baseline p50: above 1 is better
    beyond_noise: str  # measure.noise.noise_verdict
    batch_size: int | None = None  # inputs per forward the rate is for


@attrs.frozen
class RateRow:
    """A rate of every run (pages/s), p50 over the timed forwards, beside the baseline's."""

    figure: str  # e.g. "pages/s"
    base_p50: float | None
    others: tuple[RateChange, ...]
    base_batch_size: int | None = None


@attrs.frozen
class Stage1Comparison:
    stage_times: tuple[StageTimeRow, ...]
    efficiency: tuple[EfficiencyRow, ...]
    operators: tuple[MoverTable, ...]  # one per run after the baseline
    differences: tuple[FieldDifference, ...]
    config_differences: tuple[FieldDifference, ...] = ()  # other config.yaml keys that differ
    resources: tuple[ResourceRow, ...] = ()  # memory and energy passes (empty when no run has them)
    # Per run after the baseline: the host figures that differed from the baseline's (measure.host_difference), in
    # words, e.g. "CPU per pass 2.66 s vs 0.50 s"; empty: none differed, or a run did not record its host usage
    host_differences: tuple[tuple[str, ...], ...] = ()
    throughput: tuple[RateRow, ...] = ()  # pages/s per run (empty in comparisons written before it)


# --------------------------------------------------------------------------------------------- Stage 2


@attrs.frozen
class BusyChange:
    busy_ms: float | None
    ratio: float | None  # run busy ms / baseline busy ms


@attrs.frozen
class BusyRow:
    """GPU busy time of one stage (Nsight Systems)."""

    stage: str
    base_busy_ms: float | None
    others: tuple[BusyChange, ...]
    busy_fraction: tuple[float | None, ...]  # per run
    kernels: tuple[int | None, ...]  # per run


@attrs.frozen
class RunTotals:
    """Whole-run figures of one Stage 2 run."""

    kernel_launches: int | None
    decode_step_wall_ms: float | None
    kernels_per_decode_step: float | None
    decode_gpu_busy: float | None


@attrs.frozen
class Stage2Comparison:
    busy: tuple[BusyRow, ...]
    totals: tuple[RunTotals, ...]  # per run
    kernels: tuple[MoverTable, ...]  # one per run after the baseline
    differences: tuple[FieldDifference, ...]
    config_differences: tuple[FieldDifference, ...] = ()  # other config.yaml keys that differ


# --------------------------------------------------------------------------------------------- the gate

# A rule's verdict on one run (measure.gate says when each applies).
PASS = "pass"
REGRESSED = "regressed"
IMPROVED = "improved"
INCONCLUSIVE = "inconclusive"  # the noise leaves open whether the allowed increase was exceeded
NOT_JUDGED = "not judged"  # the figure is not measured in a run
UNDECIDED = (INCONCLUSIVE, NOT_JUDGED)  # verdicts that keep a gate from passing without failing it

# A gate's result, most serious first (`combined_result`).
GATE_FAILED = "fail"  # a rule regressed (or, with --fail-on-unjudged, could not be judged)
GATE_UNUSABLE = "unusable"  # a folder the gate was to judge is failed, interrupted, missing, or the same run twice
GATE_INCONCLUSIVE = "inconclusive"  # no rule regressed, but one could not be judged
GATE_PASSED = "pass"  # every rule judged on usable folders, none beyond its allowed increase
GATE_RESULTS = (GATE_FAILED, GATE_UNUSABLE, GATE_INCONCLUSIVE, GATE_PASSED)
# perf-compare's exit code for each result (2 is bad input, a UserError).
GATE_EXIT_CODES = {GATE_PASSED: 0, GATE_FAILED: 1, GATE_INCONCLUSIVE: 3, GATE_UNUSABLE: 4}


def combined_result(results: Iterable[str]) -> str:
    """The result of several gates: the most serious of `results` (pass when there are none)."""
    given = set(results)
    return next((r for r in GATE_RESULTS if r in given), GATE_PASSED)


@attrs.frozen
class GateRule:
    """One `--fail-on` rule: a figure and the increase over the baseline it may show."""

    text: str  # as given, e.g. "decode_ms_per_token:+5%"
    figure: str
    percent: float | None  # allowed increase in % of the baseline's value
    amount: float | None  # or an allowed absolute increase, in the figure's unit (ms or B)
    unit: str  # the figure's unit


@attrs.frozen
class GateCheck:
    """One rule judged on one run against the baseline. Values are means over timed passes, in `unit`."""

    rule: str  # GateRule.text
    figure: str
    run: str  # the compared run's label
    unit: str
    base_value: float | None
    new_value: float | None
    change: float | None  # new - base
    change_pct: float | None  # change / base, in %
    threshold: float | None  # the allowed increase, in `unit`
    noise_low: float | None  # 95% interval of new - base (None: too few passes for one)
    noise_high: float | None
    noise_basis: str | None  # how the interval was built ("per input (2 inputs)", "over all passes")
    verdict: str  # PASS | REGRESSED | IMPROVED | INCONCLUSIVE | NOT_JUDGED
    reason: str


@attrs.frozen
class Gate:
    """Every rule judged on every run after the baseline, and the result (one of GATE_RESULTS, as defined above)."""

    rules: tuple[GateRule, ...]
    checks: tuple[GateCheck, ...]
    fail_on_unjudged: bool
    result: str  # one of GATE_RESULTS
    differences: tuple[str, ...] = ()  # workload or device differences allowed by --allow-different
    problems: tuple[str, ...] = ()  # why the result is unusable: the folders that could not be judged, and why
    hint: str | None = None  # what would let the gate judge the rules it could not (None: nothing to add)
    # The runs whose host usage differed from the baseline's, and how (host-paced figures may have moved with it)
    host_differences: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------- the whole


@attrs.frozen
class Comparison:
    """`compare.json`: every usable run, the skipped folders, and a section per kind with two runs or more."""

    schema_version: str
    runs: tuple[ComparedRun, ...]
    skipped: tuple[Skipped, ...]
    stage1: Stage1Comparison | None
    stage2: Stage2Comparison | None
    top_movers: int  # the most movers a table lists
    gate: Gate | None = None  # --fail-on: the rules judged (None: no rules given, and older records)

    def runs_of(self, kind: str) -> tuple[ComparedRun, ...]:
        """The runs of one kind, baseline first."""
        return tuple(r for r in self.runs if r.kind == kind)


@attrs.frozen
class RungPair:
    """One rung of two `perf-whatif` folders: both rungs compared (`comparison`), or why they were not."""

    rung: str
    base_folder: Path | None
    new_folder: Path | None
    comparison: Comparison | None
    reason: str | None = None  # why the rung was not compared


@attrs.frozen
class WhatIfComparison:
    """`compare.json` of two `perf-whatif` folders: their rungs paired by name, each pair a `Comparison`."""

    schema_version: str
    stage: str  # WHATIF_COMPARE, which tells this record from a `Comparison`
    base: Path
    new: Path
    pairs: tuple[RungPair, ...]
    gate_result: str | None  # the most serious of the pairs' results and `gate_problems`; None: no rules given
    # Why the gate over every rung is unusable: a folder not complete, a rung one side measured and the other not
    gate_problems: tuple[str, ...] = ()
    gate_hint: str | None = None  # what would let the gate judge the rules it could not

    @property
    def gate_failed(self) -> bool:
        return self.gate_result == GATE_FAILED


WHATIF_COMPARE = "whatif-compare"


def load_comparison(path: Path) -> Comparison:
    """A `compare.json` read back (RecordError when missing, damaged or of another schema version)."""
    return load_file(path, Comparison)


def load_whatif_comparison(path: Path) -> WhatIfComparison:
    """The `compare.json` of two what-if folders read back (RecordError as `load_comparison`)."""
    return load_file(path, WhatIfComparison)

"""The thresholds that stand in for noise where a run has one value of a figure, not an interval over passes: a
difference within them counts as the same. Shared by the what-if's verdicts and `perf-compare`'s resource rows."""

from __future__ import annotations

from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.vocabulary import E2E

MEMORY_TOLERANCE = 0.02  # a peak within 2% of the baseline's (allocator block rounding)
ENERGY_TOLERANCE = 0.05  # one NVML energy pass: within 5%
# The first-pass extra (one pass per input against its timed median): within 25%, or within 10% of the baseline's
# timed pass end to end (the noise of a single pass, where the extra itself is near 0)
FIRST_PASS_TOLERANCE = 0.25
FIRST_PASS_FLOOR = 0.10
COMPILE_NOTICE_S = 5.0  # warm-up/compile host time within 5 s


def first_pass_floor_ms(base: Stage1Metrics) -> float:
    """`FIRST_PASS_FLOOR` of the baseline's timed pass end to end (its p50, ms); 0 without timed passes."""
    e2e = base.stage_stat(E2E)
    return 0.0 if e2e is None else FIRST_PASS_FLOOR * e2e.summary.p50


def same_setup_cost(base: float, value: float, tolerance: float, floor: float) -> bool:
    """A setup cost (at least 0) the same as the baseline's: within `tolerance` of it, or within `floor` (its unit)."""
    return abs(value - base) <= max(tolerance * base, floor)

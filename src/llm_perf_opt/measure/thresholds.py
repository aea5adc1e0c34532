"""The thresholds that stand in for noise where a run has one value of a figure, not an interval over passes: a
difference within them counts as the same. Shared by the what-if's verdicts and `perf-compare`'s resource rows."""

from __future__ import annotations

MEMORY_TOLERANCE = 0.02  # a peak within 2% of the baseline's (allocator block rounding)
ENERGY_TOLERANCE = 0.05  # one NVML energy pass: within 5%
# The first-pass extra (one pass per input against its timed median): within 25%, or within 10% of the baseline's
# timed pass end to end (the noise of a single pass, where the extra itself is near 0)
FIRST_PASS_TOLERANCE = 0.25
FIRST_PASS_FLOOR = 0.10
COMPILE_NOTICE_S = 5.0  # warm-up/compile host time within 5 s

"""Whether a change between two runs exceeds their run-to-run noise: one rule for every reader.

Beyond noise when the two 95% intervals (over passes, `measure.stats`) do not overlap: a conservative test (roughly
a 0.5% level for equal widths), so "within noise" only says the runs cannot tell the two apart. Below 3 passes a
summary has no interval and there is no verdict."""

from __future__ import annotations

from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI
from llm_perf_opt.records.common import Summary

BEYOND = "beyond noise"
WITHIN = "within noise"
NOT_MEASURED = "n/a"
TOO_FEW = f"n/a (needs ≥ {MIN_VALUES_FOR_CI} passes each)"


def noise_verdict(summary: Summary | None, base: Summary | None) -> str:
    """`BEYOND` when the 95% intervals of `summary` and `base` do not overlap, `WITHIN` when they do; `NOT_MEASURED`
    when either is absent (the stage did not run), `TOO_FEW` when either has no interval."""
    if summary is None or base is None:
        return NOT_MEASURED
    if summary.ci95_low is None or summary.ci95_high is None or base.ci95_low is None or base.ci95_high is None:
        return TOO_FEW
    apart = summary.ci95_high < base.ci95_low or base.ci95_high < summary.ci95_low
    return BEYOND if apart else WITHIN

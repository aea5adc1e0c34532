"""Whether a change between two runs exceeds their recorded run-to-run noise (one rule, used by every reader)."""

from __future__ import annotations

from llm_perf_opt.records.common import Summary

NA = "n/a"
BEYOND = "yes"
WITHIN = "within noise"
TOO_FEW = "n/a (needs ≥ 2 passes each)"


def noise_verdict(summary: Summary | None, base: Summary | None) -> str:
    """`yes` when the 95% CIs of the two means do not overlap, `within noise` when they do, n/a otherwise."""
    if summary is None or base is None:
        return NA
    if min(summary.n, base.n) < 2:
        return TOO_FEW
    apart = summary.ci95_high < base.ci95_low or base.ci95_high < summary.ci95_low
    return BEYOND if apart else WITHIN

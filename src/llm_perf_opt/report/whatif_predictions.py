"""The "Predicted against measured" section of `whatif.md` (`perf-whatif whatif=advised`): each advised lever's
predicted saving per page beside the saving its rung measured, from `WhatIfRecord.predictions`."""

from __future__ import annotations

from llm_perf_opt.measure.advice import SAME_WORKLOAD, same_workload
from llm_perf_opt.records.whatif import PredictionCheck, WhatIfRecord
from llm_perf_opt.report.markdown import Doc, ms

HEADER = (
    "lever", "objective", "predicted saving, ms/page", "measured saving, ms/page", "error", "inside the interval",
    "whole objective, measured saving",
)  # fmt: skip
CALIBRATION_SCRIPT = "scripts/update_advice_calibration.py"


def _interval(value: float, low: float | None, high: float | None) -> str:
    """`662.1 (398.1–663.4)`, or the value alone without an interval."""
    return ms(value) if low is None or high is None else f"{ms(value)} ({ms(low)}–{ms(high)})"


def _error(check: PredictionCheck) -> str:
    if check.measured_ms is None:
        return "—"
    error = check.error
    if error is None:
        return "n/a (nothing saved)"
    return "0.0%" if round(error * 100, 1) == 0 else f"{error * 100:+.1f}%"


def _whole(saving: float | None) -> str:
    if saving is None:
        return "n/a"
    return ms(saving) if saving >= 0 else f"−{ms(-saving)} (slower)"


def prediction_row(check: PredictionCheck) -> list[str]:
    """One table row: what was predicted, what was measured (or why nothing was), the error and the interval."""
    predicted = _interval(check.predicted_ms, check.predicted_low_ms, check.predicted_high_ms)
    if check.measured_ms is None:
        measured, inside, whole = check.why_not or "not measured", "—", "—"
    else:
        parts = ", ".join(check.parts)
        measured = f"{_interval(check.measured_ms, check.measured_low_ms, check.measured_high_ms)} on {parts}"
        inside = "yes" if check.inside else "no"
        whole = _whole(check.objective_saving_ms)
    return [f"`{check.lever}`", check.objective, predicted, measured, _error(check), inside, whole]


def predictions_section(doc: Doc, record: WhatIfRecord, folder: str) -> None:
    """The section, where the record holds predictions (`folder`: the advised run's folder as the report names it)."""
    if not record.predictions:
        return
    doc.h2("Predicted against measured")
    source = ""
    if (advised := record.advised_from) is not None:
        device = advised.device or "device not recorded"
        source = f" of `{folder}` ({advised.model}, {advised.max_new_tokens} decode tokens, {device})"
    doc.para(
        f"The advice{source}: each lever's predicted saving per page (its kind's calibrated share of its bound, with "
        "the interval of the shares measured so far) against the saving its rung measured on the parts of the page "
        "the bound lies in (the baseline's p50 over the timed passes less the rung's; its 95% interval with ≥ 3 "
        "passes a side). Error: (predicted − measured) / measured. The last column is the whole objective's measured "
        "saving, side effects on other parts included."
    )
    doc.table(list(HEADER), [prediction_row(check) for check in record.predictions])
    other = [c for c in record.predictions if c.measured_ms is not None and not same_workload(c)]
    if other:
        c = other[0]
        baseline = ms(c.baseline_ms)
        doc.para(
            f"The baseline's {c.objective} ({baseline} ms/page) is not the advised run's ({ms(c.advised_ms)} ms/page) "
            f"within {SAME_WORKLOAD:.0%}: it ran another workload or host than the advice was worked out on, so "
            f"these errors say little of the advice, and `{CALIBRATION_SCRIPT}` leaves them out."
        )
    elif any(c.measured_ms is not None for c in record.predictions):
        doc.para(
            f"`python {CALIBRATION_SCRIPT} <this folder>` folds the measured shares into the calibration the advice "
            "predicts with."
        )

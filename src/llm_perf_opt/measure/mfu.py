"""MFU per stage: FLOPs over all timed passes / (their measured time x dense peak FLOP/s). Totals, not a mean of
ratios, keep the arithmetic checkable from the report (each row shows FLOPs, time, TFLOP/s and the peak's source).

A pass is one input's (`ImageRecord`, batch 1) or one batch's (`BatchRecord`): its FLOPs are looked up by its
`cost_key`, so a batch's MFU is the batch's FLOPs over the batch's time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from llm_perf_opt.measure.stage_flops import StageFlops, run_flops_source
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.stage1 import MfuRecord


def utilization(amount: float, seconds: float, peak: PeakFigure | None) -> tuple[float, float | None]:
    """(achieved rate, fraction of `peak`) for `amount` units of work done in `seconds`: the one place MFU (FLOPs,
    dense FLOP/s peak) and MBU (bytes, B/s peak) are computed."""
    rate = amount / seconds
    return rate, (rate / peak.value if peak is not None else None)


class TimedPass(Protocol):
    """One timed pass with stage times (ms): an `ImageRecord` or a `BatchRecord`."""

    @property
    def cost_key(self) -> str: ...
    @property
    def prefill_ms(self) -> float: ...
    @property
    def decode_ms(self) -> float: ...
    @property
    def vision_ms(self) -> Mapping[str, float]: ...
    @property
    def new_tokens(self) -> int: ...


def stage_time_ms(record: TimedPass, stage: str) -> float:
    if stage == vocab.PREFILL:
        return record.prefill_ms
    if stage == vocab.DECODE:
        return record.decode_ms
    return record.vision_ms.get(stage, 0.0)


def mfu_by_stage(
    records: Sequence[TimedPass],
    flops_by_image: Mapping[str, StageFlops],
    stage_names: Sequence[str],
    peak: PeakFigure | None,
) -> tuple[MfuRecord, ...]:
    """One MfuRecord per stage of `stage_names` that has time; `flops_by_image` keyed by the passes' `cost_key`."""
    out = []
    for stage in stage_names:
        flops_total = time_ms = 0.0
        for rec in records:
            flops = flops_by_image[rec.cost_key].stage_total(stage, rec.new_tokens)
            if flops is None:
                continue
            flops_total += flops
            time_ms += stage_time_ms(rec, stage)
        if time_ms <= 0:
            continue
        achieved, fraction = utilization(flops_total, time_ms / 1e3, peak)
        out.append(
            MfuRecord(
                stage=stage,
                flops_total=flops_total,
                time_total_ms=time_ms,
                achieved_tflops=achieved / 1e12,
                peak=peak,
                mfu=fraction,
                flops_source=run_flops_source(flops_by_image.values()),
            )
        )
    return tuple(out)

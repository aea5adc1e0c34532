"""Dispersion of stage times over the timed passes, overall and per image, and the batches in brief. One value per
timed pass, `decode/step` too (the pass's mean step: steps of one pass are not independent samples; pooling them
made the interval several times too narrow)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import BatchRecord, BatchSummary, ImageRecord, StageStat


def stage_values(
    records: Iterable[ImageRecord] | Iterable[BatchRecord], vision_stages: Sequence[str]
) -> dict[str, list[float]]:
    """Per stage name, one value (ms) per pass; for `decode/step`, the pass's mean step time."""
    values: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        values.setdefault(name, []).append(value)

    for rec in records:
        add(vocab.PREPROCESS, rec.preprocess_ms)
        add(vocab.PREFILL, rec.prefill_ms)
        for stage in vision_stages:
            add(stage, rec.vision_ms.get(stage, 0.0))
        add(vocab.TTFT, rec.ttft_ms)
        if rec.decode_step_ms:
            add(vocab.DECODE, rec.decode_ms)
            add(vocab.DECODE_STEP, statistics.fmean(rec.decode_step_ms))
        add(vocab.E2E, rec.e2e_ms)
    return values


def stage_totals_ms(forwards: Sequence[ImageRecord] | Sequence[BatchRecord]) -> dict[str, float]:
    """Per measured stage (TTFT and end to end left out), its time summed over the timed forwards (a batch's inputs
    share its prefill and decode); `decode/step` sums every step."""
    vision = tuple(dict.fromkeys(s for f in forwards for s in f.vision_ms))
    totals = {
        stage: sum(values)
        for stage, values in stage_values(forwards, vision).items()
        if stage not in (vocab.TTFT, vocab.E2E, vocab.DECODE_STEP)
    }
    if any(f.decode_step_ms for f in forwards):
        totals[vocab.DECODE_STEP] = sum(sum(f.decode_step_ms) for f in forwards)
    return totals


def stage_stats(records: Sequence[ImageRecord], vision_stages: Sequence[str]) -> tuple[StageStat, ...]:
    """Summary per stage over `records`, in report order."""
    return tuple(
        StageStat(stage=name, nested_in=vocab.nested_in(name), summary=summarize(vals, "ms"))
        for name, vals in stage_values(records, vision_stages).items()
    )


def batch_summary(batches: Sequence[BatchRecord], batch_size: int, decode_experts: str | None) -> BatchSummary | None:
    """The batch passes in brief, over the full batches' passes (all when none is full); None without any."""
    if not batches:
        return None
    full = [b for b in batches if b.size == batch_size] or list(batches)
    sizes = {b.batch: b.size for b in batches}
    last = sizes[max(sizes)]
    steps = [statistics.fmean(b.decode_step_ms) for b in full if b.decode_step_ms]
    aggregate = [r for b in full if (r := b.aggregate_decode_tokens_per_s) is not None]
    memory = [b.peak_memory_bytes for b in batches if b.peak_memory_bytes is not None]
    return BatchSummary(
        batch_size=batch_size,
        batches=len(sizes),
        short_last_batch=last if last < batch_size else None,
        passes=len(full),
        decode_step_ms=summarize(steps, "ms") if steps else None,
        aggregate_decode_tokens_per_s=summarize(aggregate, "tokens/s") if aggregate else None,
        pages_per_s=summarize([b.pages_per_s for b in full], "pages/s"),
        peak_memory_bytes=max(memory) if memory else None,
        decode_experts=decode_experts,
    )

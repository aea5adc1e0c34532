"""The sweep summary's analysis: the figures of each job's Stage 1 record and the override keys the sweep varied."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.sweep import ABSENT, BATCH_SIZE_KEY, JobFigures, SweepJob, SweepSummary, ThroughputPoint


def _finite(value: float | None) -> float | None:
    """`value`, or None when it is missing or not finite (the summary is strict JSON)."""
    return value if value is not None and math.isfinite(value) else None


def job_figures(metrics: Stage1Metrics) -> JobFigures:
    """The figures of one sweep row from a job's Stage 1 metrics."""

    def p50(stage: str) -> float | None:
        stat = metrics.stage_stat(stage)
        return None if stat is None else _finite(stat.summary.p50)

    prefill_mfu = metrics.mfu_of(vocab.PREFILL)
    decode_efficiency = metrics.efficiency_of(vocab.DECODE)
    size = metrics.settings.batch_size
    batch = metrics.batch_summary
    if batch is not None and batch.aggregate_decode_tokens_per_s is not None:
        aggregate = _finite(batch.aggregate_decode_tokens_per_s.p50)
    else:  # batch 1: the batch is the input
        aggregate = _finite(metrics.throughput.decode_tokens_per_s) if size == 1 else None
    return JobFigures(
        e2e_p50_ms=p50(vocab.E2E),
        prefill_p50_ms=p50(vocab.PREFILL),
        decode_p50_ms=p50(vocab.DECODE),
        decode_ms_per_token_p50=p50(vocab.DECODE_STEP),
        ttft_p50_ms=p50(vocab.TTFT),
        prefill_mfu=None if prefill_mfu is None else _finite(prefill_mfu.mfu),
        prefill_achieved_tflops=None if prefill_mfu is None else _finite(prefill_mfu.achieved_tflops),
        decode_mbu=None if decode_efficiency is None else _finite(decode_efficiency.mbu),
        decode_tokens_per_s=_finite(metrics.throughput.decode_tokens_per_s),
        batch_size=size,
        per_input_decode_tokens_per_s=None if aggregate is None else aggregate / size,
        aggregate_decode_tokens_per_s=aggregate,
    )


def throughput_latency(jobs: Sequence[SweepJob], keys: Sequence[str]) -> tuple[ThroughputPoint, ...]:
    """Per-input against aggregate decode tokens/s of each summarised job by batch size (empty unless it is swept)."""
    if BATCH_SIZE_KEY not in keys:
        return ()
    points = [
        ThroughputPoint(
            job=job.num,
            batch_size=m.batch_size,
            per_input_decode_tokens_per_s=m.per_input_decode_tokens_per_s,
            aggregate_decode_tokens_per_s=m.aggregate_decode_tokens_per_s,
            decode_ms_per_token_p50=m.decode_ms_per_token_p50,
        )
        for job in jobs
        if job.ok
        and (m := job.metrics) is not None
        and m.batch_size is not None
        and m.per_input_decode_tokens_per_s is not None
        and m.aggregate_decode_tokens_per_s is not None
    ]
    return tuple(sorted(points, key=lambda p: (p.batch_size, p.job)))


def swept_keys(jobs: Sequence[SweepJob]) -> list[str]:
    """Override keys whose value differs between jobs (those with readable overrides), in first-seen order."""
    known = [job.overrides for job in jobs if job.overrides is not None]
    keys = dict.fromkeys(k for overrides in known for k in overrides)
    return [k for k in keys if len({overrides.get(k, ABSENT) for overrides in known}) > 1]


def summarize(sweep_dir: Path, jobs: Sequence[SweepJob]) -> SweepSummary:
    """The summary of a sweep's jobs (in job order), each with its values of the swept keys."""
    keys = swept_keys(jobs)
    return SweepSummary(
        sweep_dir=str(sweep_dir),
        swept_keys=tuple(keys),
        jobs=tuple(attrs.evolve(j, swept={k: j.value(k) for k in keys}) for j in jobs),
        throughput_latency=throughput_latency(jobs, keys),
    )

"""The sweep summary's analysis: the figures of each job's Stage 1 record and the override keys the sweep varied."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.sweep import ABSENT, JobFigures, SweepJob, SweepSummary


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
    )


def swept_keys(jobs: Sequence[SweepJob]) -> list[str]:
    """Override keys whose value differs between jobs (those with readable overrides), in first-seen order."""
    known = [job.overrides for job in jobs if job.overrides is not None]
    keys: list[str] = []
    for overrides in known:
        keys.extend(k for k in overrides if k not in keys)
    return [k for k in keys if len({overrides.get(k, ABSENT) for overrides in known}) > 1]


def summarize(sweep_dir: Path, jobs: Sequence[SweepJob]) -> SweepSummary:
    """The summary of a sweep's jobs (in job order), each with its values of the swept keys."""
    keys = swept_keys(jobs)
    return SweepSummary(
        sweep_dir=str(sweep_dir),
        swept_keys=tuple(keys),
        jobs=tuple(attrs.evolve(j, swept={k: j.value(k) for k in keys}) for j in jobs),
    )

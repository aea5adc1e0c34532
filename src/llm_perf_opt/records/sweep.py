"""The summary of a Hydra multirun of `stage1-run` (`sweep_summary.json`): one entry per job folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.io import load_file

BATCH_SIZE_KEY = "run.batch_size"  # the override whose sweep gives the throughput–latency curve
ABSENT = "(default)"  # value shown for a swept key that a job did not override
UNKNOWN = "?"  # value shown when the job's overrides.yaml is missing or unreadable


@attrs.frozen
class JobFigures:
    """The figures of one summarised job (None where the run did not measure them)."""

    e2e_p50_ms: float | None = None
    prefill_p50_ms: float | None = None
    decode_p50_ms: float | None = None
    decode_ms_per_token_p50: float | None = None
    ttft_p50_ms: float | None = None
    prefill_mfu: float | None = None
    prefill_achieved_tflops: float | None = None
    decode_mbu: float | None = None
    decode_tokens_per_s: float | None = None
    batch_size: int | None = None  # run.batch_size (None: a run that did not record it)
    # decode tokens/s of one input (tokens after the first over the decode time) and of the whole batch (every
    # input's): p50 over the full batches' passes (batch 1: the per-pass median)
    per_input_decode_tokens_per_s: float | None = None
    aggregate_decode_tokens_per_s: float | None = None


@attrs.frozen
class ThroughputPoint:
    """One batch size of a sweep over run.batch_size: what one input sees (latency) against what the batch delivers
    (throughput)."""

    job: int
    batch_size: int
    per_input_decode_tokens_per_s: float
    aggregate_decode_tokens_per_s: float
    decode_ms_per_token_p50: float | None


@attrs.frozen
class SweepJob:
    """One job folder: its overrides, its state and, when summarised, its figures (`skipped_reason` otherwise)."""

    num: int
    folder: str  # relative to the sweep folder
    swept: Mapping[str, str]  # the swept keys' values for this job
    overrides: Mapping[str, str] | None  # None: `.hydra/overrides.yaml` missing or unreadable
    status: str
    message: str | None = None
    skipped_reason: str | None = None
    metrics: JobFigures | None = None
    report: str | None = None  # relative to the sweep folder

    @property
    def ok(self) -> bool:
        return self.skipped_reason is None

    def value(self, key: str) -> str:
        """This job's value of an override key, as shown in the tables."""
        return UNKNOWN if self.overrides is None else self.overrides.get(key, ABSENT)


@attrs.frozen
class SweepSummary:
    """`sweep_summary.json`: the sweep folder, the override keys that vary between jobs, and every job."""

    sweep_dir: str
    swept_keys: tuple[str, ...]
    jobs: tuple[SweepJob, ...]
    schema_version: str = SCHEMA_VERSION
    # a sweep over run.batch_size: one point per summarised job, by batch size (empty otherwise)
    throughput_latency: tuple[ThroughputPoint, ...] = ()

    @property
    def summarised(self) -> tuple[tuple[SweepJob, JobFigures], ...]:
        """The summarised jobs with their figures, in job order."""
        return tuple((j, j.metrics) for j in self.jobs if j.ok and j.metrics is not None)

    @property
    def skipped(self) -> tuple[SweepJob, ...]:
        return tuple(j for j in self.jobs if not j.ok)


def load_sweep_summary(path: Path) -> SweepSummary:
    """A `sweep_summary.json` read back (RecordError when missing, damaged or of another schema major version)."""
    return load_file(path, SweepSummary)

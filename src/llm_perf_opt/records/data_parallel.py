"""Data parallel over GPUs (`run.data_parallel`): what each process records of its share, and the combined summary
of all of them (`data_parallel.json`)."""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.io import load_file
from llm_perf_opt.records.shard import PassWindow, ShardInfo

__all__ = ["DATA_PARALLEL_FILE", "DataParallelSummary", "PassWindow", "ShardFigures", "ShardInfo", "SingleGpu"]

DATA_PARALLEL_FILE = "data_parallel.json"


@attrs.frozen
class ShardFigures:
    """One process of a data-parallel run, as the summary shows it (rates in pages/s; None: not measured)."""

    shard: int
    folder: str  # relative to the summary's folder
    status: str
    device: str | None = None
    host: str | None = None
    started: str | None = None  # the run's start and end (run_status.json, ISO time)
    ended: str | None = None
    timed_from_s: float | None = None  # its first timed pass's start and last timed pass's end (epoch seconds)
    timed_to_s: float | None = None
    passes: int = 0
    inputs: int | None = None  # distinct inputs it timed
    replicated: bool = False  # fewer inputs than processes: it timed all of them, as every process did
    pages_per_s_alone: float | None = None  # p50 over its own timed passes (`Stage1Metrics.pages`)
    window_pages: float | None = None  # pages its timed passes finished inside the common window (pro rata)
    window_pages_per_s: float | None = None  # window_pages over the window's length
    skipped_reason: str | None = None  # why it is not in the combined figure

    @property
    def ok(self) -> bool:
        return self.skipped_reason is None


@attrs.frozen
class SingleGpu:
    """The single-GPU pages/s of the same workload the scaling efficiency is against, and where it comes from."""

    pages_per_s: float
    source: str  # e.g. "run folder runs/gpu1: 38 pages over its timed passes' 12.1 s"


@attrs.frozen
class DataParallelSummary:
    """`data_parallel.json`: every process of one data-parallel run and, when they timed at once, the combined
    pages/s over the window in which all of them were timing (`problem` says why there is no combined figure)."""

    folder: str
    processes: int  # run.data_parallel
    shards: tuple[ShardFigures, ...]
    window_start_s: float | None = None
    window_end_s: float | None = None
    combined_pages_per_s: float | None = None
    single_gpu: SingleGpu | None = None
    scaling_efficiency: float | None = None  # combined / (processes x single-GPU pages/s)
    problem: str | None = None
    workload: str | None = None  # what every process ran, in words (model, batch, tokens, device kind)
    schema_version: str = SCHEMA_VERSION

    @property
    def window_s(self) -> float | None:
        if self.window_start_s is None or self.window_end_s is None:
            return None
        return self.window_end_s - self.window_start_s


def load_data_parallel(path: Path) -> DataParallelSummary:
    """A `data_parallel.json` read back (RecordError when missing, damaged or of another schema major version)."""
    return load_file(path, DataParallelSummary)

"""Records shared by every kind of run folder: dispersion summaries, peak figures, the run status."""

from __future__ import annotations

import attrs

# The version of every record file the toolkit writes; a reader accepts any minor version of its major.
# 1.2: run_status.json records the process writing the folder (pid, host); a what-if rung may be `interrupted`;
#      RunSettings.fill_batches, Verdict.judged, the comparisons' config_differences (all with defaults).
#      Also in 1.2 (a default only, so the version stays): ModelInfo.family, the model family as its adapter
#      describes it (None in older folders, whose family the reports probe from the preprocessing keys).
# 1.3: Stage1Metrics.memory and .energy (the memory and energy passes; None in older folders).
# 1.4: Stage1Metrics.pages (pages/s, per-page latency, the time per page); Throughput.e2e_images_per_s counts the
#      inputs a forward finishes (a batch's all), not 1 / the median per-input latency.
SCHEMA_VERSION = "1.4"
SCHEMA_MAJOR = SCHEMA_VERSION.split(".", 1)[0]

# Run states (`run_status.json`): `running` from the start, then exactly one of the other three.
RUNNING = "running"
COMPLETE = "complete"
FAILED = "failed"
INTERRUPTED = "interrupted"


@attrs.frozen
class Summary:
    """Summary of ``n`` measurements in ``unit``."""

    n: int
    mean: float
    std: float  # sample standard deviation (ddof=1); 0.0 when n == 1
    min: float
    p50: float
    p90: float
    max: float
    cv: float | None  # std / |mean|; None when mean == 0 or n < 2
    ci95_low: float | None  # 95% confidence interval (`ci_method` says of what); None when n < 3
    ci95_high: float | None
    unit: str
    ci_method: str | None = None  # how the interval was computed (measure.stats.CI_*); None when there is none


@attrs.frozen
class PeakFigure:
    """A peak rate and where it comes from."""

    value: float  # FLOP/s (for compute) or B/s (for bandwidth), in base units
    unit: str  # "FLOP/s" or "B/s"
    dtype_key: str | None  # "bf16", "tf32", ...; None for bandwidth
    source: str  # "datasheet: NVIDIA H100 SXM5, dense BF16 tensor core (https://...)" or "user override: ..."
    device_name: str


@attrs.frozen
class RunStatus:
    """`run_status.json`: the state of a run folder and the files it wrote."""

    stage: str  # "stage1" | "stage2" | "analytic"
    run_id: str
    state: str  # RUNNING | COMPLETE | FAILED | INTERRUPTED
    started: str
    ended: str | None = None
    message: str | None = None
    files: tuple[str, ...] = ()
    # The process that writes the folder (schema 1.2; None in older folders), so a reader can tell a `running`
    # folder whose process is gone (`records.folders.writer_state`).
    pid: int | None = None
    host: str | None = None

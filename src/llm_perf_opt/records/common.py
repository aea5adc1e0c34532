"""Records shared by every kind of run folder: dispersion summaries, peak figures, the run status."""

from __future__ import annotations

import enum

import attrs

# The version of every record file the toolkit writes; a reader accepts any minor version of its major.
# 1.2: run_status.json records the process writing the folder (pid, host); a what-if rung may be `interrupted`;
#      RunSettings.fill_batches, Verdict.judged, the comparisons' config_differences (all with defaults).
#      Also in 1.2 (a default only, so the version stays): ModelInfo.family, the model family as its adapter
#      describes it (None in older folders, whose family the reports probe from the preprocessing keys).
# 1.3: Stage1Metrics.memory and .energy (the memory and energy passes; None in older folders).
#      Also in 1.3 (a default only): the time budget of Stage1Metrics, Stage2Metrics and WhatIfRecord.
# 1.4: Stage1Metrics.pages (pages/s, per-page latency, the time per page); Throughput.e2e_images_per_s counts the
#      inputs a forward finishes (a batch's all), not 1 / the median per-input latency.
#      Also in 1.4 (defaults only): WhatIfRecord.latency_target and .goodput, RungFigures' per-page p90 latencies,
#      Stage1Comparison.throughput (pages/s per run); WhatIfRecord.advised_from and .predictions, Lever.advice
#      (`perf-whatif whatif=advised`); RuntimeRecord.quantize and ModelInfo.quantized (`runtime.quantize`);
#      Stage1Metrics.first_passes (each input's first warm-up pass); WhatIfRecord.ladder (whatif_run.ladder).
SCHEMA_VERSION = "1.4"
SCHEMA_MAJOR = SCHEMA_VERSION.split(".", 1)[0]


class InconsistentRecord(ValueError):
    """A record whose fields contradict each other (an attrs validator's error; a loader names the file)."""


class RunState(enum.StrEnum):
    """A run folder's state (`run_status.json`): `running` from the start, then exactly one of the other three.
    A str, so the JSON holds the same words and older folders load."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


RUNNING = RunState.RUNNING
COMPLETE = RunState.COMPLETE
FAILED = RunState.FAILED
INTERRUPTED = RunState.INTERRUPTED


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
    state: RunState
    started: str
    ended: str | None = None
    message: str | None = None
    files: tuple[str, ...] = ()
    # The process that writes the folder (schema 1.2; None in older folders), so a reader can tell a `running`
    # folder whose process is gone (`records.folders.writer_state`).
    pid: int | None = None
    host: str | None = None


OTHER_PART = "other"  # the time no named part took (between the steps), so the parts add up to the total


@attrs.frozen
class TimePart:
    """One part of a command's wall time."""

    name: str  # "start", "build", "passes", ..., "other"
    seconds: float


@attrs.frozen
class TimeBudget:
    """Where a command's wall time went, from its process's start: named parts (`start`: the process's start to
    the pipeline's first step, the imports a user waits for; `other`: the remainder) that add up to `total_s`."""

    total_s: float
    parts: tuple[TimePart, ...] = ()
    note: str | None = None  # what the parts do not say (perf-whatif: how many rungs, their mean time)

    @property
    def line(self) -> str:
        """ "took 38 s: start 3, build 1, passes 24, ..." in whole seconds (tenths under 10 s), the shown parts
        rounded so that they add up to the shown total; parts that round to nothing are left out."""
        unit = 1.0 if self.total_s >= 10 else 0.1
        shown = _rounded_to_total([p.seconds for p in self.parts], self.total_s, unit)
        decimals = 0 if unit == 1.0 else 1
        text = ", ".join(f"{p.name} {n * unit:.{decimals}f}" for p, n in zip(self.parts, shown, strict=True) if n)
        total = round(self.total_s / unit)
        line = f"took {total * unit:,.{decimals}f} s" + (f": {text}" if text else "")
        return line + (f"; {self.note}" if self.note else "")


def _rounded_to_total(values: list[float], total: float, unit: float) -> list[int]:
    """`values` in whole `unit`s adding up to `total` in whole units (largest remainder first)."""
    target = round(total / unit)
    scaled = [max(0.0, v / unit) for v in values]
    whole = [int(s) for s in scaled]
    by_remainder = sorted(range(len(scaled)), key=lambda i: scaled[i] - whole[i], reverse=True)
    for i in by_remainder[: max(0, target - sum(whole))]:
        whole[i] += 1
    return whole

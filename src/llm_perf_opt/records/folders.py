"""A run folder read back as typed records: `load(run_dir)` for any folder the toolkit writes.

Every command that reads another command's output (Stage 2 reading its Stage 1 workload, `stage2-report`,
`perf-compare`, the sweep summary, the what-if runner) goes through here; nothing else parses run artifacts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import attrs

from llm_perf_opt.records.common import COMPLETE, RUNNING, RunStatus
from llm_perf_opt.records.io import (
    RecordError,
    check_schema,
    load_file,
    load_lines,
    read_json,
    read_yaml,
    structure,
)
from llm_perf_opt.records.stage1 import InputsManifest, OperatorTable, Prediction, Stage1Metrics
from llm_perf_opt.records.stage2 import Capture, NcuTargets, Stage2Metrics
from llm_perf_opt.records.whatif import WhatIfRecord

T = TypeVar("T")
log = logging.getLogger("llm_perf_opt.records")

STATUS_FILE = "run_status.json"
METRICS_FILE = "metrics.json"
ENV_FILE = "env.json"
CONFIG_FILE = "config.yaml"  # the resolved configuration the command ran with (Hydra's section left out)
INPUTS_FILE = "inputs.yaml"
OPERATORS_FILE = "operators.json"
PREDICTIONS_FILE = "predictions/predictions.jsonl"
PREFILL_LOGITS_FILE = "prefill_logits.pt"  # run.save_prefill_logits: last-prompt-position logits per input
TOP2_LOGITS_FILE = "top2_logits.json"  # run.save_top2_logits: the top two logits behind each token, per input
# The reports of a Stage 1 or Stage 2 folder (a what-if rung's among them): the main one and the short summary.
REPORT_FILE = "report.md"
STAKEHOLDER_FILE = "stakeholder_summary.md"
# Stage 2 folders: the capture's record, Nsight Compute's targets, the Stage 1 metrics of the workload nsys profiled.
CAPTURE_FILE = "capture.json"
NCU_TARGETS_FILE = "ncu/targets.json"
WORKLOAD_METRICS_FILE = "workload/nsys/metrics.json"
# `perf-whatif` folders: the record of the whole run (its rungs are Stage 1 folders inside it).
WHATIF_FILE = "whatif.json"
# A Hydra multirun of `stage1-run`: its summary beside the job folders.
SWEEP_SUMMARY_FILE = "sweep_summary.json"
# Files that make a folder a run folder: everything at or below it belongs to that run (a comparison's own
# `compare.json` is not one of them, so a folder of comparisons stays free to rewrite).
RUN_MARKERS = (STATUS_FILE, METRICS_FILE, WHATIF_FILE, SWEEP_SUMMARY_FILE)


def read_status(run_dir: Path) -> RunStatus:
    """The status of a run folder (RecordError when it has none or it is damaged)."""
    return load_file(Path(run_dir) / STATUS_FILE, RunStatus, versioned=False)


# Whether the process that wrote a folder's `running` status still runs (`writer_state`).
ALIVE = "alive"
GONE = "gone"
UNKNOWN = "unknown"  # written on another host, or by a version that did not record its process


def this_host() -> str:
    """The host name a run folder records (`RunStatus.host`)."""
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether a process with id `pid` runs on this host (one of another user counts; a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether `pid` has ended but not been reaped by its parent (Linux /proc; False where it cannot be told)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] == "Z"


def writer_state(status: RunStatus) -> str:
    """Whether the process that wrote `status` still runs: ALIVE or GONE when it ran on this host, UNKNOWN when it
    ran on another host or the status does not record it."""
    if status.pid is None or status.host is None or status.host != this_host():
        return UNKNOWN
    return ALIVE if pid_alive(status.pid) else GONE


def writer_note(status: RunStatus) -> str:
    """What a reader can say of the process behind a folder whose status reads `running`."""
    who = f"pid {status.pid} on host {status.host}"
    state = writer_state(status)
    if state == GONE:
        return f"the process that wrote it ({who}) is gone: it was killed before it could record its end"
    if state == ALIVE:
        return f"the process writing it ({who}) is still running"
    if status.pid is None or status.host is None:
        return "it does not record its process (an older folder), so whether that process still runs cannot be told"
    return f"it was written by {who}, so from host {this_host()} it cannot be told whether that process still runs"


def status_detail(status: RunStatus) -> str | None:
    """What a reader adds to a folder's state: for `running`, what became of its process; else its message."""
    return writer_note(status) if status.state == RUNNING else status.message


def unfinished_text(status: RunStatus) -> str | None:
    """For a report rebuilt from a folder whose status still reads `running`: that, and what became of its
    process; None for a run that recorded its end."""
    return None if status.state != RUNNING else f"its run_status.json still reads running; {writer_note(status)}"


def read_env(run_dir: Path) -> dict[str, object]:
    """`env.json` (machine and software versions) as data; empty when the folder has none."""
    return _read_mapping(Path(run_dir) / ENV_FILE, read_json)


def env_gpu(env: Mapping[str, object]) -> Mapping[str, object]:
    """The GPU section of `env.json`'s data (empty when it has none: a CPU run)."""
    gpu = env.get("gpu")
    return gpu if isinstance(gpu, Mapping) else {}


def recorded_driver(run_dir: Path) -> str | None:
    """The GPU driver `env.json` names (None: no env.json, a CPU run or no driver recorded)."""
    driver = env_gpu(read_env(run_dir)).get("driver")
    return None if driver is None else str(driver)


def read_config(run_dir: Path) -> dict[str, object]:
    """`config.yaml` (the resolved configuration) as data; empty when the folder has none."""
    return _read_mapping(Path(run_dir) / CONFIG_FILE, read_yaml)


def _read_mapping(path: Path, read: Callable[[Path], object]) -> dict[str, object]:
    """The mapping a file holds, read by `read`; empty when the file is missing or holds no mapping."""
    if not path.is_file():
        return {}
    data = read(path)
    return dict(data) if isinstance(data, dict) else {}


@attrs.frozen
class Stage1Folder:
    """A `stage1-run` folder: its metrics and, where written, its inputs, operators, predictions and config."""

    path: Path
    status: RunStatus
    metrics: Stage1Metrics
    env: dict[str, object]
    inputs: InputsManifest | None
    operators: OperatorTable | None
    predictions: tuple[Prediction, ...]
    config: dict[str, object] = attrs.field(factory=dict)  # config.yaml; empty when the folder has none

    kind = "stage1"


def load_stage1_metrics(path: Path) -> Stage1Metrics:
    """`metrics.json` of a Stage 1 run, wherever it lies (e.g. a Stage 2 folder's workload)."""
    return load_metrics_of(path, Stage1Metrics, "stage1", "stage1-run")


def _optional(path: Path, loader: Callable[[Path], T]) -> T | None:
    return loader(path) if path.is_file() else None


def require_folder(run_dir: Path) -> Path:
    """`run_dir` as a Path, or a RecordError when it is not a folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordError(
            f"{run_dir} is not a folder", "Pass the folder of a run (the last line a command prints names its report)"
        )
    return run_dir


def require_metrics(run_dir: Path, writer: str) -> None:
    """RecordError when `run_dir` holds no metrics.json, saying what its run_status.json tells of the run (for one
    still marked `running`: whether the process that wrote it is gone)."""
    if (Path(run_dir) / METRICS_FILE).is_file():
        return
    problem = f"{run_dir} has no metrics.json, so it is not a finished {writer} folder"
    with contextlib.suppress(RecordError):  # no status (or a damaged one) to tell of
        status = read_status(run_dir)
        detail = status_detail(status)
        problem += f"; its run_status.json reads {status.state}" + (f": {detail}" if detail else "")
    raise RecordError(problem, "Pass the folder of a finished run (the last line a command prints names it)")


def load_stage1(run_dir: Path) -> Stage1Folder:
    run_dir = require_folder(run_dir)
    require_metrics(run_dir, "stage1-run")
    return Stage1Folder(
        path=run_dir,
        status=read_status(run_dir),
        metrics=load_stage1_metrics(run_dir / METRICS_FILE),
        env=read_env(run_dir),
        inputs=_optional(run_dir / INPUTS_FILE, lambda p: load_file(p, InputsManifest, versioned=False)),
        operators=_optional(run_dir / OPERATORS_FILE, lambda p: load_file(p, OperatorTable, versioned=False)),
        predictions=_optional(run_dir / PREDICTIONS_FILE, lambda p: load_lines(p, Prediction)) or (),
        config=read_config(run_dir),
    )


@attrs.frozen
class Stage2Folder:
    """A `stage2-profile` folder: its metrics and, where present, its capture, ncu targets and workload metrics."""

    path: Path
    status: RunStatus
    metrics: Stage2Metrics
    env: dict[str, object]
    capture: Capture | None
    targets: NcuTargets | None
    workload: Stage1Metrics | None
    config: dict[str, object] = attrs.field(factory=dict)  # config.yaml; empty when the folder has none

    kind = "stage2"


RunFolder = Stage1Folder | Stage2Folder  # what `load` reads, by the `stage` of its metrics.json


def load_metrics_of(path: Path, cls: type[T], stage: str, writer: str) -> T:
    """The `metrics.json` at `path` as a `cls` record, refusing one of another schema major version or one that
    another command (`stage` other than this one) wrote, before its fields are read."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, Mapping):
        raise RecordError(f"{path} does not hold a JSON object", f"Rerun {writer} to write it again")
    check_schema(data, path)
    if data.get("stage") != stage:
        raise RecordError(
            f"{path} holds a {data.get('stage')} record, not a {stage} one",
            f"Point the command at a folder written by {writer}",
        )
    return structure(data, cls, path)


def load_stage2_metrics(path: Path) -> Stage2Metrics:
    """`metrics.json` of a Stage 2 run."""
    return load_metrics_of(path, Stage2Metrics, "stage2", "stage2-profile")


def load_capture(run_dir: Path) -> Capture:
    """`capture.json` of a Stage 2 folder (RecordError when it has none or it is damaged)."""
    return load_file(Path(run_dir) / CAPTURE_FILE, Capture, versioned=False)


def load_ncu_targets(run_dir: Path) -> NcuTargets | None:
    """`ncu/targets.json` of a Stage 2 folder; None when Nsight Compute did not run."""
    return _optional(Path(run_dir) / NCU_TARGETS_FILE, lambda p: load_file(p, NcuTargets, versioned=False))


def load_workload_metrics(run_dir: Path) -> Stage1Metrics | None:
    """The Stage 1 metrics of the workload a Stage 2 folder profiled under nsys; None when it wrote none."""
    return _optional(Path(run_dir) / WORKLOAD_METRICS_FILE, load_stage1_metrics)


def load_stage2(run_dir: Path) -> Stage2Folder:
    run_dir = require_folder(run_dir)
    require_metrics(run_dir, "stage2-profile")
    return Stage2Folder(
        path=run_dir,
        status=read_status(run_dir),
        metrics=load_stage2_metrics(run_dir / METRICS_FILE),
        env=read_env(run_dir),
        capture=load_capture(run_dir) if (run_dir / CAPTURE_FILE).is_file() else None,
        targets=load_ncu_targets(run_dir),
        workload=load_workload_metrics(run_dir),
        config=read_config(run_dir),
    )


def load_whatif(path: Path) -> WhatIfRecord:
    """The `whatif.json` of a `perf-whatif` folder (`path` is the folder or the file itself); RecordError when it
    is missing, damaged, of another schema major version, or another command's record."""
    path = Path(path)
    file = path / WHATIF_FILE if path.is_dir() else path
    if not file.is_file():
        raise RecordError(
            f"{path} holds no {WHATIF_FILE}, so it is not a finished perf-whatif folder",
            "Pass the folder perf-whatif printed at its end (the one holding whatif.json and whatif.md)",
        )
    return load_metrics_of(file, WhatIfRecord, "whatif", "perf-whatif")


def enclosing_whatif(run_dir: Path) -> Path | None:
    """The `perf-whatif` folder a run folder was written in (its parent or grandparent holds `whatif.json`)."""
    here = Path(run_dir).resolve()
    return next((p for p in (here.parent, here.parent.parent) if (p / WHATIF_FILE).is_file()), None)


def enclosing_run_folder(path: Path) -> Path | None:
    """The run folder a file at `path` lies in: the nearest folder above it that holds one of RUN_MARKERS; None
    when there is none."""
    return next((p for p in Path(path).resolve().parents if any((p / m).is_file() for m in RUN_MARKERS)), None)


def whatif_for(run_dir: Path, given: Path | str | None = None) -> WhatIfRecord | None:
    """The what-if record a run folder's reports cite: `given` (a perf-whatif folder or its whatif.json; a
    RecordError when it cannot be read), else that of the what-if folder the run folder was written in (left out
    with a warning when it cannot be read); None when neither."""
    if given is not None and str(given).strip():
        chosen = Path(str(given)).expanduser()
        record = load_whatif(chosen)
        _warn_if_abandoned(chosen if chosen.is_dir() else chosen.parent)
        return record
    found = enclosing_whatif(run_dir)
    if found is None:
        return None
    try:
        record = load_whatif(found)
    except RecordError as exc:
        log.warning("the reports do not cite the enclosing what-if run: %s", exc.problem)
        return None
    _warn_if_abandoned(found)
    return record


def _warn_if_abandoned(whatif_dir: Path) -> None:
    """A warning when a cited what-if folder still reads `running` but its process is not known to run: its record
    holds only the rungs measured before it stopped."""
    try:
        status = read_status(whatif_dir)
    except RecordError:
        return
    if status.state == RUNNING and writer_state(status) != ALIVE:
        log.warning(
            "the what-if run in %s did not record its end (%s); the reports cite the rungs it measured before",
            whatif_dir,
            writer_note(status),
        )


def load(run_dir: Path) -> RunFolder:
    """The run folder `run_dir` as typed records (a Stage1Folder or Stage2Folder, by the `stage` its metrics.json
    names)."""
    path = Path(run_dir) / METRICS_FILE
    if not Path(run_dir).is_dir():
        raise RecordError(f"{run_dir} is not a folder", "Pass the folder of a finished run")
    require_metrics(run_dir, "stage1-run or stage2-profile")
    data = read_json(path)
    if not isinstance(data, dict):
        raise RecordError(f"{path} does not hold a JSON object", "Rerun the command that wrote the folder")
    kind = str(data.get("stage"))
    loader = LOADERS.get(kind)
    if loader is None:
        raise RecordError(
            f"{path} is for stage {kind!r}, which this version cannot read",
            f"Pass a folder of one of: {', '.join(LOADERS)}",
        )
    return loader(Path(run_dir))


def skip_reason(error: RecordError, folder: Path) -> str:
    """Why a folder is left out of a comparison or summary: the record error, its files named relative to it."""
    return error.problem.replace(f"{folder}{os.sep}", "")


def is_complete(folder: RunFolder) -> bool:
    return bool(folder.status.state == COMPLETE)


# Which loader reads which `stage` of metrics.json. A new kind of run folder adds its loader here.
LOADERS: dict[str, Callable[[Path], RunFolder]] = {"stage1": load_stage1, "stage2": load_stage2}

"""A run folder read back as typed records: `load(run_dir)` for any folder the toolkit writes.

Every command that reads another command's output (Stage 2 reading its Stage 1 workload, `stage2-report`,
`perf-compare`, the sweep summary, the what-if runner) goes through here; nothing else parses run artifacts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from llm_perf_opt.records.common import COMPLETE, RunStatus
from llm_perf_opt.records.io import RecordError, check_schema, load_file, load_lines, read_json, structure
from llm_perf_opt.records.stage1 import InputsManifest, OperatorTable, Prediction, Stage1Metrics
from llm_perf_opt.records.stage2 import Capture, NcuTargets, Stage2Metrics
from llm_perf_opt.records.whatif import WhatIfRecord

T = TypeVar("T")
log = logging.getLogger("llm_perf_opt.records")

STATUS_FILE = "run_status.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"  # the composed config a run writes (resolved)
ENV_FILE = "env.json"
INPUTS_FILE = "inputs.yaml"
OPERATORS_FILE = "operators.json"
PREDICTIONS_FILE = "predictions/predictions.jsonl"
PREFILL_LOGITS_FILE = "prefill_logits.pt"  # run.save_prefill_logits: last-prompt-position logits per input
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


def read_env(run_dir: Path) -> dict[str, Any]:
    """`env.json` (machine and software versions) as data; empty when the folder has none."""
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        return {}
    data = read_json(path)
    return dict(data) if isinstance(data, dict) else {}


@attrs.frozen
class Stage1Folder:
    """A `stage1-run` folder: its metrics and, where written, its inputs, operators and predictions."""

    path: Path
    status: RunStatus
    metrics: Stage1Metrics
    env: dict[str, Any]
    inputs: InputsManifest | None
    operators: OperatorTable | None
    predictions: tuple[Prediction, ...]

    kind = "stage1"


def load_stage1_metrics(path: Path) -> Stage1Metrics:
    """`metrics.json` of a Stage 1 run, wherever it lies (e.g. a Stage 2 folder's workload)."""
    return load_metrics_of(path, Stage1Metrics, "stage1", "stage1-run")


def _optional(path: Path, loader: Any) -> Any:
    return loader(path) if path.is_file() else None


def require_folder(run_dir: Path) -> Path:
    """`run_dir` as a Path, or a RecordError when it is not a folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordError(
            f"{run_dir} is not a folder", "Pass the folder of a run (the last line a command prints names its report)"
        )
    return run_dir


def load_stage1(run_dir: Path) -> Stage1Folder:
    run_dir = require_folder(run_dir)
    predictions = run_dir / PREDICTIONS_FILE
    return Stage1Folder(
        path=run_dir,
        status=read_status(run_dir),
        metrics=load_stage1_metrics(run_dir / METRICS_FILE),
        env=read_env(run_dir),
        inputs=_optional(run_dir / INPUTS_FILE, lambda p: load_file(p, InputsManifest, versioned=False)),
        operators=_optional(run_dir / OPERATORS_FILE, lambda p: load_file(p, OperatorTable, versioned=False)),
        predictions=load_lines(predictions, Prediction) if predictions.is_file() else (),
    )


@attrs.frozen
class Stage2Folder:
    """A `stage2-profile` folder: its metrics and, where present, its capture, ncu targets and workload metrics."""

    path: Path
    status: RunStatus
    metrics: Stage2Metrics
    env: dict[str, Any]
    capture: Capture | None
    targets: NcuTargets | None
    workload: Stage1Metrics | None

    kind = "stage2"


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
    run_dir = Path(run_dir)
    return Stage2Folder(
        path=run_dir,
        status=read_status(run_dir),
        metrics=load_stage2_metrics(run_dir / METRICS_FILE),
        env=read_env(run_dir),
        capture=load_capture(run_dir) if (run_dir / CAPTURE_FILE).is_file() else None,
        targets=load_ncu_targets(run_dir),
        workload=load_workload_metrics(run_dir),
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
        return load_whatif(Path(str(given)).expanduser())
    found = enclosing_whatif(run_dir)
    if found is None:
        return None
    try:
        return load_whatif(found)
    except RecordError as exc:
        log.warning("the reports do not cite the enclosing what-if run: %s", exc.problem)
        return None


def metrics_kind(run_dir: Path) -> str:
    """The `stage` a folder's metrics.json names ("stage1", "stage2"), or a RecordError."""
    path = Path(run_dir) / METRICS_FILE
    if not Path(run_dir).is_dir():
        raise RecordError(f"{run_dir} is not a folder", "Pass the folder of a finished run")
    if not path.is_file():
        raise RecordError(
            f"{run_dir} has no metrics.json, so it is not a finished stage1-run or stage2-profile folder",
            "Pass the folder of a finished run (the last line a command prints names it)",
        )
    data = read_json(path)
    if not isinstance(data, dict):
        raise RecordError(f"{path} does not hold a JSON object", "Rerun the command that wrote the folder")
    return str(data.get("stage"))


def load(run_dir: Path) -> Any:
    """The run folder `run_dir` as typed records (a Stage1Folder or Stage2Folder)."""
    kind = metrics_kind(run_dir)
    loader = LOADERS.get(kind)
    if loader is None:
        raise RecordError(
            f"{Path(run_dir) / METRICS_FILE} is for stage {kind!r}, which this version cannot read",
            f"Pass a folder of one of: {', '.join(LOADERS)}",
        )
    return loader(Path(run_dir))


def skip_reason(error: RecordError, folder: Path) -> str:
    """Why a folder is left out of a comparison or summary: the record error, its files named relative to it."""
    return error.problem.replace(f"{folder}{os.sep}", "")


def is_complete(folder: Any) -> bool:
    return bool(folder.status.state == COMPLETE)


# Which loader reads which `stage` of metrics.json. A new kind of run folder adds its loader here.
LOADERS: dict[str, Any] = {"stage1": load_stage1, "stage2": load_stage2}

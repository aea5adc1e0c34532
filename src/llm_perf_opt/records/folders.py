"""A run folder read back as typed records: `load(run_dir)` for any folder the toolkit writes.

Every command that reads another command's output (Stage 2 reading its Stage 1 workload, `stage2-report`,
`perf-compare`, the sweep summary, the what-if runner) goes through here; nothing else parses run artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.records.common import COMPLETE, RunStatus
from llm_perf_opt.records.io import RecordError, load_file, load_lines, read_json
from llm_perf_opt.records.stage1 import InputsManifest, OperatorTable, Prediction, Stage1Metrics

STATUS_FILE = "run_status.json"
METRICS_FILE = "metrics.json"
ENV_FILE = "env.json"
INPUTS_FILE = "inputs.yaml"
OPERATORS_FILE = "operators.json"
PREDICTIONS_FILE = "predictions/predictions.jsonl"


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
    metrics = load_file(path, Stage1Metrics)
    if metrics.stage != "stage1":
        raise RecordError(
            f"{path} holds a {metrics.stage} record, not a Stage 1 one",
            "Point the command at a folder written by stage1-run",
        )
    return metrics


def _optional(path: Path, loader: Any) -> Any:
    return loader(path) if path.is_file() else None


def load_stage1(run_dir: Path) -> Stage1Folder:
    run_dir = Path(run_dir)
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


def is_complete(folder: Any) -> bool:
    return bool(folder.status.state == COMPLETE)


# Which loader reads which `stage` of metrics.json. A new kind of run folder adds its loader here.
LOADERS: dict[str, Any] = {"stage1": load_stage1}

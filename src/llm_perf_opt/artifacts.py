"""One artifacts manager for every run folder: atomic writes and a run status that is never left looking complete.

`run_status.json` holds the state: `running` from the start, then exactly one of `complete`, `failed` (with the
message) or `interrupted`. A folder whose status still reads `running` after its process ended was killed hard.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cattrs
import yaml

RUNNING = "running"
COMPLETE = "complete"
FAILED = "failed"
INTERRUPTED = "interrupted"
STATUS_FILE = "run_status.json"

_converter = cattrs.Converter()
_converter.register_unstructure_hook(Path, str)


def to_plain(obj: Any) -> Any:
    """attrs objects (and containers of them) as plain JSON/YAML-ready data."""
    return _converter.unstructure(obj)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ArtifactsManager:
    """Writes the files of one run folder and keeps its status."""

    def __init__(self, run_dir: Path, *, stage: str) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.stage = stage
        self.written: list[str] = []

    # ---- status ------------------------------------------------------------------------------------
    def start(self, run_id: str) -> None:
        """Mark the folder running. Refuses a folder that already holds a run."""
        status = self.run_dir / STATUS_FILE
        if status.exists():
            previous = json.loads(status.read_text()).get("state", "?")
            from llm_perf_opt.errors import UserError

            raise UserError(
                f"the run folder {self.run_dir} already holds a {previous} run",
                "Leave hydra.run.dir unset for a fresh folder, or point it at an empty one",
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._status: dict[str, Any] = {"stage": self.stage, "run_id": run_id, "state": RUNNING, "started": _now()}
        self._write_status()

    def finish(self, state: str, message: str | None = None) -> None:
        """Set the final state (complete, failed or interrupted) with an optional message."""
        self._status.update(state=state, ended=_now(), message=message, files=sorted(self.written))
        self._write_status()

    @property
    def state(self) -> str:
        return str(self._status["state"])

    def _write_status(self) -> None:
        self._atomic_write(self.run_dir / STATUS_FILE, json.dumps(self._status, indent=2) + "\n")

    # ---- files -------------------------------------------------------------------------------------
    def path(self, relative: str) -> Path:
        """Absolute path of a file in the run folder (parents created)."""
        target = self.run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_text(self, relative: str, text: str) -> Path:
        target = self.path(relative)
        self._atomic_write(target, text)
        self.written.append(relative)
        return target

    def write_json(self, relative: str, data: Any) -> Path:
        return self.write_text(relative, json.dumps(to_plain(data), indent=2, allow_nan=False) + "\n")

    def write_yaml(self, relative: str, data: Any) -> Path:
        return self.write_text(relative, yaml.safe_dump(to_plain(data), sort_keys=False, allow_unicode=True))

    def record(self, relative: str) -> None:
        """Note a file written by someone else (e.g. a trace) as part of the run."""
        self.written.append(relative)

    @staticmethod
    def _atomic_write(target: Path, text: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; run folders are meant to be shared
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_status(run_dir: Path) -> dict[str, Any]:
    """The status of a run folder (raises FileNotFoundError when it has none)."""
    return dict(json.loads((Path(run_dir) / STATUS_FILE).read_text()))

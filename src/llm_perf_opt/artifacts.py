"""One artifacts manager for every run folder: atomic writes and a run status that is never left looking complete.

`run_status.json` holds the state: `running` from the start, then exactly one of `complete`, `failed` (with the
message) or `interrupted`. A folder whose status still reads `running` after its process ended was killed hard.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.records import io
from llm_perf_opt.records.common import COMPLETE, FAILED, INTERRUPTED, RUNNING, RunStatus
from llm_perf_opt.records.folders import STATUS_FILE, read_status
from llm_perf_opt.records.io import to_plain  # noqa: F401  (Stage 2 still imports it from here)

__all__ = ["COMPLETE", "FAILED", "INTERRUPTED", "RUNNING", "STATUS_FILE", "ArtifactsManager", "read_status"]


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
        if (self.run_dir / STATUS_FILE).exists():
            previous = read_status(self.run_dir).state
            from llm_perf_opt.errors import UserError

            raise UserError(
                f"the run folder {self.run_dir} already holds a {previous} run",
                "Leave hydra.run.dir unset for a fresh folder, or point it at an empty one",
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._status = RunStatus(stage=self.stage, run_id=run_id, state=RUNNING, started=_now())
        self._write_status()

    def finish(self, state: str, message: str | None = None) -> None:
        """Set the final state (complete, failed or interrupted) with an optional message."""
        self._status = attrs.evolve(
            self._status, state=state, ended=_now(), message=message, files=tuple(sorted(self.written))
        )
        self._write_status()

    @property
    def state(self) -> str:
        return self._status.state

    def _write_status(self) -> None:
        io.atomic_write_text(self.run_dir / STATUS_FILE, io.dumps(self._status))

    # ---- files -------------------------------------------------------------------------------------
    def path(self, relative: str) -> Path:
        """Absolute path of a file in the run folder (parents created)."""
        target = self.run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def resolve_save_dir(self, save_dir: str) -> Path:
        """`save_dir` relative to the run folder; absolute paths are honoured."""
        path = Path(str(save_dir)).expanduser()
        return path if path.is_absolute() else self.run_dir / path

    def write_text(self, relative: str, text: str) -> Path:
        target = self.path(relative)
        io.atomic_write_text(target, text)
        self.written.append(relative)
        return target

    def write_anywhere(self, target: Path, text: str) -> Path:
        """Write `text` to `target`: inside the run folder as one of its files, outside it (an absolute save_dir)
        as a plain file."""
        try:
            relative = target.resolve().relative_to(self.run_dir)
        except ValueError:
            target.parent.mkdir(parents=True, exist_ok=True)
            io.atomic_write_text(target, text)
            return target
        return self.write_text(str(relative), text)

    def write_json(self, relative: str, data: Any) -> Path:
        """A record (or plain data) as JSON."""
        return self.write_text(relative, io.dumps(data))

    def write_yaml(self, relative: str, data: Any) -> Path:
        return self.write_text(relative, io.dumps_yaml(data))

    def record(self, relative: str) -> None:
        """Note a file written by someone else (e.g. a trace) as part of the run."""
        self.written.append(relative)

"""One artifacts manager for every run folder: atomic writes and a run status that is never left looking complete.

`run_status.json` holds the state: `running` from the start, then exactly one of `complete`, `failed` (with the
message) or `interrupted`. A folder whose status still reads `running` after its process ended was killed hard.
A file that cannot be written (full disk, read-only folder) raises :class:`OutputWriteError`; the status itself
falls back to an in-place rewrite, which still succeeds on a full disk, so a folder is marked failed whenever it
can be written at all (:func:`mark_failed` is the last resort of the entry points).
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cattrs
import yaml

from llm_perf_opt.errors import UserError

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


#: errno values of a file that cannot be written for want of room or a writable file system.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
_NO_ACCESS = frozenset({errno.EACCES, errno.EPERM})


class OutputWriteError(UserError):
    """A run's file could not be written: full disk, quota, a read-only or unwritable folder."""

    def __init__(self, path: Path | str, exc: OSError) -> None:
        self.path = Path(path)
        reason = exc.strerror or str(exc) or type(exc).__name__
        super().__init__(
            f"could not write {self.path}: {reason}",
            "Free disk space or make that folder writable, or point hydra.run.dir (and any absolute save_dir) at a "
            "writable folder with room",
        )


def environment_error(exc: OSError) -> UserError | None:
    """An OSError that no file of the run's own writers caught, as a UserError when it is the environment's fault
    (full disk, quota, read-only file system, permissions); None when it looks like a bug."""
    where = exc.filename or "a file"
    if exc.errno in _NO_ROOM:
        return OutputWriteError(where, exc)
    if exc.errno in _NO_ACCESS:
        return UserError(
            f"{where}: {exc.strerror or exc}",
            "Make that file or folder accessible to this user, or point hydra.run.dir (and any absolute save_dir) at "
            "a folder you can write",
        )
    return None


class DamagedStatusError(UserError):
    """`run_status.json` exists but does not hold a run status."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            f"{path} is damaged ({detail})",
            "Treat that folder's results as unreliable; run again into a fresh folder (leave hydra.run.dir unset)",
        )


class ArtifactsManager:
    """Writes the files of one run folder and keeps its status."""

    def __init__(self, run_dir: Path, *, stage: str) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.stage = stage
        self.written: list[str] = []

    # ---- status ------------------------------------------------------------------------------------
    def start(self, run_id: str) -> None:
        """Mark the folder running. Refuses a folder that already holds a run."""
        refuse_reuse(self.run_dir)
        _mkdir(self.run_dir)
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
        _write_status_file(self.run_dir, self._status)

    # ---- files -------------------------------------------------------------------------------------
    def path(self, relative: str) -> Path:
        """Absolute path of a file in the run folder (parents created)."""
        target = self.run_dir / relative
        _mkdir(target.parent)
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
        _atomic_write(target, text)


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputWriteError(folder, exc) from exc


def _atomic_write(target: Path, text: str) -> None:
    """Write `text` to `target` through a temporary file and a rename; OSError -> OutputWriteError."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputWriteError(target, exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run folders are meant to be shared
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputWriteError(target, exc) from exc
        raise


def _write_status_file(run_dir: Path, status: dict[str, Any]) -> None:
    """Atomically where possible; else rewritten in place, which reuses the file's blocks (works on a full disk)."""
    target = Path(run_dir) / STATUS_FILE
    text = json.dumps(status, indent=2) + "\n"
    try:
        _atomic_write(target, text)
    except OutputWriteError:
        if not target.is_file():
            raise
        try:
            with target.open("r+", encoding="utf-8") as handle:
                handle.write(text)
                handle.truncate()
        except OSError as exc:
            raise OutputWriteError(target, exc) from exc


def read_status(run_dir: Path) -> dict[str, Any]:
    """The status of a run folder: FileNotFoundError when it has none, DamagedStatusError when it is unreadable."""
    path = Path(run_dir) / STATUS_FILE
    text = path.read_text(encoding="utf-8", errors="replace")  # FileNotFoundError propagates
    try:
        status = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DamagedStatusError(path, f"not JSON: {exc}") from exc
    if not isinstance(status, dict) or not isinstance(status.get("state"), str):
        raise DamagedStatusError(path, "no JSON object with a `state`")
    return status


def refuse_reuse(run_dir: Path) -> None:
    """UserError when `run_dir` already holds a run (a `run_status.json`, readable or not)."""
    path = Path(run_dir) / STATUS_FILE
    if not path.exists():
        return
    try:
        previous = read_status(run_dir)["state"]
    except (OSError, DamagedStatusError):
        previous = "damaged"
    raise UserError(
        f"the run folder {Path(run_dir).resolve()} already holds a {previous} run; it was left untouched",
        "Leave hydra.run.dir unset for a fresh folder, or point it at an empty one",
    )


def mark_failed(run_dir: Path, message: str) -> bool:
    """Mark a folder whose status still reads `running` as failed with `message`; True when it was marked.

    The entry points call this when a run ends with an error the run itself could not record (e.g. a second
    write failure while it wrote what it had). A folder without a readable status, or already final, is left as is.
    """
    try:
        status = read_status(run_dir)
    except (OSError, DamagedStatusError):
        return False
    if status.get("state") != RUNNING:
        return False
    status.update(state=FAILED, ended=_now(), message=message)
    try:
        _write_status_file(run_dir, status)
    except OutputWriteError:
        return False
    return True

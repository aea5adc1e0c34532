"""One artifacts manager for every run folder: atomic writes and a run status that is never left looking complete.

`run_status.json` (`records.common.RunStatus`) reads `running` from the start, then `complete`, `failed` (with the
message) or `interrupted`; it names the writing process (pid and host), so a folder still `running` after that
process is gone was killed hard (`records.folders.writer_state`). A file that cannot be written raises
:class:`OutputWriteError`; the status falls back to an in-place rewrite, which works on a full disk, so a folder is
marked failed whenever it can be written at all (:func:`mark_failed` is the entry points' last resort).
"""

from __future__ import annotations

import errno
import os
from datetime import UTC, datetime
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.records import io
from llm_perf_opt.records.common import COMPLETE, FAILED, INTERRUPTED, RUNNING, RunState, RunStatus
from llm_perf_opt.records.folders import STATUS_FILE, read_status, this_host, writer_note
from llm_perf_opt.records.io import RecordError

__all__ = [
    "COMPLETE",
    "FAILED",
    "INTERRUPTED",
    "RUNNING",
    "STATUS_FILE",
    "ArtifactsManager",
    "OutputWriteError",
    "RunState",
    "claim",
    "environment_error",
    "mark_failed",
    "read_status",
    "refuse_reuse",
    "release",
]


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
            "Free disk space or make that folder writable, or point the setting that names it (hydra.run.dir, "
            "hydra.sweep.dir for -m, model.cache_dir, an absolute save_dir) at a writable folder with room",
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
            "Make that file or folder accessible to this user, or point the setting that names it (hydra.run.dir, "
            "hydra.sweep.dir for -m, model.cache_dir, an absolute save_dir) at a folder you can write",
        )
    return None


class ArtifactsManager:
    """Writes the files of one run folder and keeps its status."""

    def __init__(self, run_dir: Path, *, stage: str) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.stage = stage
        self.written: list[str] = []

    # ---- status ------------------------------------------------------------------------------------
    def start(self, run_id: str) -> None:
        """Mark the folder running, claiming it first (`claim`, which refuses one holding another run) if not yet."""
        if self.run_dir not in _CLAIMED:
            claim(self.run_dir, stage=self.stage)
        _CLAIMED.discard(self.run_dir)  # started: a second start in this process is refused like any other
        self._status = _running(self.stage, run_id)
        _write_status_file(self.run_dir, self._status)

    def finish(self, state: RunState, message: str | None = None) -> None:
        """Set the final state (complete, failed or interrupted) with an optional message."""
        self._status = attrs.evolve(
            self._status, state=state, ended=_now(), message=message, files=tuple(sorted(set(self.written)))
        )
        _write_status_file(self.run_dir, self._status)

    @property
    def state(self) -> RunState:
        return self._status.state

    # ---- files -------------------------------------------------------------------------------------
    def path(self, relative: str) -> Path:
        """Absolute path of a file in the run folder (parents created)."""
        target = self.run_dir / relative
        _mkdir(target.parent)
        return target

    def resolve_save_dir(self, save_dir: str) -> Path:
        """`save_dir` relative to the run folder; absolute paths are honoured."""
        path = Path(str(save_dir)).expanduser()
        return path if path.is_absolute() else self.run_dir / path

    def write_text(self, relative: str, text: str) -> Path:
        target = self.path(relative)
        _atomic_write(target, text)
        self.written.append(relative)
        return target

    def write_anywhere(self, target: Path, text: str) -> Path:
        """Write `text` to `target`: as a run file inside the run folder, as a plain file outside it (`note_file`)."""
        _mkdir(target.parent)
        _atomic_write(target, text)
        self.note_file(target)
        return target

    def write_json(self, relative: str, data: object) -> Path:
        """A record (or plain data) as JSON."""
        return self.write_text(relative, io.dumps(data))

    def write_yaml(self, relative: str, data: object) -> Path:
        return self.write_text(relative, io.dumps_yaml(data))

    def note_file(self, path: Path) -> None:
        """Note a file written by someone else: relative when inside the run folder, absolute otherwise."""
        try:
            self.written.append(str(path.resolve().relative_to(self.run_dir)))
        except ValueError:
            self.written.append(str(path.resolve()))

    def record(self, relative: str) -> None:
        """Note a file written by someone else (e.g. a trace) as part of the run."""
        self.written.append(relative)


def _running(stage: str, run_id: str) -> RunStatus:
    """The status of a run starting now in this process (its pid and host, so a reader can tell when it is gone)."""
    return RunStatus(stage=stage, run_id=run_id, state=RUNNING, started=_now(), pid=os.getpid(), host=this_host())


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputWriteError(folder, exc) from exc


def _atomic_write(target: Path, text: str) -> None:
    """Write `text` to `target` through a temporary file and a rename; OSError -> OutputWriteError."""
    try:
        io.atomic_write_text(target, text)
    except OSError as exc:
        raise OutputWriteError(target, exc) from exc


def _write_status_file(run_dir: Path, status: RunStatus) -> None:
    """Atomically where possible; else rewritten in place, which reuses the file's blocks (works on a full disk)."""
    target = Path(run_dir) / STATUS_FILE
    text = io.dumps(status)
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


_CLAIMED: set[Path] = set()  # folders this process claimed whose run has not started yet (`claim`, then `start`)


def claim(run_dir: Path, *, stage: str) -> None:
    """Make `run_dir` this process's run folder before anything else is written into it: its `run_status.json` is
    created exclusively (`running`, with this pid and host). Of runs started together into one folder exactly one
    gets it; the others get a UserError and leave the folder as it was."""
    run_dir = Path(run_dir).resolve()
    refuse_reuse(run_dir)  # the common case, refused before anything is written
    _mkdir(run_dir)
    try:
        io.create_exclusive(run_dir / STATUS_FILE, io.dumps(_running(stage, run_dir.name)))
    except FileExistsError:  # another run claimed it since the check
        raise _refusal(run_dir, _holder(run_dir) or "another run") from None
    except OSError as exc:
        raise OutputWriteError(run_dir / STATUS_FILE, exc) from exc
    _CLAIMED.add(run_dir)


def release(run_dir: Path) -> None:
    """Give back a folder this process claimed but ran nothing in (its claim removed: it holds no run)."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _CLAIMED:
        _CLAIMED.discard(run_dir)
        (run_dir / STATUS_FILE).unlink(missing_ok=True)


def refuse_reuse(run_dir: Path) -> None:
    """UserError when `run_dir` already holds a run (a `run_status.json`, readable or not)."""
    if (held := _holder(run_dir)) is not None:
        raise _refusal(run_dir, held)


def _holder(run_dir: Path) -> str | None:
    """The run a folder holds, in words ("a running run (the process writing it ...)"); None when it holds none."""
    if not (Path(run_dir) / STATUS_FILE).exists():
        return None
    try:
        status = read_status(run_dir)
    except RecordError:
        return "a damaged run"
    article = "an" if status.state[:1] in "aeiou" else "a"  # an interrupted run
    return f"{article} {status.state} run" + (f" ({writer_note(status)})" if status.state == RUNNING else "")


def _refusal(run_dir: Path, held: str) -> UserError:
    return UserError(
        f"the run folder {Path(run_dir).resolve()} already holds {held}; it was left untouched",
        "Leave hydra.run.dir unset for a fresh folder, or point it at an empty one",
    )


def mark_failed(
    run_dir: Path, message: str, *, only_this_process: bool = False, replacing: tuple[RunState, ...] = (RUNNING,)
) -> bool:
    """Mark a folder whose status reads `running` (or another state of `replacing`: a rung stopped for its time
    limit that recorded `interrupted` still failed) as failed with `message`; True when it was marked. The entry
    points call this for an error the run could not record itself; `only_this_process`: never a folder another
    process is writing. A folder without a readable status, or in another state, is left as is."""
    try:
        status = read_status(run_dir)
    except RecordError:
        return False
    if status.state not in replacing:
        return False
    if only_this_process and (status.pid, status.host) != (os.getpid(), this_host()):
        return False
    try:
        _write_status_file(run_dir, attrs.evolve(status, state=FAILED, ended=_now(), message=message))
    except OutputWriteError:
        return False
    return True

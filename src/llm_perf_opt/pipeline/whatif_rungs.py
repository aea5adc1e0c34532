"""Running what-if rungs: each one a `stage1-run` in its own process (compiled state and the allocator stay
isolated), one rung per device at a time, its output in a log file; what became of it read from its folder."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import attrs

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.config_schema import WhatIfRunSchema
from llm_perf_opt.override_text import quoted_override
from llm_perf_opt.parent_death import with_parent
from llm_perf_opt.pipeline.rung_forks import ENTRY_MODULE as STAGE1_MODULE
from llm_perf_opt.pipeline.rung_forks import ForkedRung, ForkServer
from llm_perf_opt.pipeline.rung_handoff import RELEASED_ENV, WAIT_ENV
from llm_perf_opt.records import common
from llm_perf_opt.records.folders import STATUS_FILE, read_status, writer_note
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.session.model_settings import ModelSettings

log = logging.getLogger("llm_perf_opt.whatif")

LOG_TAIL_LINES = 3
HANDOFF_PREFIX = "llm-perf-opt-handoff-"  # the temporary folder of a phase's handoff files
HANDOFF_POLL_S = 0.05  # how often a running rung's `released` file is looked for
MODEL_CACHE_DIR = "model_cache"  # the rungs' saved random-weights model (`model.cache_dir`), removed at the end
INDUCTOR_CACHE_DIR = "inductor_cache"  # inductor's cache the rungs share (whatif_run.inductor_cache=run)
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
RUN_FOLDER = "run"  # whatif_run.inductor_cache: a folder in the what-if run folder, removed at the end
USER_FOLDER = "user"  # whatif_run.inductor_cache: <user cache>/llm_perf_opt/inductor, kept between runs
# The states a rung stopped for its time limit is marked failed from (`interrupted`: it recorded the stop itself)
PAST_LIMIT_MARKED = (common.RUNNING, common.INTERRUPTED)
# What a rung or phase stopped for its time limit says to do about it.
PAST_LIMIT_FIX = "a lever that compiles for minutes, such as max-autotune, needs a higher limit or null"


@attrs.frozen
class SharedCaches:
    """What the rungs of one what-if run share: the folder where the first rung saves the random-weights model and
    the others load it, and inductor's cache; `owned`: those in the run folder, removed when the run ends."""

    model_cache: Path | None = None
    inductor_cache: Path | None = None
    owned: tuple[Path, ...] = ()

    @property
    def overrides(self) -> tuple[str, ...]:
        """The `stage1-run` overrides every rung gets."""
        return () if self.model_cache is None else (quoted_override("model.cache_dir", self.model_cache),)

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """The environment variables every rung's process gets."""
        return () if self.inductor_cache is None else ((INDUCTOR_CACHE_ENV, str(self.inductor_cache)),)

    def remove(self) -> None:
        """Delete the run's own caches (a failure is logged: the run's results stand)."""
        for folder in self.owned:
            if folder.exists():
                try:
                    shutil.rmtree(folder)
                except OSError as exc:
                    log.warning("could not remove %s: %s", folder, exc)


def shared_caches(run: WhatIfRunSchema, model: ModelSettings, run_dir: Path) -> SharedCaches:
    """The caches the rungs of the what-if run in `run_dir` share: `whatif_run.reuse_model` (a saved model in
    `<run>/model_cache`, unless the model has checkpoint weights or its own `model.cache_dir`) and
    `whatif_run.inductor_cache` (user: `~/.cache/llm_perf_opt/inductor`; run: `<run>/inductor_cache`, removed; a
    folder; null: the environment's `TORCHINDUCTOR_CACHE_DIR` or inductor's default)."""
    owned: list[Path] = []
    model_cache = None
    if run.reuse_model and not model.own_weights:
        model_cache = run_dir / MODEL_CACHE_DIR
        owned.append(model_cache)
    chosen = run.inductor_cache
    inductor = None
    if chosen == RUN_FOLDER:
        inductor = run_dir / INDUCTOR_CACHE_DIR
        owned.append(inductor)
    elif chosen == USER_FOLDER:
        from llm_perf_opt.instruments.measured_peaks import default_cache_dir  # (imports torch)

        inductor = default_cache_dir() / "inductor"
    elif chosen:
        inductor = Path(str(chosen)).expanduser().resolve()
    return SharedCaches(model_cache, inductor, tuple(owned))


@attrs.frozen
class RungJob:
    """A rung to run: its name, the workload's and the levers' `stage1-run` overrides, its folder and its log;
    `shared` and `env`: the overrides and environment variables the what-if run gives every rung (`SharedCaches`)."""

    name: str
    workload: tuple[str, ...]
    levers: tuple[str, ...]
    folder: Path
    log: Path
    shared: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @property
    def overrides(self) -> tuple[str, ...]:
        """The workload's and the shared overrides, then the levers' (which win on a key both set)."""
        return (*self.workload, *self.shared, *self.levers)


def child_env(env: Sequence[tuple[str, str]]) -> dict[str, str] | None:
    """This process's environment with `env` set (None: none to set, the child inherits it as it is)."""
    return {**os.environ, **dict(env)} if env else None


@attrs.frozen
class RungOutcome:
    """How a rung's process ended: the folder's state and message (or why there is no folder), and its wall time."""

    name: str
    state: common.RunState
    message: str | None
    wall_s: float | None  # None: not known (a rung of a Hydra multirun whose folder recorded no end)


def stage1_arguments(job: RungJob, device: str | None) -> list[str]:
    """The `stage1-run` arguments of one rung."""
    extra = [] if device is None else [f"device={device}"]
    return [
        *job.overrides,
        *extra,
        "run.save_prefill_logits=true",
        "report.render=false",  # the what-if renders every rung's reports once, when it ends
        quoted_override("hydra.run.dir", job.folder),  # quoted: a space or non-ASCII letter in the path
    ]


def stage1_command(job: RungJob, device: str | None) -> list[str]:
    """The child command of one rung (the same interpreter as this one)."""
    return [sys.executable, "-m", STAGE1_MODULE, *stage1_arguments(job, device)]


def run_process(
    command: Sequence[str],
    log: Path,
    timeout_s: float | None,
    *,
    own_group: bool = False,
    env: Sequence[tuple[str, str]] = (),
) -> int | None:
    """Run `command` with its output in `log` to its end (its exit status) or its time limit (None: stopped);
    `own_group`: in a process group of its own, stopped as a whole (a launcher and the workers it starts)."""
    return _waited(_started(command, log, own_group=own_group, env=env), timeout_s, own_group)


def _started(
    command: Sequence[str], log: Path, *, own_group: bool = False, env: Sequence[tuple[str, str]] = ()
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        return subprocess.Popen(  # started by the thread that waits for it: it dies with the what-if run
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
            env=child_env(env),
            preexec_fn=with_parent(),
        )


@attrs.frozen
class Handoff:
    """This run's side of a rung's device handoff (`rung_handoff`): the file this run creates once the rung's
    process has ended; the one the rung creates once it no longer uses its device (None: it keeps it to its end,
    `whatif_run.overlap_rungs=false`); the one it waits for before its warm-up passes (None: none; see `Lane`)."""

    exited: Path
    released: Path | None = None
    after: Path | None = None

    @classmethod
    def of(cls, folder: Path, job: RungJob, after: Path | None, *, overlap: bool) -> Handoff:
        """The handoff files of `job` in `folder` (a temporary folder of the phase)."""
        name = job.folder.name
        return cls(folder / f"{name}.exited", folder / f"{name}.released" if overlap else None, after)

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """The environment variables that tell the rung's process about it."""
        files = ((RELEASED_ENV, self.released), (WAIT_ENV, self.after))
        return tuple((key, str(path)) for key, path in files if path is not None)


def _waited(
    process: RungProcess,
    timeout_s: float | None,
    own_group: bool,
    released: Path | None = None,
    on_release: Callable[[], None] | None = None,
) -> int | None:
    """A started process's exit status, or None when it ran past `timeout_s` and was stopped; `on_release` is
    called once `released` exists (the rung handed its device on), while the process still runs."""
    with _LOCK:
        _LIVE[process] = own_group
        stopping = _STOPPING.is_set()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        if stopping:  # the run was stopped while this rung was starting
            _stop(process, own_group, forwarded_stop(own_group))
        while True:
            if on_release is not None and released is not None and released.exists():
                on_release()
                on_release = None
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            step = left if on_release is None else min(HANDOFF_POLL_S, HANDOFF_POLL_S if left is None else left)
            try:
                returncode = process.wait(timeout=step)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
    except subprocess.TimeoutExpired:
        _stop(process, own_group)
        return None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP while waiting here: the process must not outlive the run
        _stop(process, own_group, forwarded_stop(own_group))
        raise
    finally:
        with _LOCK:
            _LIVE.pop(process, None)
    if own_group:  # workers it left behind (a launcher's idle pool) must not hold a GPU into the next phase
        _signal(process, signal.SIGKILL, group=True)
    return returncode


def run_rung(
    job: RungJob,
    device: str | None,
    timeout_s: float | None,
    forks: ForkServer | None = None,
    handoff: Handoff | None = None,
    on_release: Callable[[], None] | None = None,
) -> RungOutcome:
    """Run one rung to its end (or its time limit) and read what became of it: a fresh interpreter, or forked from
    the preloaded server `forks` (stopped as a group); `on_release`: called when it hands its device on early."""
    started = time.perf_counter()
    env = (*job.env, *(handoff.env if handoff is not None else ()))
    released = None if handoff is None else handoff.released
    if released is None:
        on_release = None  # the rung keeps its device to its end: nothing to look for while it runs
    process: RungProcess
    if forks is None:
        process = _started(stage1_command(job, device), job.log, env=env)
    else:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        process = forks.spawn(stage1_arguments(job, device), job.log, dict(env))
    returncode = _waited(process, timeout_s, own_group=forks is not None, released=released, on_release=on_release)
    wall = time.perf_counter() - started
    if returncode is None:
        message = f"ran past whatif_run.rung_timeout_s={timeout_s:g} s and was stopped ({PAST_LIMIT_FIX})"
        artifacts.mark_failed(job.folder, message, replacing=PAST_LIMIT_MARKED)
        return RungOutcome(job.name, common.FAILED, message, wall)
    return read_outcome(job, returncode, wall)


def read_outcome(job: RungJob, returncode: int | None, wall: float | None, *, shared: bool = False) -> RungOutcome:
    """What became of a rung, from its folder and its process's exit status (None: stopped with the what-if run);
    `shared`: that process ran other rungs too (a Hydra multirun), so its status does not judge a completed rung."""
    if (job.folder / STATUS_FILE).is_file():
        try:
            status = read_status(job.folder)
        except RecordError as exc:
            return RungOutcome(job.name, common.FAILED, str(exc), wall)
        if status.state == common.RUNNING:  # killed before it could record its end
            message = _unrecorded_end(status, returncode, job.log)
            artifacts.mark_failed(job.folder, message)
            return RungOutcome(job.name, common.FAILED, message, wall)
        if status.state == common.COMPLETE and returncode not in (0, None) and not shared:
            return RungOutcome(job.name, common.FAILED, f"exit {returncode} after completing; see {job.log}", wall)
        return RungOutcome(job.name, status.state, _one_line(status.message, job.log), wall)
    return RungOutcome(job.name, common.FAILED, f"exit {returncode}: {log_tail(job.log)}", wall)


def stopped_outcome(job: RungJob) -> RungOutcome | None:
    """What became of a rung in flight or done when the what-if run was stopped, read from its folder (an
    interrupted rung keeps the passes it measured); None when it had not started."""
    if not (job.folder / STATUS_FILE).is_file():
        return None
    return read_outcome(job, None, status_wall_s(job.folder))


def _unrecorded_end(status: common.RunStatus, returncode: int | None, log: Path) -> str:
    """Why a rung's folder still reads `running` after its process was waited for."""
    if returncode is None:
        return f"stopped with the what-if run, it recorded no end within {STOP_GRACE_S:g} s ({writer_note(status)})"
    return f"its process (pid {status.pid}) ended (exit {returncode}) before the run recorded its end; see {log}"


def status_wall_s(folder: Path) -> float | None:
    """A rung's run from start to end as its `run_status.json` records them (seconds; None: missing, unreadable)."""
    try:
        status = read_status(folder)
        if status.ended is None:
            return None
        return (datetime.fromisoformat(status.ended) - datetime.fromisoformat(status.started)).total_seconds()
    except (RecordError, ValueError):
        return None


def _one_line(message: str | None, log: Path) -> str | None:
    """A run's end message on one line (a traceback's first line), pointing at the log for the rest."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else None
    return f"{lines[0]} … (the whole message: {log})"


def log_tail(log: Path) -> str:
    """The last non-empty lines of a rung's log, joined (what it said before it ended)."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return f"(its log {log} cannot be read: {exc.strerror or exc})"
    return " / ".join(lines[-LOG_TAIL_LINES:]) or "(no output)"


RungProcess = subprocess.Popen[bytes] | ForkedRung  # a rung's process, started fresh or forked
_LIVE: dict[RungProcess, bool] = {}  # rung processes running now -> whether each leads its own group
_LOCK = threading.Lock()
_STOPPING = threading.Event()  # stop_all was called: no rung starts any more (cleared when run_rungs starts)
STOP_GRACE_S = 20.0  # seconds a rung gets to write what it measured after SIGTERM
# SIGTERM again after this long if the rung still runs: a first stop can be swallowed on its way (interrupts.py), and
# a rung that took it ignores the second (longer than interrupts.RESTOP_AFTER_S)
RESEND_AFTER_S = 5.0


def _signal(process: RungProcess, signum: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)


def _stop(process: RungProcess, group: bool = False, first: int = signal.SIGTERM) -> None:
    """`first` (SIGTERM, or the signal that stopped the what-if run, so the rung names it), SIGTERM after
    RESEND_AFTER_S, then SIGKILL after the grace period (to its whole process group when `group`)."""
    _signal(process, first, group)
    try:
        process.wait(timeout=RESEND_AFTER_S)
    except subprocess.TimeoutExpired:
        _signal(process, signal.SIGTERM, group)  # ignored by a rung writing what it measured; stops one that lost it
        try:
            process.wait(timeout=max(STOP_GRACE_S - RESEND_AFTER_S, 0.0))
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL, group)
            process.wait()
    if group:  # workers the launcher left behind
        _signal(process, signal.SIGKILL, group)


def forwarded_stop(group: bool) -> int:
    """The signal that stops a rung with the what-if run: the one that stopped the run, so the rung's folder names
    it; SIGTERM instead of SIGINT for a rung in this run's process group (`group` False), which Ctrl-C reached
    already (a second SIGINT would cut its writing short)."""
    signum = interrupts.stop_signal()
    return signal.SIGTERM if signum == signal.SIGINT and not group else signum


def stop_all() -> None:
    """Stop every rung still running, and any that was about to start (the what-if run itself is being stopped)."""
    with _LOCK:
        _STOPPING.set()
        running = list(_LIVE.items())
    for process, group in running:
        _stop(process, group, forwarded_stop(group))


@attrs.frozen
class Lane:
    """A device the rungs take one at a time, and the file the next rung on it waits for before its warm-up passes
    (the `exited` file of the rung that handed it on while still ending, or the fork server's compile preload)."""

    device: str | None
    after: Path | None = None


def run_rungs(
    jobs: Sequence[RungJob],
    devices: Sequence[str | None],
    timeout_s: float | None,
    on_done: Callable[[RungOutcome], None] | None = None,
    forks: ForkServer | None = None,
    overlap: bool = False,
) -> dict[str, RungOutcome]:
    """Run `jobs`, at most one per device at a time (`devices` = [None]: the rungs' own `device` setting, one after
    the other), each a fresh process or forked from `forks`; outcomes by rung name. `overlap`: a rung that hands its
    device on before it has ended lets the next one start (`rung_handoff`)."""
    _STOPPING.clear()
    free: queue.Queue[Lane] = queue.Queue()
    for device in devices:
        free.put(Lane(device, None if forks is None else forks.compile_preloaded))

    def one(job: RungJob, folder: Path) -> RungOutcome:
        lane = free.get()
        if _STOPPING.is_set():  # the run was stopped while this rung waited for its device
            free.put(lane)
            raise KeyboardInterrupt(f"{job.name} not started: the what-if run was stopped")
        handoff = Handoff.of(folder, job, lane.after, overlap=overlap)
        handed = threading.Event()

        def hand_on() -> None:
            handed.set()
            free.put(Lane(lane.device, handoff.exited))

        try:
            outcome = run_rung(job, lane.device, timeout_s, forks, handoff, hand_on)
        finally:
            handoff.exited.touch()
            if not handed.is_set():
                free.put(Lane(lane.device))
        if on_done is not None:
            on_done(outcome)
        return outcome

    workers = max(1, len(devices)) * (2 if overlap else 1)  # a rung ending beside the next one on each device
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=HANDOFF_PREFIX)))
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=workers))
        try:
            outcomes = list(pool.map(lambda job: one(job, folder), jobs))
        except KeyboardInterrupt:  # the rungs must not outlive the run (the pool waits for them otherwise)
            stop_all()
            raise
    return {o.name: o for o in outcomes}

"""Rung processes forked from a preloaded server: each what-if rung is still its own `stage1-run` process (compiled
state, CUDA context and allocator isolated), but forked from a process that has already imported torch, transformers
and the pipeline, skipping the ~13 s of imports of a fresh interpreter on the project's H100 machines (2026-11-26:
`import llm_perf_opt.pipeline.stage1` 13.7 s, of which transformers ~9 s).

The server (`python -m llm_perf_opt.pipeline.rung_forks`) imports, checks that no CUDA context exists (one does not
survive a fork), then reads one JSON request per line on stdin and answers on stdout (`{"pid": n}` when it forked a
rung, `{"exit": [pid, status]}` when one ended); it is single-threaded, so forking is safe. Each child leads a session
of its own (stopped as a group), writes to its log and calls the `stage1-run` entry point with the rung's arguments.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from llm_perf_opt.parent_death import die_with_parent, with_parent
from llm_perf_opt.process_end import end_process

log = logging.getLogger("llm_perf_opt.whatif")

PRELOAD = ("torch", "transformers", "llm_perf_opt.pipeline.stage1", "llm_perf_opt.cli.stage1")
# Also preloaded when a rung compiles (`--compiles <file>`): what torch.compile imports on its first call, ~3-4 s of a
# compiled rung's start on the project's H100 machines (2026-11-27), starting no thread and no CUDA. The server
# imports them after forking the first rung and then creates <file>, which that rung waits for before its warm-up
# passes (`rung_handoff`), so the import costs the run no time.
COMPILE_PRELOAD = ("torch._inductor.compile_fx", "torch._inductor.async_compile", "torch._dynamo.backends.inductor")
COMPILES_FLAG = "--compiles"
READY = "ready"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a terminal or a scheduler stops a run with
ENTRY_MODULE = "llm_perf_opt.cli.stage1"


# ---- the server (its own process) ---------------------------------------------------------------------------------
def _serve(argv: Sequence[str] = ()) -> None:
    """Preload, then fork a rung per request until stdin closes; report each fork and each exit on stdout.
    `--compiles <file>`: torch.compile's modules too, once the first rung is forked, then create <file>."""
    # Ctrl-C in a terminal (or its closing, SIGHUP) reaches the whole foreground group: the what-if run stops the
    # rungs itself, and the server must outlive them to report how they ended (it exits when its stdin closes).
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    parent = os.getppid()  # the what-if run: the server dies with it (PR_SET_PDEATHSIG, set when it was started)
    compile_preloaded = Path(argv[argv.index(COMPILES_FLAG) + 1]) if COMPILES_FLAG in argv else None
    name = PRELOAD[0]
    try:
        torch = importlib.import_module(name)
        with _cuda_init_watched(torch) as initialised_at, _torchao_import_deferred():
            for name in PRELOAD[1:]:
                importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - reported to the what-if run, which starts fresh processes instead
        _say({"error": f"importing {name} failed: {type(exc).__name__}: {exc}"})
        return
    if torch.cuda.is_initialized():
        where = f" (initialised at {initialised_at[0]})" if initialised_at else ""
        _say({"error": f"a CUDA context exists after the imports{where}: rungs cannot be forked from this process"})
        return
    _say({READY: os.getpid()})
    children: set[int] = set()
    stdin = sys.stdin.buffer
    pending = b""
    open_input = True
    while open_input or children:
        readable = select.select([stdin] if open_input else [], [], [], 0.2)[0]  # also the wait between polls
        if readable:
            chunk = os.read(stdin.fileno(), 65536)
            open_input = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    children.add(_fork(json.loads(line)))
            if children and compile_preloaded is not None:  # the first rung runs: while it starts, import these
                _preload(COMPILE_PRELOAD, compile_preloaded)
                compile_preloaded = None
        if os.getppid() != parent:  # the what-if run was killed (where no PR_SET_PDEATHSIG killed this server)
            _kill_groups(children)
            return
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _say({"exit": [pid, os.waitstatus_to_exitcode(status)]})


@contextlib.contextmanager
def _cuda_init_watched(torch: Any) -> Iterator[list[str]]:
    """Where CUDA is first initialised inside the block (`torch._C._cuda_init`'s innermost callers; empty while it is
    not), so that a server refused for a CUDA context names the import that made it."""
    seen: list[str] = []
    real = getattr(torch._C, "_cuda_init", None)
    if real is None:
        yield seen
        return

    def recording(*args: Any, **kwargs: Any) -> Any:
        if not seen:
            frames = traceback.extract_stack()[:-1][-6:]
            seen.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames)))
        return real(*args, **kwargs)

    torch._C._cuda_init = recording
    try:
        yield seen
    finally:
        torch._C._cuda_init = real


@contextlib.contextmanager
def _torchao_import_deferred() -> Iterator[None]:
    """Within the block, transformers sees no torchao, so that importing it does not import torchao: torchao's own
    import asks `torch.utils._triton.has_triton()`, which reads the GPU's properties and so creates a CUDA context
    (torch 2.11, torchao 0.18), and no forked rung could then use CUDA. Afterwards every transformers module sees the
    real check again; a rung that uses torchao imports it after its fork."""
    import transformers.utils as utils
    import transformers.utils.import_utils as import_utils

    real = import_utils.is_torchao_available

    def unavailable(*_args: object, **_kwargs: object) -> bool:
        return False

    utils.is_torchao_available = import_utils.is_torchao_available = unavailable
    try:
        yield
    finally:
        for module in [m for name, m in sys.modules.items() if name.startswith("transformers") and m is not None]:
            if getattr(module, "is_torchao_available", None) is unavailable:
                setattr(module, "is_torchao_available", real)  # noqa: B010 - any module that bound the stub


def _kill_groups(children: set[int]) -> None:
    """SIGKILL each rung's process group (each leads its own session)."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _preload(modules: Sequence[str], done: Path) -> None:
    """Import `modules` (one that fails is left to the rung that needs it), then create `done`."""
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a rung imports what it needs itself; the server goes on serving
        _say({"note": f"preloading {name} failed: {type(exc).__name__}: {exc}"})
    finally:
        done.touch()


def _say(message: Mapping[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _fork(request: Mapping[str, Any]) -> int:
    """Fork one rung; the parent returns its pid (also said on stdout), the child never returns."""
    server = os.getpid()
    pid = os.fork()
    if pid:
        _say({"pid": pid, "request": request.get("request")})
        return pid
    status = 1
    try:
        os.setsid()
        die_with_parent(server)  # a rung outlives no server (this single-threaded server forked it)
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null)
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)  # the entry point installs its own handlers
        os.environ.update(request.get("env", {}))
        module = str(request.get("module") or ENTRY_MODULE)
        sys.argv = [module, *request["argv"]]
        importlib.import_module(module).main()  # the console script's entry point
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child reports any failure through its log and exit status
        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
    raise AssertionError("unreachable: the child exits above")


# ---- the what-if side -------------------------------------------------------------------------------------------
class ForkedRung:
    """A rung forked by the server: what `subprocess.Popen` offers the rung runner (pid, wait, send_signal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, status: int) -> None:
        self.returncode = status
        self._ended.set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rung pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if not self._ended.is_set():
            os.kill(self.pid, signum)


class ForkServer:
    """The preloaded server of one what-if run: start it once (`start`, None when it cannot serve: the rungs then
    start as fresh interpreters), `spawn` a rung per call, `close` at the end."""

    def __init__(self, process: subprocess.Popen[bytes], compile_preloaded: Path | None = None) -> None:
        self._process = process
        # created once the server has imported torch.compile's modules (None: it does not import them)
        self.compile_preloaded = compile_preloaded
        self._lock = threading.Lock()
        self._spawned = threading.Condition(self._lock)
        self._forked: dict[int, int] = {}  # request number -> the pid the server forked for it
        self._requests = 0
        self._children: dict[int, ForkedRung] = {}
        self._early: dict[int, int] = {}  # exits read before their rung was registered
        self._reader = threading.Thread(target=self._read, name="rung-fork-server", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, timeout_s: float = 120.0, *, compiles: bool = False) -> ForkServer | None:
        """Start the server and wait until it has preloaded; None (with a log line) when it fails."""
        return StartingServer.launch(compiles=compiles).ready(timeout_s)

    def spawn(
        self, argv: Sequence[str], log_path: Path, env: Mapping[str, str], module: str = ENTRY_MODULE
    ) -> ForkedRung:
        """Fork a process that calls `<module>.main()` with `argv` (a rung: `stage1-run`'s), its output in
        `log_path`, with `env` set."""
        assert self._process.stdin is not None
        with self._lock:
            self._requests += 1
            number = self._requests
            request = {"module": module, "argv": list(argv), "log": str(log_path), "env": dict(env), "request": number}
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
            # Rungs on several devices are spawned from several threads, each waiting here with the lock released:
            # each takes the pid forked for its own request, never the first one reported.
            while number not in self._forked:
                if self._process.poll() is not None:
                    raise RuntimeError(f"the rung fork server ended (exit {self._process.returncode})")
                self._spawned.wait(1.0)
            pid = self._forked.pop(number)
            rung = ForkedRung(pid)
            self._children[pid] = rung
            if pid in self._early:
                rung._end(self._early.pop(pid))
        return rung

    def _read(self) -> None:
        out = self._process.stdout
        assert out is not None
        for line in out:
            message = json.loads(line)
            with self._lock:
                if "pid" in message:
                    self._forked[int(message["request"])] = int(message["pid"])
                    self._spawned.notify_all()
                elif "note" in message:  # something the server could not preload: the rungs import it themselves
                    log.info("rung fork server: %s", message["note"])
                elif "exit" in message:
                    pid, status = (int(x) for x in message["exit"])
                    rung = self._children.pop(pid, None)
                    if rung is None:
                        self._early[pid] = status
                    else:
                        rung._end(status)
        with self._lock:  # the server is gone: whatever it had not reported cannot be waited for
            for rung in self._children.values():
                rung._end(-signal.SIGKILL)
            self._children.clear()
            self._spawned.notify_all()

    def close(self) -> None:
        """End the server once its rungs have ended (stdin closed: it exits when its children have)."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self.compile_preloaded is not None:
            shutil.rmtree(self.compile_preloaded.parent, ignore_errors=True)


class StartingServer:
    """A fork server launched and still importing: the what-if run launches it first thing, so that its imports
    overlap the run's own start, and waits for it (`ready`) only when the first rung is due."""

    def __init__(self, process: subprocess.Popen[bytes], compile_preloaded: Path | None = None) -> None:
        self._process = process
        self._compile_preloaded = compile_preloaded

    @classmethod
    def launch(cls, *, compiles: bool = False) -> StartingServer:
        """Start the server process, importing in the background (`compiles`: torch.compile's modules too)."""
        preloaded = Path(tempfile.mkdtemp(prefix="llm-perf-opt-forks-")) / "compile_preloaded" if compiles else None
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, *([COMPILES_FLAG, str(preloaded)] if preloaded is not None else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"},  # is_available() must not touch the driver
            preexec_fn=with_parent(),  # killed with the what-if run (launched from its main thread)
        )
        return cls(process, preloaded)

    def ready(self, timeout_s: float = 120.0) -> ForkServer | None:
        """The server once it has preloaded; None (with a log line) when it failed or did not answer in time."""
        assert self._process.stdout is not None
        first = _read_line(self._process.stdout, timeout_s)
        message = json.loads(first) if first else {}
        if READY not in message:
            why = message.get("error") or first or f"no answer within {timeout_s:g} s"
            log.warning("rungs start as fresh processes: the preloaded fork server did not start (%s)", why)
            self.cancel()
            return None
        return ForkServer(self._process, self._compile_preloaded)

    def cancel(self) -> None:
        """Stop the server before it served (nothing was forked from it)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        if self._compile_preloaded is not None:
            shutil.rmtree(self._compile_preloaded.parent, ignore_errors=True)


def _read_line(stream: IO[bytes], timeout_s: float) -> str:
    """One line of `stream` within `timeout_s` ("" when none came)."""
    ready = select.select([stream], [], [], timeout_s)[0]
    return stream.readline().decode().strip() if ready else ""


if __name__ == "__main__":
    _serve(sys.argv[1:])
    end_process(0)  # without the seconds Python's teardown of torch and transformers takes (no CUDA here)

"""How a console script's process ends: without Python's teardown of its modules, where that is safe.

With torch and transformers loaded, the interpreter's exit spends seconds clearing module dictionaries (3.0-3.5 s on
the project's 2-core CPU machine, 2026-11-28) after the command has written everything. `end_process` skips that and
nothing else (the exit code, the atexit handlers and the standard streams are kept), except where something needs
the ordinary C-level exit: a CUDA context (the driver and CUPTI flush there; under Nsight a profile would be lost, as
the GPU tests of 2026-11-28 lost their stage2 reports), an injected tool, or a thread other than the main one working.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

#: Environment variables through which a tool (Nsight Systems, Nsight Compute, any CUPTI injection or preloaded
#: library) enters a process.
INJECTION_VARIABLES = ("CUDA_INJECTION64_PATH", "LD_PRELOAD")


def ends_process(main: Callable[[], None]) -> Callable[[], NoReturn]:
    """`main` as a console script's entry point: once it returns (exit 0) or raises SystemExit (its code), the
    process ends through `end_process`; any other exception propagates. `main` itself stays a plain function (the
    tests run commands inside their own process through it)."""

    @functools.wraps(main)
    def entry() -> NoReturn:
        try:
            main()
        except SystemExit as stop:
            end_process(_exit_code(stop.code))
        end_process(0)

    return entry


def end_process(code: int) -> NoReturn:
    """End the process with `code` after the atexit handlers and a flush of stdout and stderr, skipping the module
    teardown; the ordinary exit where `needs_ordinary_exit` says so."""
    if needs_ordinary_exit():
        raise SystemExit(code)
    atexit._run_exitfuncs()  # what the interpreter's exit would run: logging.shutdown, finalizers, worker pools
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status SystemExit(`code`) gives: None is 0, an int itself, anything else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def needs_ordinary_exit() -> bool:
    """Whether this process must end through the interpreter's own exit: it holds a CUDA context, a tool is injected
    into it (a profiler: its data is written at the C-level exit), or a thread other than the main one still works."""
    torch = sys.modules.get("torch")
    if (torch is not None and torch.cuda.is_initialized()) or any(os.environ.get(n) for n in INJECTION_VARIABLES):
        return True
    return any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread())

"""How a command is stopped: SIGTERM (a scheduler's, `timeout`'s or perf-whatif's stop) ends a run exactly like
Ctrl-C, a KeyboardInterrupt in the main thread, so the run writes what it measured and marks its folder
`interrupted`.

Once a run is stopping, a further SIGTERM is ignored, so writing what was measured is not cut short by a second
stop (a scheduler signalling the whole process group, then perf-whatif forwarding its own); a second Ctrl-C still
interrupts, as the user's explicit choice.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

log = logging.getLogger("llm_perf_opt")

CTRL_C = "Ctrl-C"
SIGTERM = "SIGTERM"

_stopping: list[str] = []  # the signal that started the stop, once one did (this process stops only once)


def install() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (call it from there, before the run starts);
    a signal this process was started ignoring (`nohup`, a background job) stays ignored."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _interrupt)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    name = SIGTERM if signum == signal.SIGTERM else CTRL_C
    if _stopping and signum == signal.SIGTERM:
        log.warning("%s ignored: already stopping (%s), writing what was measured", name, _stopping[0])
        return
    _stopping.append(name)
    raise KeyboardInterrupt(name)


def cause(exc: BaseException) -> str:
    """Who stopped a run, for its status message: "stopped by SIGTERM" or "interrupted by the user (Ctrl-C)"."""
    return f"stopped by {SIGTERM}" if exc.args[:1] == (SIGTERM,) else f"interrupted by the user ({CTRL_C})"

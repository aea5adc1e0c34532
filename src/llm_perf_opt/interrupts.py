"""How a command is stopped: SIGTERM (a scheduler's, `timeout`'s or perf-whatif's stop) and SIGHUP (a closed
terminal or SSH session) end a run exactly like Ctrl-C, a KeyboardInterrupt in the main thread, so the run writes
what it measured and marks its folder `interrupted`, naming the signal.

Once a run is stopping, a further SIGTERM or SIGHUP is ignored, so a second stop (a scheduler signalling the process
group, then perf-whatif forwarding its own) does not cut short writing what was measured; a second Ctrl-C still
interrupts. Except: a stop no run has taken (`cause` not called) within `RESTOP_AFTER_S` was swallowed (by code that
catches every exception, as an import inside a library's lazy attribute lookup can), so a later SIGTERM stops again
(perf-whatif repeats its SIGTERM for that reason, and forwards `stop_signal` to its rungs).
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

log = logging.getLogger("llm_perf_opt")

CTRL_C = "Ctrl-C"
SIGTERM = "SIGTERM"
SIGHUP = "SIGHUP"

# The signals that stop a run, by the name its status message gives: Ctrl-C is the user's, the others a stop from
# outside (ignored while stopping).
NAMES: dict[int, str] = {signal.SIGINT: CTRL_C, signal.SIGTERM: SIGTERM, signal.SIGHUP: SIGHUP}
SIGNALS = {name: signum for signum, name in NAMES.items()}

RESTOP_AFTER_S = 3.0  # a stop no handler took within this long was lost: a further SIGTERM stops again

_stopping: list[tuple[str, float]] = []  # the signal that started the stop and when, once one did
_taken: list[str] = []  # the stops a run's handler took (`cause`): from then on a further SIGTERM is ignored


def install() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (call it from there, before the run
    starts); a signal this process was started ignoring (`nohup`, a background job) stays ignored."""
    for signum in NAMES:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _interrupt)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    name = NAMES.get(signum, SIGTERM)
    if _stopping and name != CTRL_C:
        first, since = _stopping[0]
        waited = time.monotonic() - since
        if _taken or waited < RESTOP_AFTER_S:
            log.warning("%s ignored: already stopping (%s), writing what was measured", name, first)
            return
        log.warning(
            "%s: the stop by %s %.1f s ago reached no handler (it was swallowed): stopping again", name, first, waited
        )
        _stopping[0] = (name, time.monotonic())
        raise KeyboardInterrupt(name)
    _stopping.append((name, time.monotonic()))
    raise KeyboardInterrupt(name)


def cause(exc: BaseException) -> str:
    """Who stopped a run, for its status message: "stopped by SIGTERM", "stopped by SIGHUP (the terminal closed)"
    or "interrupted by the user (Ctrl-C)". The handler that asks has taken the stop: a further SIGTERM or SIGHUP is
    ignored from then on."""
    name = exc.args[0] if exc.args and exc.args[0] in SIGNALS else CTRL_C
    if name == SIGHUP:
        who = f"stopped by {SIGHUP} (a closed terminal or session)"
    elif name == SIGTERM:
        who = f"stopped by {SIGTERM}"
    else:
        who = f"interrupted by the user ({CTRL_C})"
    _taken.append(who)
    return who


def stop_signal() -> int:
    """The signal that stopped this process (SIGTERM when none did): the one a what-if run forwards to its rungs."""
    return SIGNALS[_stopping[0][0]] if _stopping else signal.SIGTERM

"""A child process that dies with its parent: on Linux, `prctl(PR_SET_PDEATHSIG)` asks the kernel to signal the
child when the thread that forked it ends, so a what-if run killed with SIGKILL takes its fork server and rungs with
it instead of leaving them holding a GPU. Elsewhere it does nothing (the fork server also watches its parent).

The signal follows the *thread* that forked the child: fork from a thread that lives as long as the child (the main
thread, or the one that waits for it). It is cleared in the child's own children and kept across exec.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from functools import cache

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> bool:
    """Have this process receive `signum` when its parent (`parent`: its pid, as the parent saw it before the fork)
    ends; if the parent has already ended, receive it now. False where the kernel offers no such request."""
    libc = _libc()
    if libc is None or libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent ended before the request: nothing will signal this process
        os.kill(os.getpid(), signum)
    return True


def with_parent() -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child is killed (SIGKILL) when the thread starting it ends."""
    parent = os.getpid()
    _libc()  # loaded here, before the fork, not in the child

    def request() -> None:
        die_with_parent(parent)

    return request

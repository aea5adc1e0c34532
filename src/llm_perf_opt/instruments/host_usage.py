"""The host's side of the timed passes: CPU time, page faults and context switches of this process and its threads
(`resource.getrusage`) and the CPU time of the thread running the passes (`time.thread_time`), added up over the
passes a run times. Where a host-paced figure moves between two runs and their kernels do not, these say whether the
process got less CPU (involuntary switches), faulted more pages in, spent more time in the kernel, or needed more CPU
for the same work (a slower CPU)."""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from llm_perf_opt.records.stage1 import HostUsage

try:
    import resource
except ImportError:  # not on POSIX: nothing is recorded
    resource = None  # type: ignore[assignment]


def _snapshot() -> HostUsage | None:
    """The process's usage so far, as counters (`passes` 0; differences of two make one pass's usage)."""
    if resource is None:
        return None
    u = resource.getrusage(resource.RUSAGE_SELF)
    counters = (u.ru_utime, u.ru_stime, u.ru_minflt, u.ru_majflt, u.ru_nvcsw, u.ru_nivcsw)
    return HostUsage(0, time.perf_counter(), *counters, pass_thread_cpu_s=time.thread_time())


def _fieldwise(a: HostUsage, b: HostUsage, op: Callable[[float, float], float]) -> HostUsage:
    """`op` on each field of `a` and `b`; a field either lacks (None) stays None."""
    values: dict[str, Any] = {}
    for f in attrs.fields(HostUsage):
        x, y = getattr(a, f.name), getattr(b, f.name)
        values[f.name] = None if x is None or y is None else op(x, y)
    return HostUsage(**values)


def spent(before: HostUsage, after: HostUsage) -> HostUsage:
    """One pass's usage: the counters of `after` less those of `before`."""
    return attrs.evolve(_fieldwise(after, before, operator.sub), passes=1)


def added(total: HostUsage | None, more: HostUsage) -> HostUsage:
    """`total` with `more` added (None: `more`)."""
    return more if total is None else _fieldwise(total, more, operator.add)


class HostUsageMeter:
    """Adds up the host's usage over the passes run inside `timed_pass()`; `total` is None until one ran (or where
    `getrusage` does not exist)."""

    def __init__(self) -> None:
        self.total: HostUsage | None = None

    @contextmanager
    def timed_pass(self) -> Iterator[None]:
        before = _snapshot()
        yield
        after = _snapshot()
        if before is not None and after is not None:
            self.total = added(self.total, spent(before, after))


def host_peak_rss_bytes() -> int | None:
    """The process's peak resident set size so far (Linux reports KiB, macOS bytes); None where unknown."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024

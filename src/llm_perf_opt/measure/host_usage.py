"""The host's side of the timed passes: CPU time, page faults and context switches of this process and its threads
(`resource.getrusage`), added up over the passes a run times. Where a host-paced figure moves between two runs and
their kernels do not, these say whether the process got less CPU (involuntary switches), faulted more pages in, or
spent more time in the kernel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from llm_perf_opt.records.stage1 import HostUsage

try:
    import resource
except ImportError:  # not on POSIX: nothing is recorded
    resource = None  # type: ignore[assignment]


@attrs.frozen
class _Snapshot:
    wall_s: float
    user_cpu_s: float
    system_cpu_s: float
    minor_faults: int
    major_faults: int
    voluntary_switches: int
    involuntary_switches: int


def _snapshot() -> _Snapshot | None:
    if resource is None:
        return None
    u = resource.getrusage(resource.RUSAGE_SELF)
    return _Snapshot(time.perf_counter(), u.ru_utime, u.ru_stime, u.ru_minflt, u.ru_majflt, u.ru_nvcsw, u.ru_nivcsw)


def spent(before: _Snapshot, after: _Snapshot, passes: int = 1) -> HostUsage:
    """The usage between two snapshots, over `passes` passes."""
    return HostUsage(
        passes=passes,
        wall_s=after.wall_s - before.wall_s,
        user_cpu_s=after.user_cpu_s - before.user_cpu_s,
        system_cpu_s=after.system_cpu_s - before.system_cpu_s,
        minor_faults=after.minor_faults - before.minor_faults,
        major_faults=after.major_faults - before.major_faults,
        voluntary_switches=after.voluntary_switches - before.voluntary_switches,
        involuntary_switches=after.involuntary_switches - before.involuntary_switches,
    )


def added(total: HostUsage | None, more: HostUsage) -> HostUsage:
    """`total` with `more` added (None: `more`)."""
    if total is None:
        return more
    fields = attrs.fields(HostUsage)
    return HostUsage(**{f.name: getattr(total, f.name) + getattr(more, f.name) for f in fields})


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

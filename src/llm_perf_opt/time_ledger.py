"""Where a command's wall time goes: the process's age when its pipeline starts (the imports a user waits for),
then each named part (a progress step), the remainder as `other` — one `TimeBudget` that adds up."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from llm_perf_opt import IMPORTED_AT
from llm_perf_opt.records.common import OTHER_PART, TimeBudget, TimePart

START_PART = "start"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat against the boot clock, to the kernel's tick),
    or None where that cannot be read (macOS, Windows)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_s)
    except (OSError, IndexError, ValueError, AttributeError):
        return None


@attrs.define
class _Open:
    """A part being timed, and the time its nested parts took (counted in theirs, not in this one)."""

    name: str
    began: float
    nested_s: float = 0.0


class TimeLedger:
    """The parts of a command's wall time, from the process's start (or, where that cannot be read, from the
    toolkit's import): `start` up to the ledger's creation, then `part()` blocks; a nested part's time counts in
    its own part only. Not thread-safe: parts are the command's foreground steps."""

    def __init__(self) -> None:
        now = time.perf_counter()
        age = process_age_s()
        self._origin = now - age if age is not None else min(IMPORTED_AT, now)
        self._parts: dict[str, float] = {START_PART: now - self._origin}
        self._open: list[_Open] = []

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the block's wall time in part `name` (added up when a part recurs; parts in the order they began)."""
        self._parts.setdefault(name, 0.0)
        frame = _Open(name, time.perf_counter())
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.remove(frame)
            took = time.perf_counter() - frame.began
            self._parts[name] += max(0.0, took - frame.nested_s)
            if self._open:
                self._open[-1].nested_s += took

    def budget(self, note: str | None = None) -> TimeBudget:
        """The budget so far (the parts still open counted up to now), `other` holding the remainder."""
        now = time.perf_counter()
        parts = dict(self._parts)
        nested = 0.0
        for frame in reversed(self._open):  # innermost first: each one's own time, less what it holds
            took = now - frame.began
            parts[frame.name] += max(0.0, took - frame.nested_s - nested)
            nested = took
        counted = sum(parts.values())
        other = max(0.0, (now - self._origin) - counted)
        named = [TimePart(name, seconds) for name, seconds in parts.items()]
        return TimeBudget(total_s=counted + other, parts=(*named, TimePart(OTHER_PART, other)), note=note)

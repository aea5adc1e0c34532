"""One process's share of a data-parallel workload (`run.data_parallel` = N, `run.shard` = k): its inputs (every
N-th from the k-th; all of them when there are fewer inputs than processes) and its two meetings with the other
processes, so that all of them time at once: `ready` before its first timed pass (after build, FLOP count,
compilation and warm-up), `timed` after its last one, so that no process's memory, energy and profiled passes share
the host with another's timed ones.

They meet through files in `<parent of the run folder>/data_parallel_sync/of-N/` (the data-parallel run's own folder,
or a multirun's sweep folder: a shared file system for a cluster). A process that fails marks every meeting as
reached, so no other waits for it; a wait gives up after `WAIT_LIMIT_S` with a note, and the combined summary
judges whether the processes timed at once.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import attrs

from llm_perf_opt.config_schema import RunSchema
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.records.shard import ShardInfo

log = logging.getLogger("llm_perf_opt.shard")

SYNC_DIR = "data_parallel_sync"
READY = "ready"  # before the first timed pass
TIMED = "timed"  # after the last timed pass
PHASES = (READY, TIMED)
WAIT_LIMIT_S = 900.0  # the longest a process waits for the others at one meeting
POLL_S = 0.02

T = TypeVar("T")


def data_parallel_count(run: RunSchema) -> int:
    """`run.data_parallel`: the processes a workload is shared by (1: none)."""
    return require_whole("run.data_parallel", run.data_parallel, 1)


def shard_of(run: RunSchema) -> int | None:
    """`run.shard` (None: not set), checked against `run.data_parallel`."""
    count = data_parallel_count(run)
    if run.shard is None:
        return None
    shard = require_whole("run.shard", run.shard, 0)
    if shard >= count:
        raise UserError(
            f"run.shard={shard} is not one of the {count} shards of run.data_parallel={count} (0 to {count - 1})",
            f"Set run.data_parallel to the number of processes and run.shard=0,...,{count - 1} across them",
        )
    return shard


def shard_inputs(items: Sequence[T], shard: int, count: int) -> tuple[tuple[T, ...], bool]:
    """The inputs of one shard: every `count`-th from index `shard`; all of them (and True: replicated) when there
    are fewer inputs than processes, so every process has pages to time."""
    if len(items) < count:
        return tuple(items), True
    return tuple(items[shard::count]), False


@attrs.define
class ShardSync:
    """The meetings of one process with the others of its data-parallel run (see the module docstring)."""

    folder: Path
    shard: int
    count: int
    waited: dict[str, float] = attrs.Factory(dict)
    note: str | None = None

    @classmethod
    def for_run(cls, run_dir: Path, shard: int, count: int) -> ShardSync:
        return cls(Path(run_dir).resolve().parent / SYNC_DIR / f"of-{count}", shard, count)

    def _mark(self, phase: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{phase}-{self.shard}").touch()

    def meet(self, phase: str, limit_s: float = WAIT_LIMIT_S) -> None:
        """Say this process reached `phase`, and wait (once per phase) until every process has, or `limit_s`."""
        if phase in self.waited:
            return
        self._mark(phase)
        started = time.monotonic()
        while (missing := self._missing(phase)) and time.monotonic() - started < limit_s:
            time.sleep(POLL_S)
        self.waited[phase] = time.monotonic() - started
        if missing:
            self.note = (
                f"gave up waiting at '{phase}' after {limit_s:g} s for shard {', '.join(map(str, missing))} "
                f"(no file in {self.folder})"
            )
            log.warning("data parallel: %s", self.note)
        else:
            log.info("data parallel: every process at '%s' (waited %.1f s)", phase, self.waited[phase])

    def _missing(self, phase: str) -> list[int]:
        return [k for k in range(self.count) if not (self.folder / f"{phase}-{k}").exists()]

    def abandon(self) -> None:
        """This process will time nothing more: mark every meeting reached, so no other process waits for it."""
        try:
            for phase in PHASES:
                self._mark(phase)
        except OSError as exc:  # the run's own failure is what is reported
            log.warning("data parallel: could not mark shard %d as gone in %s: %s", self.shard, self.folder, exc)

    def info(self, device: str, inputs: int, replicated: bool) -> ShardInfo:
        """What the run records of its share (`Stage1Metrics.data_parallel`)."""
        return ShardInfo(
            shard=self.shard,
            count=self.count,
            host=socket.gethostname(),
            device=device,
            inputs=inputs,
            replicated=replicated,
            waited_ready_s=self.waited.get(READY),
            waited_done_s=self.waited.get(TIMED),
            sync_note=self.note,
        )

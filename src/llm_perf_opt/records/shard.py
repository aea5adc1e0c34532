"""What one process of a data-parallel workload (`run.data_parallel`) records beside its Stage 1 metrics: its timed
forwards on the wall clock and which share it timed (`Stage1Metrics.timed_windows`, `Stage1Metrics.data_parallel`)."""

from __future__ import annotations

import attrs


@attrs.frozen
class PassWindow:
    """One timed forward on the wall clock: its start and end (seconds since the epoch, `time.time()`) and the
    inputs it finished (a batch's inputs, else one)."""

    started_s: float
    ended_s: float
    inputs: int = 1


@attrs.frozen
class ShardInfo:
    """Which share of a data-parallel workload one process timed (`run.shard` of `run.data_parallel`), where, and
    how long it waited for the other processes before its first timed pass and after its last."""

    shard: int
    count: int  # run.data_parallel: the processes the workload is shared by
    host: str
    device: str  # the device it ran on, as torch names it (cuda:1, cpu)
    inputs: int  # the inputs this process took (every count-th, from its shard; all of them when fewer than count)
    replicated: bool = False  # fewer inputs than processes: every process timed all of them
    waited_ready_s: float | None = None  # before its first timed pass, for every process to be ready
    waited_done_s: float | None = None  # after its last timed pass, for every process to finish timing
    sync_note: str | None = None  # set when a wait gave up (a process that never came)

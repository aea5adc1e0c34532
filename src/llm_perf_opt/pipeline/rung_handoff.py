"""Handing a device from one what-if rung to the next before the first has exited (`whatif_run.overlap_rungs`).

A rung's last seconds use no device (the profiler's CPU-only post-processing, writing its records, its exit: 4-6 s
of an eager rung on the H100, 2026-11-27), and the next rung's first seconds judge nothing (starting, the model
build, the FLOP count). Here the two overlap, and nothing that is timed or judged does:

- the rung creates its `released` file (`release`) right after the profiled pass's device work (or after the
  energy pass where one follows: the post-processing is its idle window), and only where a second rung of its size
  fits beside it (device memory, or host memory on a CPU);
- the what-if run then starts the next rung on that device, and creates the previous rung's `exited` file once
  that process has ended;
- the next rung waits for that file (`wait`) before its first warm-up pass, so all its passes run with the device
  and the host to itself.

Both sides meet through two environment variables (not the config, so a rung's config and hash stay those of the
workload and its levers); without them `GpuHandoff` does nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from llm_perf_opt.errors import UserError

if TYPE_CHECKING:  # torch is imported where a device is looked at: the what-if run imports this module early
    import torch

log = logging.getLogger("llm_perf_opt.handoff")

RELEASED_ENV = "LLM_PERF_OPT_RELEASED_FILE"  # the file a rung creates once it no longer uses its device
WAIT_ENV = "LLM_PERF_OPT_WAIT_FOR_FILE"  # the file a rung waits for before its warm-up: the previous one has ended
WAIT_LIMIT_S = 900.0  # the longest a rung waits for the previous one's end before it fails
POLL_S = 0.02
MARGIN_BYTES = 1 << 30  # room left beyond a second rung's peak (CUDA context, fragmentation)


@attrs.define
class GpuHandoff:
    """One rung's side of the handoff: `released` to create when done with the device, `after` to wait for before
    the first warm-up pass (None: nothing to do)."""

    released: Path | None = None
    after: Path | None = None
    waited_s: float | None = None  # how long `wait` waited (None: it has not run)
    handed: bool = False  # `release` created the file

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> GpuHandoff:
        """The handoff the what-if run set up for this process (none outside a what-if run)."""
        env = os.environ if environ is None else environ
        released, after = env.get(RELEASED_ENV), env.get(WAIT_ENV)
        return cls(Path(released) if released else None, Path(after) if after else None)

    def wait(self) -> None:
        """Wait (once) for `after`: the previous rung on this device has ended, or the fork server's compile preload."""
        if self.after is None or self.waited_s is not None:
            return
        started = time.perf_counter()
        while not self.after.exists():
            if time.perf_counter() - started > WAIT_LIMIT_S:
                raise UserError(
                    f"the previous what-if rung on this device did not end within {WAIT_LIMIT_S:g} s of handing it "
                    f"over (no {self.after})",
                    "Its log in the what-if run's logs/ folder says where it stopped; set "
                    "whatif_run.overlap_rungs=false to run each rung only after the previous one has exited",
                )
            time.sleep(POLL_S)
        self.waited_s = time.perf_counter() - started
        log.info("ready for the warm-up passes (waited %.1f s for %s)", self.waited_s, self.after.name)

    def release(self, device: torch.device) -> None:
        """Say the device is free for the next rung (once), where a second rung of this one's size fits beside it."""
        if self.released is None or self.handed:
            return
        if (room := room_for_another(device)) is not None:
            log.info("not starting the next rung before this one ends: %s", room)
            return
        self.released.touch()
        self.handed = True
        log.info("done with %s: the next rung may start while this one finishes", device)


def room_for_another(device: torch.device) -> str | None:
    """Why a second process of this one's size would not fit beside it (None: it would): its allocator's peak
    against the device's free memory, or on the CPU its peak resident size against the host's available memory."""
    if device.type == "cpu":
        from llm_perf_opt.instruments.host_usage import host_peak_rss_bytes

        peak = host_peak_rss_bytes()
        if peak is None:
            return "this rung's peak resident size is not known on this platform"
        free = available_host_bytes() or 0
        what = f"the host has {free / 2**30:.1f} GiB available, this rung's peak was {peak / 2**30:.1f} GiB"
    elif device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_reserved(device)
        what = f"{device} has {free / 2**30:.1f} GiB free, this rung's peak was {peak / 2**30:.1f} GiB"
    else:
        return f"{device.type} devices are handed over only at exit"
    return None if free >= peak + MARGIN_BYTES else what


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None

"""Pin the measuring process to a few CPU cores (`run.cpu_affinity`), for host-paced timings that may be steadier.

Eager decode steps and most of a prefill are paced by the host launching kernels, so host jitter is most of their
run-to-run variation. Off by default: on one H100 machine (2026-11-26) pinning to four cores cut the eager decode
step's within-image CV from 4.5–8.6% to 2.2–3.8%; on another `auto` changed nothing while the host's pace moved
15.6–29.9 ms per step between runs either way (docs/benchmarks-history.md). A CPU run is never pinned automatically
(its compute wants every core). torch's intra-op threads follow the pinned cores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage1 import NOT_PINNED

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = "none"
AUTO_CORES = 4  # cores an automatic pin takes
MIN_CPUS_FOR_AUTO = 2 * AUTO_CORES  # fewer visible CPUs: not pinned (nothing left to the rest of the machine)


@attrs.frozen
class CpuPin:
    """What `run.cpu_affinity` did: the cores (None: not pinned) and why, in words."""

    cores: tuple[int, ...] | None
    how: str

    def describe(self) -> str:
        if self.cores is None:
            return f"{NOT_PINNED} ({self.how})"
        return f"cores {format_cores(self.cores)}, {len(self.cores)} torch threads ({self.how})"


def parse_cores(text: str) -> tuple[int, ...]:
    """`"2-5,8"` → (2, 3, 4, 5, 8); UserError on anything else."""
    cores: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError(part)
            cores.extend(range(first, last + 1))
    except ValueError:
        raise UserError(
            f"run.cpu_affinity={text!r} is not a list of CPU cores",
            "Use run.cpu_affinity=auto, run.cpu_affinity=none, or cores such as run.cpu_affinity='2-5' or '2,3,8'",
        ) from None
    return tuple(sorted(set(cores)))


def format_cores(cores: Sequence[int]) -> str:
    """(2, 3, 4, 5, 8) → "2-5,8"."""
    runs: list[list[int]] = []  # consecutive cores
    for core in sorted(cores):
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def is_off(setting: object) -> bool:
    """Whether a `run.cpu_affinity` value asks for no pinning (none, null, false or empty)."""
    return str(setting).strip().lower() in (OFF, "null", "false", "")


def choose(setting: str, device: torch.device, visible: Sequence[int], local: Sequence[int] | None) -> CpuPin:
    """The cores `setting` asks for among the `visible` ones (`local`: the GPU's NUMA-local cores, when known)."""
    setting = str(setting).strip()
    if is_off(setting):
        return CpuPin(None, "run.cpu_affinity=none")
    if setting.lower() != AUTO:
        cores = parse_cores(setting)
        missing = sorted(set(cores) - set(visible))
        if missing:
            raise UserError(
                f"run.cpu_affinity={setting} names cores this process cannot use: {format_cores(missing)}",
                f"Choose among cores {format_cores(visible)}, or use run.cpu_affinity=auto",
            )
        return CpuPin(cores, "run.cpu_affinity")
    if device.type != "cuda":
        return CpuPin(None, "auto: a CPU run computes on every core")
    pool = [c for c in (local or visible) if c in set(visible)]
    if len(pool) < MIN_CPUS_FOR_AUTO:
        return CpuPin(None, f"auto: only {len(pool)} CPU cores near the GPU, fewer than {MIN_CPUS_FOR_AUTO}")
    start = 1 + (device.index or 0) * AUTO_CORES  # the first core left to the system; later GPUs further along
    if start + AUTO_CORES > len(pool):
        start = 1
    where = "near the GPU" if local else "of the visible ones"
    return CpuPin(tuple(pool[start : start + AUTO_CORES]), f"auto: {AUTO_CORES} cores {where}")


def shares(visible: Sequence[int], count: int) -> list[tuple[int, ...]] | None:
    """`count` disjoint, contiguous slices of the `visible` cores, one per data-parallel process on one host (the
    first core left to the system where every slice still gets two); None when there are fewer cores than
    processes. Without them, N processes' torch threads, N times the cores, wait on each other."""
    ordered = sorted(visible)
    if len(ordered) < count:
        return None
    pool = ordered[1:] if len(ordered) - 1 >= 2 * count else ordered
    size = len(pool) // count
    return [tuple(pool[k * size : (k + 1) * size]) for k in range(count)]


def gpu_local_cpus(device: torch.device) -> list[int] | None:
    """The CPU cores of `device`'s NUMA node, from sysfs (None where it cannot be read)."""
    try:
        props = torch.cuda.get_device_properties(device)
        domain, bus_no, dev = (getattr(props, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        bus = f"{domain:04x}:{bus_no:02x}:{dev:02x}.0"
        text = Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text().strip()
    except (OSError, AttributeError, RuntimeError) as exc:
        log.info("the GPU's local CPU cores are unknown (%s): choosing among the visible ones", exc)
        return None
    return list(parse_cores(text)) if text else None


def pin(setting: str, device: torch.device) -> CpuPin:
    """Apply `run.cpu_affinity` to this process (and torch's intra-op threads); what was done."""
    if not hasattr(os, "sched_setaffinity"):
        return CpuPin(None, "this platform cannot pin threads")
    visible = sorted(os.sched_getaffinity(0))
    local = gpu_local_cpus(device) if device.type == "cuda" and str(setting).lower() == AUTO else None
    chosen = choose(setting, device, visible, local)
    if chosen.cores is not None:
        os.sched_setaffinity(0, chosen.cores)
        torch.set_num_threads(len(chosen.cores))
    log.info("CPU affinity: %s", chosen.describe())
    return chosen

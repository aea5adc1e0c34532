"""Calibration workloads whose work is known exactly, and the rate a CUDA device achieves on them.

- a GEMM (`torch.matmul` of two size² matrices): 2·size³ FLOPs per product;
- a device-to-device copy of a buffer larger than any L2: 2 × its bytes per copy (one read, one write).

`achieved_rate` times back-to-back runs with the toolkit's own timing (`StageRecorder`: CUDA events on the
device's current stream) and takes the median over repeats. `bench/calibration.py` checks that timing against raw
events; `instruments.measured_peaks` turns the rates into achievable peaks, the second denominator of MFU and MBU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import torch

from llm_perf_opt.instruments.timing import StageRecorder, timing_method

GEMM_SIZE = 8192
COPY_GIB = 1.0
ITERS = 20
REPEATS = 5
WARMUP = 3


@attrs.frozen
class Workload:
    """One calibration workload on one device: `run()` does `work_per_run` FLOPs or bytes."""

    name: str
    run: Callable[[], None] = attrs.field(eq=False)
    work_per_run: float
    unit: str  # "FLOP" | "byte"
    description: str  # what runs, for the source of a peak


@attrs.frozen
class AchievedRate:
    """The median rate over `repeats` timings of `iters` back-to-back runs of a workload."""

    value: float  # FLOP/s or B/s
    unit: str  # "FLOP/s" | "B/s"
    description: str  # the workload and how it was timed


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Allow (or forbid) TF32 for float32 matmuls inside the block; the previous setting is restored."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def gemm_workload(device: torch.device, dtype: torch.dtype = torch.bfloat16, size: int = GEMM_SIZE) -> Workload:
    """`torch.matmul` of two random size×size matrices of `dtype` on `device` into a preallocated output."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)

    def run() -> None:
        torch.matmul(a, b, out=out)

    name = str(dtype).removeprefix("torch.")
    return Workload(f"gemm_{name}", run, 2.0 * size**3, "FLOP", f"{size}³ {name} GEMM (torch.matmul)")


def copy_workload(device: torch.device, gib: float = COPY_GIB) -> Workload:
    """A device-to-device copy of a `gib` GiB bf16 buffer (one read and one write of every byte)."""
    elements = int(gib * 2**30) // 2
    src = torch.randn(elements, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)

    def run() -> None:
        dst.copy_(src)

    nbytes = float(src.numel() * src.element_size())
    return Workload("copy", run, 2.0 * nbytes, "byte", f"{gib:g} GiB device-to-device copy (read + write)")


def timed_seconds(run: Callable[[], None], iters: int, device: torch.device) -> float:
    """Seconds for `iters` back-to-back `run()` calls, timed by the toolkit's StageRecorder on `device`."""
    recorder = StageRecorder(device, nvtx=False)
    with recorder.span("calibration"):
        for _ in range(iters):
            run()
    return recorder.totals_ms()["calibration"] / 1e3


def achieved_rate(
    workload: Workload, device: torch.device, *, iters: int = ITERS, repeats: int = REPEATS, warmup: int = WARMUP
) -> AchievedRate:
    """Median over `repeats` of work·iters / time of `iters` runs, after `warmup` untimed runs."""
    for _ in range(warmup):
        workload.run()
    rates = [workload.work_per_run * iters / timed_seconds(workload.run, iters, device) for _ in range(repeats)]
    return AchievedRate(
        value=statistics.median(rates),
        unit=f"{workload.unit}/s".replace("byte/s", "B/s"),
        description=f"{workload.description}, median of {repeats} × {iters} runs, {timing_method(device)}",
    )

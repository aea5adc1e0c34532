"""GPU activity per forward pass: kernels launched, summed kernel time, GPU-busy time (the union of the kernel
intervals) and wall time, for the prefill and each decode step of the profiled pass.

Plain numbers in, independent of the profiler: `instruments.torch_profiler` ties each kernel to its step through the
launch call (correlation id), never by GPU time against host time (launches are asynchronous: a step's kernels may
run long after its host span ended)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from llm_perf_opt.records.stage1 import DecodeActivity, StepActivity

PREFILL_STEP = 0  # step index of the prefill; decode steps are 1, 2, … (as `around_step` numbers them)

# (step index, kernel start in µs, kernel end in µs), GPU timestamps on the profiler's clock
KernelSpan = tuple[int, float, float]


def busy_us(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of `intervals` clipped to [lo, hi] (overlapping kernels counted once)."""
    merged: list[list[float]] = []  # [start, end] of each run of overlapping intervals
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum((end - start for start, end in merged), 0.0)


def step_activities(
    kernels: Iterable[KernelSpan], host_spans: Mapping[int, tuple[float, float]]
) -> dict[int, StepActivity]:
    """Per step (the keys of `host_spans`, each its host span in µs on the same clock): its kernels, their summed
    time, the busy time (the union of its kernel intervals in its window) and the wall time. A step's window starts
    at its host span start, or at the previous step's end if its GPU work was still running then (the queue carries
    over), and ends at its last kernel's end or its host span end, whichever is later."""
    by_step: dict[int, list[tuple[float, float]]] = {step: [] for step in host_spans}
    for step, start, end in kernels:
        if step in by_step:
            by_step[step].append((start, end))
    out: dict[int, StepActivity] = {}
    previous_end: float | None = None
    for step in sorted(host_spans):
        host_start, host_end = host_spans[step]
        spans = by_step[step]
        start = host_start if previous_end is None else max(host_start, previous_end)
        start = min([start, *(s for s, _ in spans)])  # a kernel never runs before its launch; guard clock skew
        end = max([start, host_end, *(e for _, e in spans)])  # a host span that ended while the queue ran: 0
        out[step] = StepActivity(
            kernels=len(spans),
            kernel_ms=sum(e - s for s, e in spans) / 1e3,
            busy_ms=busy_us(spans, start, end) / 1e3,
            wall_ms=(end - start) / 1e3,
        )
        previous_end = end
    return out


def decode_activity(
    kernels: Sequence[KernelSpan], host_spans: Mapping[int, tuple[float, float]], *, unattributed: int, method: str
) -> DecodeActivity | None:
    """Decode-step statistics and the prefill's activity; None when no decode step was profiled."""
    per_step = step_activities(kernels, host_spans)
    decode = [a for step, a in sorted(per_step.items()) if step != PREFILL_STEP]
    if not decode:
        return None
    n = len(decode)
    busy, wall = sum(a.busy_ms for a in decode), sum(a.wall_ms for a in decode)
    return DecodeActivity(
        steps=n,
        kernels_mean=sum(a.kernels for a in decode) / n,
        kernels_min=min(a.kernels for a in decode),
        kernels_max=max(a.kernels for a in decode),
        kernel_ms_mean=sum(a.kernel_ms for a in decode) / n,
        busy_ms_mean=busy / n,
        wall_ms_mean=wall / n,
        busy_fraction=busy / wall if wall > 0 else 0.0,
        prefill=per_step.get(PREFILL_STEP),
        unattributed_kernels=unattributed,
        method=method,
    )

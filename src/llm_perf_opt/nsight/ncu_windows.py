"""Nsight Compute's launch windows: which launches of the ncu workload each round and bytes pass profiles
(`--launch-skip`, `--launch-count`), from the kernel counts of the nsys trace. Pure arithmetic, no tools.

A round's skip and count apply to the launches that pass both of its filters (its kernel names, inside the stage's
NVTX range); a bytes pass's to every launch inside the stage's range. The ncu workload runs one timed pass of one
forward (one image, or one batch) and decodes `max_new_tokens - 1` steps (the first token comes from prefill).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage2 import NcuStageTarget


@attrs.frozen
class BytesWindow:
    """The launches a bytes pass profiles: the instance in words, launch skip and count, kernels expected."""

    instance: str
    skip: int
    count: int
    expected: int


def launch_cap(kernels: int, per_kernel: int) -> int:
    """The most launches one window of `kernels` kernel names takes: `per_kernel` each, x4 for their interleaving."""
    return max(1, per_kernel * kernels * 4)


def per_instance(names: Sequence[str], target: NcuStageTarget) -> dict[str, float]:
    """Launches of each of `names` in one stage instance (a prefill, or a decode step), estimated from nsys."""
    return {n: target.calls.get(n, 0) / target.instances for n in names}


def rarest_fitting(names: Sequence[str], target: NcuStageTarget, per_kernel: int) -> list[str]:
    """The rarest of `names` whose launches in one stage instance all fit in one launch window (at least one),
    so a later round catches kernels that frequent ones crowded out of the first window."""
    launches = per_instance(names, target)
    chosen: list[str] = []
    total = 0.0
    for name in sorted(names, key=launches.__getitem__):
        if chosen and total + launches[name] > launch_cap(len(chosen) + 1, per_kernel):
            break
        chosen.append(name)
        total += launches[name]
    return chosen


def launch_window(
    stage: str, names: Sequence[str], target: NcuStageTarget, per_kernel: int, max_new_tokens: int
) -> tuple[int, int]:
    """(launch skip, launch count) of a round over kernels `names` in `stage`.

    One instance (a prefill, or a decode step) launches the rounded per-instance sum of their nsys calls; the count
    covers one instance, capped at :func:`launch_cap`. Decode skips `(max_new_tokens - 1) // 2` steps, to a middle
    step of the ncu workload (a steady state); prefill starts at its beginning.
    """
    one = max(1, round(sum(target.calls.get(n, 0) for n in names) / target.instances))
    count = min(one, launch_cap(len(names), per_kernel))
    if stage == vocab.DECODE:
        return one * ((max_new_tokens - 1) // 2), count
    return 0, count


def prefill_bytes_window(stage: str, counts: Sequence[int], batch_size: int) -> BytesWindow:
    """The bytes pass over the first forward's `stage` (prefill or a vision sub-stage): `counts` are its kernels in
    each instance of the nsys trace. Nothing follows it inside the range, so the window is twice the largest."""
    forward = "the first image" if batch_size == 1 else f"the first batch ({batch_size} inputs)"
    return BytesWindow(f"the {stage} of {forward}", 0, 2 * max(counts, default=0), counts[0] if counts else 0)


def decode_bytes_window(steps: Sequence[int], max_new_tokens: int) -> BytesWindow:
    """The bytes pass over the ncu workload's middle decode step: `steps` are the kernels of each step of the nsys
    trace's first pass (their mean stands in for steps past its end); the skip covers the steps before it."""
    total = max_new_tokens - 1
    if total < 1 or not steps:
        return BytesWindow("a decode step (the ncu workload decodes none)", 0, 0, 0)
    middle = (total - 1) // 2
    mean = round(sum(steps) / len(steps))
    per_step = [*steps[: middle + 1], *[mean] * max(0, middle + 1 - len(steps))]
    step = per_step[middle]
    return BytesWindow(f"decode step {middle + 1} of {total}", sum(per_step[:middle]), step, step)

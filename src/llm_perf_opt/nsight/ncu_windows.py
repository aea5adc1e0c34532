"""The stage instances Nsight Compute's bytes pass measures, in words, with the kernels the nsys trace counted in
them (what the pass should find). Pure arithmetic, no tools.

The ncu workload runs one timed pass of one forward (one image, or one batch) and decodes `max_new_tokens - 1`
steps (the first token comes from prefill); its CUDA profiler window (`instruments.profiler_window`) takes that pass's
prefill and its middle decode step.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llm_perf_opt.instruments.profiler_window import middle_step


@attrs.frozen
class BytesWindow:
    """One stage instance of the profiler window: which, in words, and the kernels nsys counted in it."""

    instance: str
    expected: int


def prefill_bytes_window(stage: str, counts: Sequence[int], batch_size: int) -> BytesWindow:
    """The first forward's `stage` (prefill or a vision sub-stage): `counts` are its kernels in each instance of the
    nsys trace."""
    forward = "the first image" if batch_size == 1 else f"the first batch ({batch_size} inputs)"
    return BytesWindow(f"the {stage} of {forward}", counts[0] if counts else 0)


def decode_bytes_window(steps: Sequence[int], max_new_tokens: int) -> BytesWindow:
    """The ncu workload's middle decode step: `steps` are the kernels of each step of the nsys trace's first pass
    (their mean stands in for steps past its end)."""
    total = max_new_tokens - 1
    middle = middle_step(total)
    if middle is None or not steps:
        return BytesWindow("a decode step (the ncu workload decodes none)", 0)
    expected = steps[middle] if middle < len(steps) else round(sum(steps) / len(steps))
    return BytesWindow(f"decode step {middle + 1} of {total}", expected)

"""The CUDA profiler window: one prefill and one decode step of the first timed pass, bracketed with
cudaProfilerStart/Stop so that `ncu --profile-from-start off` sees those two stage instances and nothing else.

Stage 2 profiles every kernel of both instances in one Nsight Compute process (and its targeted kernels in one
more), instead of one process per stage and launch window counted from the nsys trace. The decode step is the
middle one of the pass, `(steps - 1) // 2` counted from 0, a steady state past the first step; a pass that decodes
nothing has the prefill alone. The window opens once per process: later passes run outside it.
"""

from __future__ import annotations

from collections.abc import Callable

from llm_perf_opt.records import vocabulary as vocab


def middle_step(decode_steps: int) -> int | None:
    """The decode step (from 0) the window takes out of `decode_steps`, or None when there is none."""
    return (decode_steps - 1) // 2 if decode_steps >= 1 else None


def _cuda_start() -> None:
    import torch

    torch.cuda.cudart().cudaProfilerStart()


def _cuda_stop() -> None:
    import torch

    torch.cuda.cudart().cudaProfilerStop()


class ProfilerWindow:
    """Opens the CUDA profiler around the first PREFILL span and around the middle DECODE_STEP span after it. A
    :class:`~llm_perf_opt.instruments.timing.StageRecorder` calls :meth:`begin` and :meth:`end` with each span's name;
    `start`/`stop` default to cudaProfilerStart/Stop (tests pass their own)."""

    def __init__(
        self, decode_steps: int, *, start: Callable[[], None] = _cuda_start, stop: Callable[[], None] = _cuda_stop
    ) -> None:
        self.middle = middle_step(decode_steps)
        self._start, self._stop = start, stop
        self._open: str | None = None  # the span the window is open around
        self._seen_prefill = False
        self._steps = 0  # decode steps begun since the prefill
        self.closed = False  # both instances done: the window never opens again

    def begin(self, name: str) -> None:
        """A span named `name` begins: open the window when it is one of the two instances."""
        if self.closed or self._open is not None:
            return
        if name == vocab.PREFILL and not self._seen_prefill:
            self._seen_prefill = True
            self._open = name
        elif name == vocab.DECODE_STEP and self._seen_prefill:
            self._steps += 1
            if self._steps - 1 == self.middle:
                self._open = name
        if self._open is not None:
            self._start()

    def end(self, name: str) -> None:
        """A span named `name` ends: close the window when it was open around it."""
        if self._open != name:
            return
        self._stop()
        self._open = None
        if name == vocab.DECODE_STEP or self.middle is None:
            self.closed = True

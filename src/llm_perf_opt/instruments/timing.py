"""Stage timing: CUDA events on the GPU, `time.perf_counter` on the CPU, NVTX ranges around both.

A :class:`StageRecorder` records spans by name. On CUDA each mark is an event recorded on the current stream
of the recorder's device (the model's: `torch.cuda.current_stream(device)`, whatever the current device is), so a
span measures GPU time in that stream's order (including idle gaps while the host is still launching, which is
what a launch-bound decode step costs). An event recorded on another GPU's stream would instead time that GPU,
idle, i.e. the host's enqueue order. Nothing synchronises until :meth:`StageRecorder.spans_ms`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import torch

from llm_perf_opt.instruments import nvtx_ranges
from llm_perf_opt.instruments.profiler_window import ProfilerWindow


def timing_method(device: torch.device) -> str:
    """How stage times are measured on `device` (said in every report)."""
    return "CUDA events (torch.cuda.Event)" if device.type == "cuda" else "time.perf_counter (CPU)"


@attrs.define
class _Span:
    name: str
    start: object
    end: object | None = None


class StageRecorder:
    """Records named, possibly nested spans; each span is also an NVTX range. `window`: the CUDA profiler window
    the spans open and close (Stage 2's Nsight Compute workloads), if any."""

    def __init__(self, device: torch.device, *, nvtx: bool = True, window: ProfilerWindow | None = None) -> None:
        self.device = device
        self.uses_cuda_events = device.type == "cuda"
        self.nvtx = nvtx
        self.window = window
        self._spans: list[_Span] = []
        self._open: dict[str, list[_Span]] = {}

    @property
    def method(self) -> str:
        """How time is measured, for the report."""
        return timing_method(self.device)

    def _mark(self) -> object:
        if self.uses_cuda_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def begin(self, name: str) -> None:
        """Open a span named `name` (spans of one name may not overlap themselves)."""
        if self.nvtx:
            nvtx_ranges.push(name)
        if self.window is not None:
            self.window.begin(name)
        span = _Span(name, self._mark())
        self._spans.append(span)
        self._open.setdefault(name, []).append(span)

    def end(self, name: str) -> None:
        """Close the innermost open span named `name`."""
        stack = self._open.get(name)
        if not stack:
            raise RuntimeError(f"StageRecorder.end({name!r}) without a matching begin")
        stack.pop().end = self._mark()
        if self.window is not None:
            self.window.end(name)
        if self.nvtx:
            nvtx_ranges.pop()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Context manager form of begin/end."""
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def spans_ms(self) -> list[tuple[str, float]]:
        """Every closed span as (name, milliseconds), in start order. Synchronises the device once."""
        if self.uses_cuda_events:
            torch.cuda.synchronize(self.device)
        out: list[tuple[str, float]] = []
        for span in self._spans:
            if span.end is None:
                continue
            if self.uses_cuda_events:
                ms = float(span.start.elapsed_time(span.end))  # type: ignore[attr-defined]
            else:
                ms = (float(span.end) - float(span.start)) * 1e3  # type: ignore[arg-type]
            out.append((span.name, ms))
        return out

    def totals_ms(self) -> dict[str, float]:
        """Sum of span times per name."""
        totals: dict[str, float] = {}
        for name, ms in self.spans_ms():
            totals[name] = totals.get(name, 0.0) + ms
        return totals

    def reset(self) -> None:
        """Forget every span (open spans included)."""
        self._spans.clear()
        self._open.clear()


class NullRecorder(StageRecorder):
    """Records nothing and emits no NVTX: the uninstrumented baseline for overhead benchmarks."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, nvtx=False)

    def begin(self, name: str) -> None:
        """Do nothing."""

    def end(self, name: str) -> None:
        """Do nothing."""

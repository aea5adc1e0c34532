"""DRAM bytes from Nsight Systems' sampled GPU metrics (`nsys profile --gpu-metrics-devices ...`).

Each sample of "DRAM Read Bandwidth [Throughput %]" (and Write) is a counter delta over the interval since the
previous sample, in % of the GPU's DRAM peak, so the traffic is a piecewise-constant rate: its integral over any
time window is exact up to that scale, with no per-kernel profiling. A stage instance's bytes are the integral over
its kernels' busy intervals (the union of their GPU intervals), so the host gaps of a launch-bound stage, where the
memory still refreshes and other engines may move data, stay out; a kernel that shares a sample with a gap is still
blurred by the sample's length (10 µs at 100 kHz).

On an H100 (2026-11-26, v1, the A4 page) the whole-window integral gave SAM's bytes within 2% of Nsight Compute's
bytes pass and the prefill's within 6% (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

READ_METRIC = "DRAM Read Bandwidth [Throughput %]"
WRITE_METRIC = "DRAM Write Bandwidth [Throughput %]"


@attrs.frozen
class SampledRate:
    """One metric's samples as a cumulative integral: `times_ns` (sample ends, increasing) and `cumulative`, the
    integral of (percent / 100) over time in seconds up to each."""

    times_ns: np.ndarray
    cumulative: np.ndarray

    @classmethod
    def from_samples(cls, times_ns: Sequence[int], percents: Sequence[float]) -> SampledRate:
        """Samples in time order, each `percent` holding over (previous sample, its time]."""
        times = np.asarray(times_ns, dtype=np.float64)
        values = np.asarray(percents, dtype=np.float64) / 100.0
        if times.size == 0:
            return cls(times, times)
        steps = np.diff(times, prepend=times[0]) * 1e-9 * values  # the first sample has no interval of its own
        return cls(times, np.cumsum(steps))

    @property
    def period_ns(self) -> float | None:
        """The median time between samples (None with fewer than 2)."""
        return float(np.median(np.diff(self.times_ns))) if self.times_ns.size > 1 else None

    def integral(self, intervals: Sequence[tuple[int, int]]) -> float:
        """Seconds at 100% over the union of `intervals` ([start, end) in ns, in any order, may overlap)."""
        if self.times_ns.size < 2:
            return 0.0
        merged = merge_intervals(intervals)
        if not merged:
            return 0.0
        bounds = np.asarray(merged, dtype=np.float64)
        at = np.interp(bounds, self.times_ns, self.cumulative)  # linear between samples: the rate is constant there
        return float(np.sum(at[:, 1] - at[:, 0]))


def merge_intervals(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of `intervals` as disjoint, sorted intervals (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out

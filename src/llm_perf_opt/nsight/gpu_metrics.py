"""DRAM bytes from Nsight Systems' sampled GPU metrics (`nsys profile --gpu-metrics-devices ...`).

Each sample of "DRAM Read Bandwidth [Throughput %]" (and Write) is a counter delta over the interval since the
previous sample, in % of the GPU's DRAM peak, so the traffic is a piecewise-constant rate: its integral over any
time window is exact up to that scale, with no per-kernel profiling. A stage instance's bytes are the integral over
its kernels' busy intervals (the union of their GPU intervals), so the host gaps of a launch-bound stage, where the
memory still refreshes and other engines may move data, stay out; a kernel that shares a sample with a gap is still
blurred by the sample's length (10 µs at 100 kHz).

Samples go missing: on an H100 at 100 kHz (2026-11-26) nsys dropped about half of a 33-s run's samples in gaps of
about 1 s each. Across a gap the rate is unknown, so an instance whose kernels touch one (or lie outside the sampled
span) is left out rather than integrated over a guess (`covers`). Against kernels of known traffic (bench/
nsys_dram_scale.py) the covered integral gave 0.99x the bytes at the datasheet peak (docs/benchmarks-history.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

READ_METRIC = "DRAM Read Bandwidth [Throughput %]"
WRITE_METRIC = "DRAM Write Bandwidth [Throughput %]"
GAP_PERIODS = 3.0  # a step longer than this many median sample periods means samples were dropped there


@attrs.frozen
class SampledRate:
    """One metric's samples as a cumulative integral: `times_ns` (sample ends, increasing) and `cumulative`, the
    integral of (percent / 100) over time in seconds up to each."""

    times_ns: np.ndarray
    cumulative: np.ndarray
    # gaps_before[i]: how many steps up to sample i are longer than GAP_PERIODS median periods (samples dropped)
    gaps_before: np.ndarray = attrs.field(factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def from_samples(cls, times_ns: Sequence[int], percents: Sequence[float]) -> SampledRate:
        """Samples in time order, each `percent` holding over (previous sample, its time]."""
        times = np.asarray(times_ns, dtype=np.float64)
        values = np.asarray(percents, dtype=np.float64) / 100.0
        if times.size == 0:
            return cls(times, times)
        lengths = np.diff(times, prepend=times[0])
        steps = lengths * 1e-9 * values  # the first sample has no interval of its own
        period = float(np.median(lengths[1:])) if times.size > 1 else 0.0
        dropped = (lengths > GAP_PERIODS * period).astype(np.int64)
        return cls(times, np.cumsum(steps), np.cumsum(dropped))

    @property
    def period_ns(self) -> float | None:
        """The median time between samples (None with fewer than 2)."""
        return float(np.median(np.diff(self.times_ns))) if self.times_ns.size > 1 else None

    @property
    def dropped_ns(self) -> float:
        """Time inside gaps where samples went missing (steps longer than GAP_PERIODS median periods)."""
        if self.times_ns.size < 2:
            return 0.0
        lengths = np.diff(self.times_ns)
        return float(lengths[np.diff(self.gaps_before) > 0].sum())

    @property
    def span_ns(self) -> float:
        """From the first sample to the last."""
        return float(self.times_ns[-1] - self.times_ns[0]) if self.times_ns.size else 0.0

    def covers(self, intervals: Sequence[tuple[int, int]]) -> bool:
        """Whether every one of `intervals` lies inside the sampled span with no dropped samples under it (only
        then is its integral a measurement)."""
        times = self.times_ns
        if times.size < 2:
            return False
        for start, end in merge_intervals(intervals):
            first = int(np.searchsorted(times, start, side="left"))  # the sample whose step holds `start`
            last = int(np.searchsorted(times, end, side="left"))
            if first < 1 or last >= times.size or self.gaps_before[last] != self.gaps_before[first - 1]:
                return False
        return True

    def integral(self, intervals: Sequence[tuple[int, int]]) -> float:
        """Seconds at 100% over the union of `intervals` ([start, end) in ns, in any order, may overlap)."""
        merged = merge_intervals(intervals)
        if self.times_ns.size < 2 or not merged:
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

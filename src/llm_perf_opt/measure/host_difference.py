"""Whether two runs' hosts behaved alike over their timed passes, from each run's own host usage
(`Stage1Metrics.host_usage`, `instruments.host_usage`).

A host-paced stage (a CPU run, an eager decode step, preprocessing) moves with the host's load as much as with a
setting: on a shared machine one run may get its cores to itself while the other shares them. Three figures of each
run's host line are compared against the baseline's: CPU per pass (user + system, every thread), CPU against wall
(the cores the process kept busy) and involuntary context switches per second of wall time (how often the scheduler
took a core away). A figure *differs* when the larger value is at least `DIFFERS_RATIO` times the smaller; switches
count only from `MIN_SWITCHES_PER_S` per second in the busier run. More CPU per pass for the same work is what a
loaded host costs (threads spin while they wait for a core), but a setting that changes the work changes it too, so a
difference is said, not blamed: the comparison marks host-paced verdicts whose hosts differed and suggests pinning the
threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from llm_perf_opt.records.stage1 import HostUsage

DIFFERS_RATIO = 1.5
MIN_SWITCHES_PER_S = 10.0


@attrs.frozen
class HostFigures:
    """A run's host usage as the figures compared between runs."""

    cpu_per_pass_s: float
    wall_per_pass_s: float
    involuntary_per_pass: float

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time: the cores the process kept busy on average."""
        return self.cpu_per_pass_s / self.wall_per_pass_s if self.wall_per_pass_s > 0 else 0.0

    @property
    def switches_per_s(self) -> float:
        return self.involuntary_per_pass / self.wall_per_pass_s if self.wall_per_pass_s > 0 else 0.0


def host_figures(usage: HostUsage | None) -> HostFigures | None:
    """The compared figures of a run's host usage (None: not recorded, or no timed pass)."""
    if usage is None or not usage.passes:
        return None
    return HostFigures(
        cpu_per_pass_s=usage.per_pass(usage.user_cpu_s + usage.system_cpu_s),
        wall_per_pass_s=usage.per_pass(usage.wall_s),
        involuntary_per_pass=usage.per_pass(usage.involuntary_switches),
    )


def _differs(a: float, b: float, floor: float = 0.0) -> bool:
    """Whether the larger of `a` and `b` is at least DIFFERS_RATIO times the smaller (and at least `floor`)."""
    low, high = sorted((a, b))
    return high >= floor and high > 0 and (low <= 0 or high / low >= DIFFERS_RATIO)


# Each compared figure: its name, how it is shown, its value, and the floor below which it does not count.
_FIGURES: tuple[tuple[str, Callable[[HostFigures], str], Callable[[HostFigures], float], float], ...] = (
    ("host CPU per pass", lambda f: f"{f.cpu_per_pass_s:.2f} s", lambda f: f.cpu_per_pass_s, 0.0),
    (
        "host CPU against wall",
        lambda f: f"{f.cpu_per_pass_s:.2f} s in {f.wall_per_pass_s:.2f} s ({f.cpu_share:.2f} cores)",
        lambda f: f.cpu_share,
        0.0,
    ),
    (
        "host involuntary switches",
        lambda f: f"{f.switches_per_s:,.0f}/s ({f.involuntary_per_pass:,.0f} per pass)",
        lambda f: f.switches_per_s,
        MIN_SWITCHES_PER_S,
    ),
)
FIGURE_NAMES = tuple(name for name, _, _, _ in _FIGURES)


def shown(figures: HostFigures | None, name: str) -> str | None:
    """The figure `name` of a run as the differences table shows it (None: not recorded)."""
    show = next(s for n, s, _, _ in _FIGURES if n == name)
    return None if figures is None else show(figures)


def differing(base: HostFigures | None, other: HostFigures | None) -> tuple[str, ...]:
    """The names of the figures that differ between two runs (none when either did not record its host usage)."""
    if base is None or other is None:
        return ()
    return tuple(name for name, _, value, floor in _FIGURES if _differs(value(base), value(other), floor))


def described(base: tuple[str, HostFigures | None], other: tuple[str, HostFigures | None]) -> tuple[str, ...]:
    """Each figure that differs between two (label, figures) runs in words: `host CPU per pass: 0.50 s (a) vs
    2.66 s (b)`."""
    (base_label, b), (label, o) = base, other
    return tuple(f"{n}: {shown(b, n)} ({base_label}) vs {shown(o, n)} ({label})" for n in differing(b, o))


def run_differences(runs: Sequence[tuple[str, HostUsage | None]]) -> tuple[tuple[str, ...], ...]:
    """Per (label, host usage) run after the first (the baseline), its figures that differ from the baseline's, in
    words (`described`)."""
    figures = [(label, host_figures(usage)) for label, usage in runs]
    return tuple(described(figures[0], other) for other in figures[1:])

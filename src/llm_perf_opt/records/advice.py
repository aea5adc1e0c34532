"""Advice as data: one record per lever "What to try" proposes (`Advice`), and the calibration of its predictions
(`Calibration`, shipped as `advice_calibration.yaml`; `calibrated` folds a measured saving into it). Each lever acts
on some measured time it can at most remove (its `bound_ms`: the time above a stage's or module's floor, the GPU's
idle time between launches, or the per-page share a larger batch spreads), and saves the share of it that levers of
its kind have saved when measured (`LeverCalibration.factor`), within the shares measured so far (`low`..`high`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

import attrs
import yaml

from llm_perf_opt.records.io import converter

# What a prediction rests on (`Advice.basis`).
BASIS_FLOOR = "time above floor"  # measured time minus the analytic floor of the same work
BASIS_IDLE = "launch-bound idle time"  # the GPU's idle time between a step's kernels (profiled pass)
BASIS_MEMORY = "memory headroom"  # a larger batch that fits, spreading the per-pass time over more pages

# The figure a lever serves (`Advice.objective`), each in ms per page.
PAGE_LATENCY = "page latency"  # a page's time to last token
FIRST_TOKEN = "first token"  # a page's time to first token
THROUGHPUT = "throughput"  # time per page (1 / pages per second)
OBJECTIVES = (PAGE_LATENCY, FIRST_TOKEN, THROUGHPUT)

CALIBRATION_FILE = "advice_calibration.yaml"


def _ratio(before: float, saving: float) -> float | None:
    """before / (before − saving): the speed-up of a figure that loses `saving`; None where nothing is left."""
    return before / (before - saving) if before > 0 and saving < before else None


@attrs.frozen
class Advice:
    """One lever to try, with what it is predicted to save on a page and how that was worked out.

    The saving is `factor × bound_ms` of the lever kind's calibration, its interval `low × bound_ms`..`high ×
    bound_ms`; `speedup` is the objective's time per page now over that time less the saving."""

    lever: str  # the overrides to set ("runtime.batch_vision=true"), or a named code change where none exists
    overrides: tuple[str, ...] = ()  # the `stage1-run` overrides it sets; empty for a code change
    kind: str = ""  # the lever's kind, the key of its calibration (e.g. "cuda_graphs", "batch_vision")
    acts_on: tuple[str, ...] = ()  # the stages or modules it changes
    objective: str = PAGE_LATENCY
    objective_ms: float = 0.0  # the objective's time per page in this run
    basis: str = BASIS_FLOOR
    bound_ms: float = 0.0  # per page: the most the lever can remove on its basis
    saving_ms: float = 0.0  # per page, predicted
    saving_low_ms: float = 0.0
    saving_high_ms: float = 0.0
    because: str = ""  # the figures behind the bound, in a few words ("vision 41.2 ms/page, floor 5.1 ms")
    command: str = ""  # the command that measures it on this run's workload
    # The parts of the time per page its bound lies in (`records.stage1.PAGE_*`), where a measured run of the lever
    # looks for its saving (`measure.advice.measured_saving`); empty: the whole objective
    parts: tuple[str, ...] = ()

    @property
    def code_change(self) -> bool:
        return not self.overrides

    @property
    def speedup(self) -> float | None:
        return _ratio(self.objective_ms, self.saving_ms)

    @property
    def speedup_low(self) -> float | None:
        return _ratio(self.objective_ms, self.saving_low_ms)

    @property
    def speedup_high(self) -> float | None:
        return _ratio(self.objective_ms, self.saving_high_ms)


@attrs.frozen
class LeverCalibration:
    """The share of its bound a lever kind saves: `factor` predicted, `low`..`high` the interval; `samples`: measured
    savings folded in (0: a prior, set by hand); `note`: where the figures come from."""

    factor: float
    low: float
    high: float
    samples: int = 0
    note: str = ""
    sources: tuple[str, ...] = ()  # the what-if runs (run ids) whose measured savings were folded in

    def saving(self, bound_ms: float) -> tuple[float, float, float]:
        """(predicted, low, high) ms for a bound of `bound_ms`."""
        return self.factor * bound_ms, self.low * bound_ms, self.high * bound_ms


# A kind the calibration does not name: anything from nothing to the whole bound, half of it expected.
UNCALIBRATED = LeverCalibration(factor=0.5, low=0.0, high=1.0, note="no calibration for this kind of lever")


@attrs.frozen
class Calibration:
    """The calibration of every lever kind (`advice_calibration.yaml`)."""

    kinds: Mapping[str, LeverCalibration] = attrs.field(factory=dict)

    def of(self, kind: str) -> LeverCalibration:
        return self.kinds.get(kind, UNCALIBRATED)


def calibrated(
    calibration: Calibration, kind: str, bound_ms: float, measured_saving_ms: float, source: str | None = None
) -> Calibration:
    """The calibration with one measured saving of a `kind` lever folded in: its realised share r = measured saving
    / bound (a loss counts as no saving) becomes part of the factor (the mean of every sample: (factor × n + r) /
    (n + 1), so a hand-set prior, n = 0, gives way to the first sample) and widens the interval to hold r; `source`
    (the what-if run it was measured in) joins the kind's sources. A bound of 0 teaches nothing."""
    if bound_ms <= 0:
        return calibration
    share = max(measured_saving_ms, 0.0) / bound_ms
    old = calibration.of(kind)
    n = old.samples
    factor = (old.factor * n + share) / (n + 1)
    said = f"{source or 'a what-if run'}: {max(measured_saving_ms, 0.0):,.1f} of a {bound_ms:,.1f} ms/page bound saved"
    if measured_saving_ms < 0:
        said += f" (it cost {-measured_saving_ms:,.1f} ms/page)"
    note = f"{old.note}; {said}" if n and old.note else said  # a prior's note goes with the prior
    sources = (*old.sources, source) if source is not None and source not in old.sources else old.sources
    new = LeverCalibration(factor, min(old.low, share), max(old.high, share), samples=n + 1, note=note, sources=sources)
    return Calibration({**calibration.kinds, kind: new})


def load_calibration(text: str, where: str = CALIBRATION_FILE) -> Calibration:
    """A calibration from YAML text (`where` names it in an error)."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict):
        raise ValueError(f"{where}: expected a top-level 'kinds' mapping of lever kind -> factor, low, high")
    calibration = converter.structure(data, Calibration)
    for kind, c in calibration.kinds.items():
        if not 0 <= c.low <= c.factor <= c.high:
            raise ValueError(f"{where}: {kind}: needs 0 <= low <= factor <= high, got {c.low}, {c.factor}, {c.high}")
    return calibration


@functools.cache
def shipped_calibration() -> Calibration:
    """The calibration shipped in the package (`advice_calibration.yaml` beside this module), read once."""
    text = resources.files("llm_perf_opt.records").joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")
    return load_calibration(text)


# The comment the shipped file opens with (`dump_calibration` writes it again).
CALIBRATION_HEADER = """\
# The share of its bound each kind of lever saves (llm_perf_opt.records.advice): predicted saving = factor × bound,
# interval low × bound .. high × bound. samples: measured savings folded in by `records.advice.calibrated` (0: a
# prior set by hand); sources: the what-if runs they were measured in. Update with
# `scripts/update_advice_calibration.py <perf-whatif whatif=advised folder>...` (docs/guide/whatif.md).
"""


def dump_calibration(calibration: Calibration) -> str:
    """The calibration as YAML, the shipped file's layout (its opening comment, then the kinds; a kind's sources
    only where it has some)."""
    plain = converter.unstructure(calibration)
    for entry in plain["kinds"].values():
        if not entry.get("sources"):
            entry.pop("sources", None)
        for key in ("factor", "low", "high"):
            entry[key] = round(entry[key], 3)
    return CALIBRATION_HEADER + str(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, width=120))

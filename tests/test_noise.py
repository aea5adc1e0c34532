"""Intervals over passes and the noise verdict, on the pass structure of a real H100 run."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from helpers import FIXTURES
from llm_perf_opt.measure.aggregate import stage_stats
from llm_perf_opt.measure.noise import BEYOND, NOT_MEASURED, TOO_FEW, WITHIN, noise_verdict
from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.io import converter
from llm_perf_opt.records.stage1 import ImageRecord

VISION = ("vision/sam", "vision/encoder", "vision/projector")


@pytest.fixture(scope="module")
def h100_records() -> tuple[ImageRecord, ...]:
    """25 timed passes (5 images × 5 passes, 31 decode steps each) of the full-size model on an H100."""
    data = json.loads((FIXTURES / "metrics" / "h100_full_stage1.json").read_text())
    return tuple(converter.structure(r, ImageRecord) for r in data["records"])


def _stage(records: Sequence[ImageRecord], stage: str) -> Summary:
    return next(s.summary for s in stage_stats(records, VISION) if s.stage == stage)


def _pooled(records: Sequence[ImageRecord]) -> Summary:
    """Every decode step of every pass pooled (the old rule): its `n` counts steps, taken as independent."""
    return summarize([step for r in records for step in r.decode_step_ms], "ms")


def _width(s: Summary) -> float:
    assert s.ci95_low is not None and s.ci95_high is not None
    return s.ci95_high - s.ci95_low


def test_decode_step_interval_is_over_pass_means(h100_records: tuple[ImageRecord, ...]) -> None:
    step = _stage(h100_records, vocab.DECODE_STEP)
    pass_means = [sum(r.decode_step_ms) / len(r.decode_step_ms) for r in h100_records]
    assert step == summarize(pass_means, "ms")
    assert step.n == 25  # passes, not the 775 steps
    pooled = _pooled(h100_records)
    assert pooled.n == 775
    # The pooled interval treats 31 correlated steps of a pass as independent: far too narrow.
    assert _width(step) > 3 * _width(pooled)
    assert step.ci95_low is not None and step.ci95_high is not None
    assert step.ci95_low == pytest.approx(18.53, abs=0.01) and step.ci95_high == pytest.approx(20.29, abs=0.01)


def test_every_stage_counts_passes(h100_records: tuple[ImageRecord, ...]) -> None:
    for stat in stage_stats(h100_records, VISION):
        assert stat.summary.n == len(h100_records), stat.stage
        assert stat.summary.ci95_low is not None and stat.summary.ci95_low > 0, stat.stage


def test_same_config_halves_are_within_noise_on_decode_step(h100_records: tuple[ImageRecord, ...]) -> None:
    # Two "runs" of one configuration: the first two passes of each image, and the last three.
    early = [r for r in h100_records if r.repeat < 2]
    late = [r for r in h100_records if r.repeat >= 2]
    assert noise_verdict(_stage(early, vocab.DECODE_STEP), _stage(late, vocab.DECODE_STEP)) == WITHIN
    # Pooling the steps (the old rule) called the same configuration different.
    assert noise_verdict(_pooled(early), _pooled(late)) == BEYOND


def test_noise_verdict_rules() -> None:
    base = summarize([10.0, 10.5, 11.0, 10.2], "ms")
    slower = summarize([14.0, 14.5, 15.0, 14.2], "ms")
    overlapping = summarize([10.4, 11.5, 12.0, 10.9], "ms")
    assert noise_verdict(slower, base) == BEYOND
    assert noise_verdict(base, slower) == BEYOND
    assert noise_verdict(overlapping, base) == WITHIN
    assert noise_verdict(summarize([20.0, 21.0], "ms"), base) == TOO_FEW
    assert noise_verdict(base, summarize([20.0], "ms")) == TOO_FEW
    assert TOO_FEW == "n/a (needs ≥ 3 passes each)"
    assert noise_verdict(None, base) == NOT_MEASURED

"""Run-to-run variation judged within each image; pooled dispersion over different images is image mix."""

from __future__ import annotations

import json
import types
from typing import Any
from unittest.mock import ANY

import attrs
import pytest

from helpers import FIXTURES
from llm_perf_opt.measure.aggregate import stage_stats
from llm_perf_opt.measure.comparison import verdict_side
from llm_perf_opt.measure.variation import (
    BOTH_SIDES,
    GPU_SIDE,
    HOST_SIDE,
    StageVariation,
    high_variation,
    noise_side,
    stage_variation,
)
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.io import converter
from llm_perf_opt.records.stage1 import DecodeActivity, ImageRecord, StepActivity

VISION = ("vision/sam",)


def _record(image: str, repeat: int, prefill_ms: float, tiles: int) -> ImageRecord:
    return ImageRecord(
        image=image,
        repeat=repeat,
        preprocess_ms=5.0,
        prefill_ms=prefill_ms,
        vision_ms={"vision/sam": prefill_ms / 2},
        decode_ms=40.0,
        decode_step_ms=(10.0, 10.0, 10.0, 10.0),
        new_tokens=5,
        prompt_tokens=10,
        image_tokens=100 * (tiles + 1),
        tiles=tiles,
        peak_memory_bytes=None,
    )


def _by_stage(variations: tuple[StageVariation, ...]) -> dict[str, StageVariation]:
    return {v.stage: v for v in variations}


def test_images_of_different_tile_counts_are_image_mix_not_noise() -> None:
    # A 0-tile and a 6-tile page, each steady over its own five passes (CV about 1%).
    small = [_record("snippet.png", i, p, tiles=0) for i, p in enumerate([100.0, 101.0, 99.0, 100.5, 99.5])]
    large = [_record("page.png", i, p, tiles=6) for i, p in enumerate([300.0, 303.0, 297.0, 301.5, 298.5])]
    records = small + large
    pooled = {s.stage: s.summary for s in stage_stats(records, VISION)}[vocab.PREFILL]
    assert pooled.cv is not None and pooled.cv > 0.4  # what the old warning judged: "high variation"
    prefill = _by_stage(stage_variation(records, VISION))[vocab.PREFILL]
    assert prefill.image_mix_cv == pytest.approx(pooled.cv)
    assert prefill.images_judged == 2
    assert [s.image for s in prefill.per_image] == ["snippet.png", "page.png"]
    assert all(s.passes == 5 for s in prefill.per_image)
    assert prefill.within_image_cv_max is not None and prefill.within_image_cv_max < 0.02
    assert high_variation(stage_variation(records, VISION), 0.10) == ()


def test_a_noisy_image_is_flagged_and_named() -> None:
    steady = [_record("a.png", i, p, tiles=0) for i, p in enumerate([100.0, 101.0, 99.0])]
    noisy = [_record("b.png", i, p, tiles=0) for i, p in enumerate([100.0, 160.0, 70.0])]
    prefill = _by_stage(stage_variation(steady + noisy, VISION))[vocab.PREFILL]
    assert prefill.worst_image == "b.png"
    assert prefill.within_image_cv_max == pytest.approx(0.4166, abs=1e-4)  # std 45.83 / mean 110
    assert prefill.within_image_cv_median == pytest.approx((0.01 + 0.4166) / 2, abs=1e-4)
    flagged = high_variation(stage_variation(steady + noisy, VISION), 0.10)
    assert vocab.PREFILL in [v.stage for v in flagged]
    assert vocab.DECODE_STEP not in [v.stage for v in flagged]  # steady steps


def test_too_few_passes_per_image_are_not_judged() -> None:
    records = [_record(f"{name}.png", i, 100.0 + 50 * i, tiles=0) for name in "ab" for i in range(2)]
    prefill = _by_stage(stage_variation(records, VISION))[vocab.PREFILL]
    assert prefill.images_judged == 0
    assert prefill.within_image_cv_median is None and prefill.within_image_cv_max is None
    assert prefill.worst_image is None
    assert all(s.cv is not None and s.passes == 2 for s in prefill.per_image)  # shown, not judged
    assert high_variation(stage_variation(records, VISION), 0.01) == ()


def test_one_image_has_no_image_mix() -> None:
    records = [_record("a.png", i, p, tiles=2) for i, p in enumerate([100.0, 130.0, 90.0])]
    prefill = _by_stage(stage_variation(records, VISION))[vocab.PREFILL]
    assert prefill.image_mix_cv is None
    assert prefill.within_image_cv_median == prefill.within_image_cv_max
    assert prefill.within_image_cv_max == pytest.approx(
        {s.stage: s.summary for s in stage_stats(records, VISION)}[vocab.PREFILL].cv
    )


def test_h100_run_pooled_spread_is_mostly_image_mix() -> None:
    data = json.loads((FIXTURES / "metrics" / "h100_full_stage1.json").read_text())
    records = tuple(converter.structure(r, ImageRecord) for r in data["records"])
    assert len({r.tiles for r in records}) == 3  # 0, 4 and 6 tiles
    variations = _by_stage(stage_variation(records, ("vision/sam", "vision/encoder", "vision/projector")))
    pre = variations[vocab.PREPROCESS]
    assert pre.images_judged == 5
    assert pre.image_mix_cv == pytest.approx(0.489, abs=1e-3)
    assert pre.within_image_cv_median == pytest.approx(0.102, abs=1e-3)  # a fifth of the pooled figure
    sam = variations["vision/sam"]
    assert sam.image_mix_cv is not None and sam.within_image_cv_median is not None
    assert sam.image_mix_cv > 5 * sam.within_image_cv_median
    # decode/step is judged on pass means, like its interval.
    assert variations[vocab.DECODE_STEP].within_image_cv_median == pytest.approx(0.092, abs=1e-3)


def test_zero_time_stage_has_no_cv() -> None:
    records = [attrs.evolve(_record("a.png", i, 100.0, tiles=0), vision_ms={}) for i in range(3)]
    sam = _by_stage(stage_variation(records, VISION))["vision/sam"]
    assert sam.per_image[0].cv is None and sam.images_judged == 0


def _activity(decode_busy_ms: float, prefill_busy_ms: float) -> DecodeActivity:
    prefill = StepActivity(kernels=900, kernel_ms=60.0, busy_ms=prefill_busy_ms, wall_ms=200.0)  # profiler-slowed wall
    return DecodeActivity(
        steps=4, kernels_mean=900, kernels_min=900, kernels_max=900, kernel_ms_mean=decode_busy_ms,
        busy_ms_mean=decode_busy_ms, wall_ms_mean=40.0, busy_fraction=decode_busy_ms / 40.0, prefill=prefill,
        unattributed_kernels=0, method="profiler",
    )  # fmt: skip


def test_the_noise_side_follows_how_busy_the_gpu_is_over_the_timed_stage() -> None:
    """A launch-bound eager decode step (1.1 ms of kernels in a 15 ms timed step) varies on the host's side; a
    prefill whose kernels fill 62 of its 65 timed ms on the GPU's (the profiler's slower wall is not the measure);
    preprocessing always on the host's; without a profiled pass or a timed figure nothing is claimed."""
    timed = {vocab.DECODE_STEP: 15.0, vocab.PREFILL: 65.0}
    activity = _activity(1.1, 62.0)
    decode = noise_side(vocab.DECODE_STEP, activity, timed)
    assert decode is not None and decode[0] == HOST_SIDE and "7% of a decode step (1.1 of 15.0 ms)" in decode[1]
    prefill = noise_side(vocab.PREFILL, activity, timed)
    assert prefill is not None and prefill[0] == GPU_SIDE and "95% of the prefill" in prefill[1]
    assert noise_side(vocab.DECODE, _activity(12.0, 62.0), timed) == (BOTH_SIDES, ANY)
    assert noise_side(vocab.PREPROCESS, None, {}) == (HOST_SIDE, "preprocessing runs on the CPU")
    assert noise_side(vocab.DECODE_STEP, None, timed) is None and noise_side(vocab.TTFT, activity, timed) is None
    assert noise_side(vocab.DECODE_STEP, activity, {}) is None


def test_a_compare_verdict_names_the_side_of_both_runs_noise() -> None:
    def metrics(side: str | None) -> Any:
        return types.SimpleNamespace(variation=[types.SimpleNamespace(stage=vocab.DECODE_STEP, noise_side=side)])

    assert verdict_side(metrics(HOST_SIDE), metrics(HOST_SIDE), vocab.DECODE_STEP) == HOST_SIDE
    assert verdict_side(metrics(HOST_SIDE), metrics(GPU_SIDE), vocab.DECODE_STEP) == BOTH_SIDES
    assert verdict_side(metrics(None), metrics(GPU_SIDE), vocab.DECODE_STEP) == GPU_SIDE
    assert verdict_side(metrics(None), metrics(None), vocab.DECODE_STEP) is None
    assert verdict_side(metrics(HOST_SIDE), metrics(HOST_SIDE), vocab.PREFILL) is None

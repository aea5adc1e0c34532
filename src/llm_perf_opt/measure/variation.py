"""Run-to-run variation judged per image: pooled over a multi-image run, a stage's CV mostly measures how different
the images are, so it is reported as image mix. Noise is the CV over each image's own passes, summarised over the
images with at least `MIN_VALUES_FOR_CI` passes by its median (the warning's figure) and maximum (with its image)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from llm_perf_opt.measure.aggregate import stage_values
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import DecodeActivity, ImageRecord, ImageSpread, StageVariation


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / abs(mean) if mean != 0 else None


def stage_variation(records: Sequence[ImageRecord], vision_stages: Sequence[str]) -> tuple[StageVariation, ...]:
    """Per stage (report order), the dispersion over each image's passes and over the mix of images."""
    images = list(dict.fromkeys(r.image for r in records))
    per_image = {image: stage_values([r for r in records if r.image == image], vision_stages) for image in images}
    out = []
    for stage, pooled in stage_values(records, vision_stages).items():
        spreads = tuple(
            ImageSpread(image=image, passes=len(vals), cv=_cv(vals))
            for image in images
            if (vals := per_image[image].get(stage))
        )
        judged = [s for s in spreads if s.passes >= MIN_VALUES_FOR_CI and s.cv is not None]
        worst = max(judged, key=lambda s: s.cv or 0.0) if judged else None
        out.append(
            StageVariation(
                stage=stage,
                per_image=spreads,
                images_judged=len(judged),
                within_image_cv_median=statistics.median(s.cv for s in judged if s.cv is not None) if judged else None,
                within_image_cv_max=worst.cv if worst else None,
                worst_image=worst.image if worst else None,
                image_mix_cv=_cv(pooled) if len(spreads) > 1 else None,
            )
        )
    return tuple(out)


def high_variation(variations: Sequence[StageVariation], threshold: float) -> tuple[StageVariation, ...]:
    """The stages whose median within-image CV exceeds `threshold` (a fraction): the run-to-run noise warning."""
    return tuple(v for v in variations if v.within_image_cv_median is not None and v.within_image_cv_median > threshold)


HOST_PACED_BELOW = 0.7  # GPU busy under this fraction of a stage's time: the host sets its pace
GPU_PACED_FROM = 0.9  # busy at least this fraction: the GPU does
HOST_SIDE, GPU_SIDE, BOTH_SIDES = "host-side", "GPU-side", "host and GPU"


def noise_side(stage: str, activity: DecodeActivity | None, timed_ms: Mapping[str, float]) -> tuple[str, str] | None:
    """Which side a stage's run-to-run variation is on (HOST_SIDE, GPU_SIDE or BOTH_SIDES, why in words), from the
    profiled pass's GPU busy time (unslowed by the profiler) over the stage's median timed time; None where unknown."""
    if stage == vocab.PREPROCESS:
        return HOST_SIDE, "preprocessing runs on the CPU"
    if activity is None:
        return None
    if stage in (vocab.DECODE, vocab.DECODE_STEP):
        busy_ms, timed, what = activity.busy_ms_mean, timed_ms.get(vocab.DECODE_STEP), "a decode step"
    elif stage == vocab.PREFILL and activity.prefill is not None:
        busy_ms, timed, what = activity.prefill.busy_ms, timed_ms.get(vocab.PREFILL), "the prefill"
    else:
        return None
    if not timed or timed <= 0:
        return None
    busy = min(busy_ms / timed, 1.0)
    seen = f"the GPU is busy {busy:.0%} of {what} ({busy_ms:,.1f} of {timed:,.1f} ms)"
    if busy < HOST_PACED_BELOW:
        return HOST_SIDE, f"{seen}, so the host's launch pace sets its time and its spread"
    if busy >= GPU_PACED_FROM:
        return GPU_SIDE, f"{seen}, so the spread is the GPU's own (clocks, power, other work on it)"
    return BOTH_SIDES, seen

"""attrs records that flow from measurement to the reports and `metrics.json` (serialised with cattrs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from llm_perf_opt.hardware.table import PeakFigure
from llm_perf_opt.measure.stats import Summary
from llm_perf_opt.measure.torch_profiler import OperatorRow


@attrs.frozen
class ModelInfo:
    name: str
    adapter: str
    class_name: str
    parameters: int
    dtype: str
    attn_implementation: str | None
    experts_implementation: str | None
    weights: str  # "random" | "checkpoint"
    weights_detail: str
    config_source: str
    preprocess: Mapping[str, Any]
    # The model's shape as its config gives it (model_type, layers, hidden size, heads, vocabulary, input kind,
    # vision stages); empty for adapters that do not describe it.
    architecture: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class DeviceInfo:
    type: str  # "cuda" | "cpu"
    name: str
    index: int | None
    timing_method: str


@attrs.frozen
class ImageRecord:
    """One timed pass over one image (times in ms)."""

    image: str
    repeat: int
    preprocess_ms: float
    prefill_ms: float  # vision included
    vision_ms: Mapping[str, float]  # nested inside prefill
    ttft_ms: float
    decode_ms: float
    decode_step_ms: tuple[float, ...]
    e2e_ms: float  # preprocess + prefill + decode
    new_tokens: int
    prompt_tokens: int
    image_tokens: int
    tiles: int
    peak_memory_bytes: int | None


@attrs.frozen
class StageStat:
    """Dispersion of one stage over the timed passes."""

    stage: str
    nested_in: str | None  # "prefill" for vision sub-stages: shown nested, never added again
    summary: Summary


@attrs.frozen
class MfuRecord:
    """MFU of one stage over all timed passes: total FLOPs / (total time · peak)."""

    stage: str
    flops_total: float  # FLOPs over all timed passes
    time_total_ms: float  # measured time over the same passes
    achieved_tflops: float  # flops_total / time_total
    peak: PeakFigure | None
    mfu: float | None  # fraction; None when no peak is known
    flops_source: str


@attrs.frozen
class Throughput:
    decode_tokens_per_s: float  # decode steps / decode time (median over passes)
    e2e_images_per_s: float  # 1 / median end-to-end time
    e2e_tokens_per_s: float  # new tokens / end-to-end time (median)


@attrs.frozen
class Stage1Metrics:
    schema_version: str
    run_id: str
    stage: str
    created: str
    model: ModelInfo
    device: DeviceInfo
    settings: Mapping[str, Any]
    records: tuple[ImageRecord, ...]
    stages: tuple[StageStat, ...]
    per_image: Mapping[str, tuple[StageStat, ...]]
    throughput: Throughput
    mfu: tuple[MfuRecord, ...]
    efficiency: tuple[Any, ...]  # measure.efficiency.StageEfficiency per stage (MBU, roofline, speed of light)
    bandwidth_peak: PeakFigure | None
    flops_per_image: Mapping[str, Mapping[str, float]]  # image -> stage -> FLOPs per pass
    top_operators: tuple[OperatorRow, ...]
    operator_sort_key: str | None
    profiler: Mapping[str, Any] | None  # the profiled pass: events, decode steps, post-processing seconds
    warnings: tuple[str, ...]
    config_digest: str

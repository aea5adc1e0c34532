"""Analytic FLOPs and bytes of DeepSeek-OCR-2 and DeepSeek-OCR (v1) from their config, per module and per stage.

Usage::

    spec = ModelSpec.from_config(model.config)  # either model; or ModelSpec.from_architecture(cfg.architecture)
    work = Workload(tiles=6, text_tokens=12, new_tokens=256, dtype_bytes=2)  # OCR-2: 6 tiles of 768 px
    work = Workload(global_size=1024, tile_size=640, crop_grid=(2, 3), text_tokens=12)  # v1 Gundam, 2x3 tiles
    costs = stage_costs(spec, work)  # spec.vision_stages, "prefill" (contains them) and "decode"
    costs["prefill"].matmul_flops  # the figure FlopCounterMode counts (tests: exact)

Conventions (1 MAC = 2 FLOPs, what is counted, byte approximations) are in :mod:`llm_perf_opt.analytic.model`.
:mod:`~llm_perf_opt.analytic.settings` holds what the config tells the analytic model (parsed once by a pipeline);
:mod:`~llm_perf_opt.analytic.workload` turns those settings or a Stage 1 run's inputs into workloads;
:mod:`~llm_perf_opt.analytic.pricing` turns costs into the analytic report's rows (categories, modules, lower bounds
per GPU, the view sweep); :mod:`~llm_perf_opt.analytic.dense` prices dense decoder-only LMs.
"""

from llm_perf_opt.analytic.model import (
    COUNTED_CATEGORIES,
    VISION_STAGES,
    ModuleCost,
    StageCost,
    decode,
    decode_step,
    expected_experts,
    prefill,
    stage_costs,
    vision_view,
)
from llm_perf_opt.analytic.spec import ClipSpec, EncoderSpec, ModelSpec, Workload, grid_tiles

__all__ = [
    "COUNTED_CATEGORIES",
    "VISION_STAGES",
    "ClipSpec",
    "EncoderSpec",
    "ModelSpec",
    "ModuleCost",
    "StageCost",
    "Workload",
    "decode",
    "decode_step",
    "expected_experts",
    "grid_tiles",
    "prefill",
    "stage_costs",
    "vision_view",
]

"""Analytic FLOPs and bytes of DeepSeek-OCR-2 from its config, per module and per stage.

Usage::

    spec = ModelSpec.from_architecture(model_cfg.architecture)  # or ModelSpec.from_config(hf_config)
    work = Workload(tiles=6, text_tokens=12, new_tokens=256, dtype_bytes=2)
    stages = prefill(spec, work)  # "vision/sam", "vision/encoder", "vision/projector", "prefill"
    steps = decode(spec, work)  # the new_tokens - 1 decode steps
    stages["prefill"].matmul_flops  # the figure FlopCounterMode counts (tests: within 1%)

Conventions (1 MAC = 2 FLOPs, what is counted, byte approximations) are in :mod:`llm_perf_opt.analytic.model`.
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
    vision_view,
)
from llm_perf_opt.analytic.spec import ModelSpec, Workload

__all__ = [
    "COUNTED_CATEGORIES",
    "VISION_STAGES",
    "ModelSpec",
    "ModuleCost",
    "StageCost",
    "Workload",
    "decode",
    "decode_step",
    "expected_experts",
    "prefill",
    "vision_view",
]

"""Stage names: one vocabulary for NVTX ranges, timings, FLOPs and reports, shared by Stage 1 and Stage 2."""

from __future__ import annotations

from typing import Final

NVTX_DOMAIN: Final = "llm_perf_opt"

PREPROCESS: Final = "preprocess"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
DECODE_STEP: Final = "decode/step"
VISION_PREFIX: Final = "vision/"

# Top-level stages of one image, in order. Vision sub-stages run inside prefill (nested, never added twice).
TOP_LEVEL: Final = (PREPROCESS, PREFILL, DECODE)


def is_vision(stage: str) -> bool:
    """True for a vision sub-stage (nested inside prefill)."""
    return stage.startswith(VISION_PREFIX)

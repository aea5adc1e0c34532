"""The toolkit's vocabulary: stage names, the NVTX domain, dtype names and weight quantizations, each defined here once.
It sits at the floor of the package: it imports nothing from llm_perf_opt; every layer takes these names here."""

from __future__ import annotations

from typing import Final

NVTX_DOMAIN: Final = "llm_perf_opt"

# ---- stages ---------------------------------------------------------------------------------------------------
PREPROCESS: Final = "preprocess"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
DECODE_STEP: Final = "decode/step"
VISION_PREFIX: Final = "vision/"
# Vision sub-stages the shipped adapters time (a generic model's are found by name: vision/encoder, vision/projector).
VISION_SAM: Final = "vision/sam"
VISION_CLIP: Final = "vision/clip"  # DeepSeek-OCR v1's CLIP-L
VISION_ENCODER: Final = "vision/encoder"  # DeepSeek-OCR-2's Qwen2-style encoder; a generic model's vision tower
VISION_PROJECTOR: Final = "vision/projector"
TTFT: Final = "ttft"  # preprocess + prefill: derived, no NVTX range of its own
E2E: Final = "e2e"  # preprocess + prefill + decode: derived

# Top-level stages of one input, in order. Vision sub-stages run inside prefill (nested, never added twice).
TOP_LEVEL: Final = (PREPROCESS, PREFILL, DECODE)


def is_vision(stage: str) -> bool:
    """True for a vision sub-stage (nested inside prefill)."""
    return stage.startswith(VISION_PREFIX)


def nested_in(stage: str) -> str | None:
    """The stage that contains `stage` (prefill for vision sub-stages, decode for its steps), or None."""
    if is_vision(stage):
        return PREFILL
    if stage == DECODE_STEP:
        return DECODE
    return None


# ---- dtypes ---------------------------------------------------------------------------------------------------
# Canonical compute dtype names (as torch spells them without the `torch.` prefix) and their aliases.
DTYPE_ALIASES: Final[dict[str, str]] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
DTYPE_BYTES: Final[dict[str, int]] = {"bfloat16": 2, "float16": 2, "float32": 4}
SUPPORTED_DTYPES_TEXT: Final = "bfloat16, float16 or float32"


def canonical_dtype(name: str) -> str | None:
    """`bf16`, `torch.bfloat16`, `BFloat16` -> `bfloat16`; None for a name that is not a supported compute dtype."""
    return DTYPE_ALIASES.get(str(name).strip().lower().removeprefix("torch."))


def dtype_bytes(name: str) -> int | None:
    """Bytes per element of a supported compute dtype (any alias), or None."""
    canonical = canonical_dtype(name)
    return None if canonical is None else DTYPE_BYTES[canonical]


# ---- weight quantization (`runtime.quantize`) --------------------------------------------------------------------
# Each value of `runtime.quantize` -> how reports name it (none: the model's own dtype, not named).
QUANTIZE_LABELS: Final[dict[str, str]] = {
    "none": "",
    "int8_weight_only": "int8 weight-only (torchao)",
    "float8_weight_only": "float8 weight-only (torchao)",
    "float8_dynamic": "float8 weights and dynamic float8 activations (torchao)",
}

"""Which Hugging Face models the generic adapter can drive, and through which auto class.

Drivable: decoder-only models that `AutoModelForImageTextToText` (with a vision config) or `AutoModelForCausalLM`
builds, whose forward names what the explicit prefill/decode loop passes (`use_cache` may go through **kwargs).
Anything else is refused with a :class:`UserError` before a single weight is built.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.models.cache_argument import forward_cache_argument

TEXT = "text"
IMAGE = "image"

#: Keyword arguments the session's generate loop passes to every forward that the forward must name (a catch-all
#: **kwargs would swallow them silently); the KV cache argument is checked apart, under either of its names.
LOOP_ARGUMENTS = ("input_ids", "attention_mask", "logits_to_keep")

_FIX = (
    "Use a decoder-only model that AutoModelForCausalLM or AutoModelForImageTextToText builds (e.g. Llama, Qwen2, "
    "Mistral, Gemma, Phi, Llava) with model=hf, or a model config with its own adapter (model=deepseek_ocr2)"
)


@attrs.frozen
class HfArchitecture:
    """How to build one config and what its inputs are."""

    kind: str  # "text" | "image"
    auto_class: Any  # AutoModelForCausalLM | AutoModelForImageTextToText
    model_class: Any  # the concrete class the auto class builds


def classify(config: Any) -> HfArchitecture:
    """The architecture the generic adapter drives for `config`, or a UserError saying why it cannot."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    model_type = str(getattr(config, "model_type", "?"))
    what = f"model type {model_type!r} ({type(config).__name__})"
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"{what} is an encoder-decoder model; the generic adapter drives decoder-only models", _FIX)
    kind: str
    auto: Any
    cls: Any
    if getattr(config, "vision_config", None) is not None and type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        kind, auto, cls = IMAGE, AutoModelForImageTextToText, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(config)]
    elif type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        kind, auto, cls = TEXT, AutoModelForCausalLM, MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    else:
        raise UserError(
            f"{what} is neither a causal LM nor an image-text-to-text model in transformers, so the generic adapter "
            "cannot build it",
            _FIX,
        )
    if getattr(cls, "_is_stateful", False):
        raise UserError(
            f"{what} builds {cls.__name__}, a recurrent-state model (as Mamba or RWKV): it carries a recurrent state "
            "from step to step, not a KV cache, so the explicit prefill/decode loop cannot drive it",
            _FIX,
        )
    parameters = inspect.signature(cls.forward).parameters
    missing = [name for name in LOOP_ARGUMENTS if name not in parameters]
    if forward_cache_argument(cls.forward) is None:
        missing.insert(1, "KV cache argument (cache or past_key_values)")
    if missing:
        raise UserError(
            f"{what} builds {cls.__name__}, whose forward takes no {', '.join(missing)}: the explicit prefill/decode "
            "loop (KV cache, last-position logits) cannot drive it",
            _FIX,
        )
    return HfArchitecture(kind=kind, auto_class=auto, model_class=cls)

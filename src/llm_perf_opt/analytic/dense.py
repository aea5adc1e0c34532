"""Analytic FLOPs and bytes of a dense decoder-only transformer (Llama, Qwen2, Mistral without sliding window):
token embedding, `layers` x (RMSNorm, attention with grouped KV heads and RoPE, RMSNorm, SwiGLU MLP), a final
RMSNorm and the lm_head on the positions whose logits are kept (the last prefill token, and each decode step).

Conventions and bytes are those of :mod:`llm_perf_opt.analytic.model`; the counted figure equals FlopCounterMode's
count on the real modules exactly (tests/test_analytic_dense.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from llm_perf_opt.analytic.model import ModuleCost, StageCost, _decoder_forward, _glu, sum_of_steps
from llm_perf_opt.records.vocabulary import DECODE, DECODE_STEP, PREFILL

#: transformers model types whose shape this module models.
SUPPORTED_TYPES = ("llama", "qwen2", "mistral")


@attrs.frozen
class DenseSpec:
    """The shape of a dense decoder-only transformer, from its transformers config."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @classmethod
    def from_config(cls, config: Any) -> DenseSpec | None:
        """The spec of a supported config (see the module docstring), else None (no analytic model)."""
        model_type = str(getattr(config, "model_type", ""))
        if model_type not in SUPPORTED_TYPES or getattr(config, "hidden_act", None) != "silu":
            return None
        if getattr(config, "use_sliding_window", False) or (
            model_type == "mistral" and getattr(config, "sliding_window", None) is not None
        ):
            return None  # a sliding window caps the keys a decode step attends: not modelled
        heads = int(config.num_attention_heads)
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            model_type=model_type,
            hidden=int(config.hidden_size),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
            qkv_bias=model_type == "qwen2" or attention_bias,  # Qwen2: q/k/v always biased, o_proj never
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements one token stores over all layers (multiply by the dtype's bytes)."""
        return self.layers * 2 * self.kv_heads * self.head_dim


def _forward(spec: DenseSpec, tokens: int, keys: int, db: int, *, prefill: bool, batch: int = 1) -> list[ModuleCost]:
    """One forward (`model._decoder_forward`, no module prefix) with SwiGLU MLPs."""

    def mlp(prefix: str, layer: int, t: float) -> list[ModuleCost]:
        return _glu(prefix, t, spec.hidden, spec.intermediate, db, bias=spec.mlp_bias)

    return _decoder_forward(
        "", spec, tokens, keys, db, mlp, qkv_bias=spec.qkv_bias, o_bias=spec.o_bias, prefill=prefill, batch=batch
    )


def prefill(spec: DenseSpec, prompt_tokens: int, dtype_bytes: int = 2) -> StageCost:
    """The prefill forward over the prompt (every position attending every prompt position: the full score
    matrix SDPA computes) and the lm_head on the last position."""
    return StageCost(PREFILL, tuple(_forward(spec, prompt_tokens, prompt_tokens, dtype_bytes, prefill=True)))


def decode_step(spec: DenseSpec, context: int, dtype_bytes: int = 2) -> StageCost:
    """One decode step: one new token whose query attends `context` keys (the cache plus itself)."""
    return StageCost(DECODE_STEP, tuple(_forward(spec, 1, context, dtype_bytes, prefill=False)))


def decode(spec: DenseSpec, prompt_tokens: int, new_tokens: int, dtype_bytes: int = 2) -> StageCost:
    """The new_tokens − 1 decode steps after prefill; step i (1-based) attends prompt + i keys."""
    return sum_of_steps(lambda context: decode_step(spec, context, dtype_bytes).modules, prompt_tokens, new_tokens)


def stage_costs(spec: DenseSpec, prompt_tokens: int, new_tokens: int, dtype_bytes: int) -> dict[str, StageCost]:
    """The stages "prefill" and "decode" of one prompt."""
    return batch_stage_costs(spec, [prompt_tokens], new_tokens, dtype_bytes)


def batch_stage_costs(
    spec: DenseSpec, prompt_tokens: Sequence[int], new_tokens: int, dtype_bytes: int
) -> dict[str, StageCost]:
    """The stages "prefill" and "decode" of a batch of prompts left-padded to the longest (padding positions are
    computed, read and cached like tokens); decode step i attends padded prompt + i keys per sequence."""
    size, length = len(prompt_tokens), max(prompt_tokens)
    return {
        PREFILL: StageCost(PREFILL, tuple(_forward(spec, length, length, dtype_bytes, prefill=True, batch=size))),
        DECODE: sum_of_steps(
            lambda context: tuple(_forward(spec, 1, context, dtype_bytes, prefill=False, batch=size)),
            length,
            new_tokens,
        ),
    }

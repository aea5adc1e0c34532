"""The memory pass's figures: KV-cache bytes per token from a decoder config, a stage's peak broken down into
weights, KV cache, other resident memory and activations, and what fits. Pure functions (no torch); the pass that
measures the peaks is `instruments.memory`."""

from __future__ import annotations

import math
from typing import Any

from llm_perf_opt.records.memory import FitPrediction, MemoryBreakdown, MemoryPass, StagePeak


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int | None:
    """KV-cache bytes per token of one sequence from a decoder config: 2 (K, V) × layers × KV heads × head dim ×
    dtype bytes (`analytic.spec.TextSpec.kv_bytes_per_token`'s rule); None when the config lacks a field."""
    try:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    except (AttributeError, TypeError, ValueError):
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def breakdown(peak: StagePeak, weights: int, resident_other: int, preexisting_kv: int) -> MemoryBreakdown:
    """A stage's peak allocated memory as weights + KV cache + other resident + activations/workspace (the
    remainder, so the parts sum to the peak exactly), and the allocator slack (reserved − allocated) above it."""
    kv = max(peak.kv_bytes, preexisting_kv)  # a reused static cache is resident all along
    return MemoryBreakdown(
        stage=peak.stage,
        peak_allocated_bytes=peak.peak_allocated_bytes,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        resident_other_bytes=resident_other,
        activations_bytes=peak.peak_allocated_bytes - weights - kv - resident_other,
        reserved_bytes=peak.peak_reserved_bytes,
        allocator_slack_bytes=max(0, peak.peak_reserved_bytes - peak.peak_allocated_bytes),
    )


def resident_other(measured: MemoryPass) -> int:
    """Allocated before the pass besides the weights and the pass's own (reused) KV cache: kept static caches of
    other shapes, CUDA-graph pools, leftovers of earlier passes."""
    return max(0, measured.baseline_allocated_bytes - measured.weights_bytes - measured.preexisting_kv_bytes)


def fit_prediction(
    total: int, outside: int, peak: MemoryBreakdown, batch: int, kv_per_token: float | None
) -> FitPrediction:
    """The largest batch and the longest context that fit in `total` bytes: fixed = outside the allocator + weights
    + other resident + allocator slack; activations and KV grow with the batch; at the measured batch, the context
    grows the KV cache by `kv_per_token` (one sequence) × batch per position."""
    fixed = outside + peak.weights_bytes + peak.resident_other_bytes + peak.allocator_slack_bytes
    room = total - fixed
    per_page = (peak.activations_bytes + peak.kv_cache_bytes) / max(batch, 1)
    max_batch = None if per_page <= 0 else max(0, math.floor(room / per_page))
    per_position = kv_per_token * batch if kv_per_token else None
    max_context = max(0, math.floor((room - peak.activations_bytes) / per_position)) if per_position else None
    return FitPrediction(
        total_bytes=total,
        fixed_bytes=fixed,
        per_page_bytes=per_page,
        max_batch=max_batch,
        kv_bytes_per_token=per_position,
        max_context_tokens=max_context,
    )

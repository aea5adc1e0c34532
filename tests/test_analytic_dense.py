"""The dense decoder-only analytic model (llm_perf_opt.analytic.dense) against FlopCounterMode on the tiny Qwen2 and
Llama presets (exact), against the built models' parameters and KV cache, and its scope (None where not modelled)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache, LlavaConfig, MistralConfig, Qwen2MoeConfig

from helpers import rope_table_flops
from hf_fixtures import preset_config
from llm_perf_opt.analytic.dense import DenseSpec, decode, decode_step, prefill, stage_costs
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.instruments.flops import count_stage_flops, flop_counter
from llm_perf_opt.models.cache_argument import cache_kwargs, output_cache
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

PRESETS = ("qwen2_tiny", "llama_tiny")
NEW_TOKENS = 5


@pytest.fixture(scope="module", params=PRESETS)
def session(request: pytest.FixtureRequest) -> InferenceSession:
    cfg = compose_config("stage1", "model=hf", f"model.config={request.param}").model
    return InferenceSession.load(cfg, torch.device("cpu"))


def _prompt(tmp_path: Path, words: int) -> Any:
    path = tmp_path / "prompt.txt"
    path.write_text(" ".join(f"w{i}" for i in range(words)))
    return path


@pytest.mark.parametrize("words", [1, 37, 300])
def test_flops_equal_the_counter_exactly(session: InferenceSession, tmp_path: Path, words: int) -> None:
    prepared = session.prepare(_prompt(tmp_path, words))
    assert prepared.prompt_tokens == words + 1  # stand-in ids: BOS + one per word
    counted = count_stage_flops(session, prepared)
    spec = DenseSpec.from_config(session.model.config)
    assert spec is not None
    p = prepared.prompt_tokens
    assert prefill(spec, p, 4).matmul_flops + rope_table_flops(session.model, p) == counted.prefill
    # the counter's affine decode model (fitted on steps 1 and 2) against the analytic steps
    ctx = p + 1
    per_ctx = decode_step(spec, ctx + 1, 4).matmul_flops - decode_step(spec, ctx, 4).matmul_flops
    assert per_ctx == counted.decode_step_per_ctx == 4 * spec.heads * spec.head_dim * spec.layers
    rope_step = rope_table_flops(session.model, 1)
    assert decode_step(spec, ctx, 4).matmul_flops - per_ctx * ctx + rope_step == counted.decode_step_base
    steps = NEW_TOKENS - 1  # the first new token comes from prefill
    assert decode(spec, p, NEW_TOKENS, 4).matmul_flops + steps * rope_step == counted.decode_total(NEW_TOKENS)
    costs = session.adapter.analytic_costs(session.model, prepared, NEW_TOKENS, 4)
    assert costs is not None and set(costs) == {"prefill", "decode"}
    assert costs["prefill"] == prefill(spec, p, 4)


@pytest.mark.parametrize("cached", [0, 700])
def test_decode_step_matches_an_independent_count(session: InferenceSession, cached: int) -> None:
    """One decode forward over a zero KV cache of `cached` positions (its query attends cached + 1 keys)."""
    config = session.model.config
    spec = DenseSpec.from_config(config)
    assert spec is not None
    cache = DynamicCache(config=config)
    for layer in range(spec.layers):
        kv = torch.zeros(1, spec.kv_heads, cached, spec.head_dim)
        cache.update(kv, kv.clone(), layer)
    with torch.inference_mode(), flop_counter() as counter:
        session.model(
            input_ids=torch.tensor([[5]]),
            attention_mask=torch.ones(1, cached + 1, dtype=torch.long),
            **cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1,
        )
    rope = rope_table_flops(session.model, 1)
    assert decode_step(spec, cached + 1, 4).matmul_flops + rope == counter.get_total_flops()


def test_bytes_match_the_built_model(session: InferenceSession) -> None:
    model = session.model
    spec = DenseSpec.from_config(model.config)
    assert spec is not None
    # A decode step reads every weight once (the lm_head, tied or not) and one embedding row: at 1 byte/param.
    weights = sum(p.numel() for n, p in model.named_parameters(remove_duplicate=False) if "embed_tokens" not in n)
    assert decode_step(spec, 10, 1).weight_bytes == weights + spec.hidden
    # KV bytes: the cache the real model fills in prefill, and a step reads context keys and writes one token.
    ids = torch.arange(1, 24)[None]
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    held = sum(t.numel() for layer in output_cache(out).layers for t in (layer.keys, layer.values))
    assert held == spec.kv_bytes_per_token * ids.shape[1] == prefill(spec, ids.shape[1], 1).kv_bytes
    assert decode_step(spec, 100, 2).kv_bytes == spec.kv_bytes_per_token * 2 * (100 + 1)


def test_decode_sums_its_steps() -> None:
    spec = DenseSpec.from_config(preset_config("qwen2_0_5b"))
    assert spec is not None
    total = decode(spec, 50, 9, 2)
    steps = [decode_step(spec, 50 + i, 2) for i in range(1, 9)]
    for field in ("matmul_flops", "flops", "weight_bytes", "activation_bytes", "kv_bytes"):
        assert getattr(total, field) == pytest.approx(sum(getattr(s, field) for s in steps), rel=1e-12)
    assert decode(spec, 50, 1, 2).modules == ()
    assert set(stage_costs(spec, 50, 9, 2)) == {"prefill", "decode"}


def test_real_size_qwen2_shape() -> None:
    spec = DenseSpec.from_config(preset_config("qwen2_0_5b"))
    assert spec == DenseSpec(
        model_type="qwen2",
        hidden=896,
        layers=24,
        heads=14,
        kv_heads=2,
        head_dim=64,
        intermediate=4864,
        vocab=151936,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
    )
    # 24 layers x 2 (K, V) x 2 heads x 64 = 6,144 elements per token: 12 KiB in bf16
    assert spec.kv_bytes_per_token * 2 == 12_288


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(lambda: preset_config("qwen2_tiny", use_sliding_window=True), id="qwen2-sliding-window"),
        pytest.param(lambda: preset_config("llama_tiny", hidden_act="gelu"), id="llama-gelu"),
        pytest.param(lambda: MistralConfig(sliding_window=4096), id="mistral-window"),
        pytest.param(Qwen2MoeConfig, id="qwen2-moe"),
        pytest.param(LlavaConfig, id="llava"),
    ],
)
def test_no_analytic_model_outside_its_scope(config: Any) -> None:
    assert DenseSpec.from_config(config()) is None


@pytest.mark.parametrize(
    "op",
    [
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ],
)
def test_sdpa_ops_are_counted_with_grouped_query_heads(op: str) -> None:
    """GPU SDPA kernels get K/V with fewer heads than Q (`enable_gqa`); torch < 2.12's formula rejects that."""
    q, k, v = (torch.empty(s, device="meta") for s in ((1, 14, 5, 64), (1, 2, 7, 64), (1, 2, 7, 64)))
    formula = flop_counter().flop_registry[getattr(torch.ops.aten, op)]
    assert formula(q, k, v, out_val=None) == 4 * 14 * 5 * 7 * 64  # QKᵀ and AV over the 14 query heads

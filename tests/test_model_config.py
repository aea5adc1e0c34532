"""The shipped model configs against the reference facts (deepseek-ocr-facts.md §2, §3.2, §3.4, §4).

The full-size model is only ever built on the meta device (no memory, no weights); everything that runs uses
the tiny config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch import nn
from transformers import DeepseekOcr2Config, DeepseekOcr2ForConditionalGeneration

from helpers import rope_table_flops
from llm_perf_opt.session.adapters.deepseek_ocr2 import view_tokens
from llm_perf_opt.session.adapters.registry import make_adapter

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CONF = Path(__file__).resolve().parents[1] / "src" / "llm_perf_opt" / "conf" / "model"

# Reference §3.2: the published DeepSeek-OCR-2 built from the shipped architecture.
FULL_PARAMETERS = 3_389_119_360
COMPONENT_PARAMETERS = {
    "model.vision_tower.sam_encoder": 94_979_328,
    "model.vision_tower.vision_encoder": 357_898_112,
    "query banks": 358_400,
    "model.multi_modal_projector": 1_148_160,
    "model.view_separator": 1_280,
    "model.language_model": 2_769_255_680,
    "lm_head": 165_478_400,
}
# Reference §4: active decoder MACs per generated token (attention 78.6M + dense layer 26.3M + 11 MoE layers x 27.6M
# + lm_head 165.5M).
ACTIVE_DECODER_MACS = 574_095_360
LM_HEAD_MACS = 165_478_400


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def active_decoder_macs(model: nn.Module, *, lm_head: bool = True) -> int:
    """Multiply-adds of the decoder's matmuls per generated token, from module shapes alone (attention to the
    KV cache excluded): every attention and dense-MLP weight, top-k of the routed experts, the shared experts,
    the router, and the lm_head."""
    text = model.config.text_config
    macs = 0
    for layer in model.model.language_model.layers:
        macs += _numel(layer.self_attn)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            per_expert = _numel(mlp.experts) // text.n_routed_experts
            macs += text.num_experts_per_tok * per_expert + _numel(mlp.shared_experts) + mlp.gate.weight.numel()
        else:
            macs += _numel(mlp)
    if lm_head:
        macs += model.lm_head.weight.numel()
    return macs


@pytest.fixture(scope="module")
def meta_model(full_model_cfg) -> nn.Module:
    arch = OmegaConf.to_container(full_model_cfg.architecture, resolve=True)
    with torch.device("meta"):
        return DeepseekOcr2ForConditionalGeneration(DeepseekOcr2Config(**arch))


def test_full_config_has_the_published_parameter_count(meta_model) -> None:
    assert all(p.device.type == "meta" for p in meta_model.parameters())
    assert _numel(meta_model) == FULL_PARAMETERS


def test_full_config_component_parameter_counts(meta_model) -> None:
    tower = meta_model.model.vision_tower
    counts = {
        "model.vision_tower.sam_encoder": _numel(tower.sam_encoder),
        "model.vision_tower.vision_encoder": _numel(tower.vision_encoder),
        "query banks": _numel(tower.query_768_resolution) + _numel(tower.query_1024_resolution),
        "model.multi_modal_projector": _numel(meta_model.model.multi_modal_projector),
        "model.view_separator": meta_model.model.view_separator.numel(),
        "model.language_model": _numel(meta_model.model.language_model),
        "lm_head": _numel(meta_model.lm_head),
    }
    assert counts == COMPONENT_PARAMETERS
    assert tower.query_768_resolution.num_embeddings == 144
    assert tower.query_1024_resolution.num_embeddings == 256
    # The components cover the model: nothing else holds parameters.
    assert sum(counts.values()) == FULL_PARAMETERS


def test_full_config_active_decoder_flops_per_token(meta_model) -> None:
    text = meta_model.config.text_config
    assert (text.num_hidden_layers, text.n_routed_experts, text.num_experts_per_tok) == (12, 64, 6)
    assert not meta_model.config.tie_word_embeddings
    macs = active_decoder_macs(meta_model)
    assert macs == ACTIVE_DECODER_MACS
    assert 2 * macs == pytest.approx(1.148e9, rel=1e-3)
    assert 2 * active_decoder_macs(meta_model, lm_head=False) == pytest.approx(0.817e9, rel=1e-3)
    assert active_decoder_macs(meta_model) - active_decoder_macs(meta_model, lm_head=False) == LM_HEAD_MACS


def test_active_macs_formula_matches_a_counted_tiny_decode_step(tiny_session, decode_step_flops) -> None:
    """The shape formula above agrees with FlopCounterMode on the tiny model: a decode step over an empty cache
    attends 1 key, which adds 4·heads·head_dim FLOPs per layer (and the rotary table's matmul where the transformers
    release builds it with one)."""
    text = tiny_session.model.config.text_config
    attention = 4 * text.num_attention_heads * text.head_dim * text.num_hidden_layers
    rope = rope_table_flops(tiny_session.model.model.language_model, 1)  # the decoder's table, not the encoder's
    assert decode_step_flops(tiny_session, 0) == 2 * active_decoder_macs(tiny_session.model) + attention + rope


def test_tiny_config_shares_the_full_preprocessing_and_token_ids() -> None:
    full = OmegaConf.load(CONF / "deepseek_ocr2.yaml")
    tiny_raw = OmegaConf.load(CONF / "deepseek_ocr2_tiny.yaml")
    assert list(tiny_raw.defaults) == ["deepseek_ocr2", "_self_"]
    del tiny_raw["defaults"]
    tiny = OmegaConf.merge(full, tiny_raw)
    assert tiny.name == "deepseek_ocr2_tiny"
    assert tiny.preprocess == full.preprocess
    assert tiny.architecture.image_token_id == full.architecture.image_token_id == 128815
    assert tiny.architecture.text_config.vocab_size == 129280
    assert tiny.architecture.text_config.hidden_size == 64
    # Unchanged keys come from the full config.
    assert tiny.architecture.text_config.topk_method == full.architecture.text_config.topk_method


def test_hydra_compose_matches_the_manual_merge(tiny_model_cfg) -> None:
    assert tiny_model_cfg.name == "deepseek_ocr2_tiny"
    assert tiny_model_cfg.architecture.text_config.num_hidden_layers == 3
    assert tiny_model_cfg.architecture.vision_config.encoder_config.hidden_size == 48
    assert tiny_model_cfg.prompt.text_tokens == 6
    assert "defaults" not in tiny_model_cfg


def test_view_tokens() -> None:
    assert view_tokens(1024) == 256
    assert view_tokens(768) == 144
    # The query bank, not the patch count, decides: 640 px -> 100 positions -> the 144 bank; 1280 -> 256.
    assert view_tokens(640) == 144
    assert view_tokens(1280) == 256


@pytest.mark.parametrize(
    ("page", "tiles", "image_tokens"),
    [("a4", 6, 1121), ("square700", 0, 257), ("small", 0, 257), ("wide", 3, 689), ("two_tiles", 2, 545)],
)
def test_token_counts_through_prepare(full_model_cfg, page_images, page, tiles, image_tokens) -> None:
    adapter = make_adapter(full_model_cfg)
    with Image.open(page_images[page]) as image:
        prepared = adapter.prepare(image, None)
    assert prepared.tiles == tiles
    assert prepared.image_tokens == image_tokens == 256 + 144 * tiles + 1
    text_tokens = int(full_model_cfg.prompt.text_tokens)
    assert prepared.prompt_tokens == 1 + image_tokens + text_tokens
    ids = prepared.input_ids
    assert ids.shape == (1, prepared.prompt_tokens)
    assert ids.dtype == torch.long
    assert int(ids[0, 0]) == full_model_cfg.architecture.text_config.bos_token_id
    assert int((ids == full_model_cfg.architecture.image_token_id).sum()) == image_tokens
    assert prepared.views == (("global", 1024, 1024),) + (("tile", 768, 768),) * tiles
    inputs = prepared.model_inputs
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 1024, 1024)
    assert list(inputs["num_local_patches"]) == [tiles]
    if tiles:
        assert tuple(inputs["pixel_values_local"].shape) == (tiles, 3, 768, 768)
    else:
        assert "pixel_values_local" not in inputs

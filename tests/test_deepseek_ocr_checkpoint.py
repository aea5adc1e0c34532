"""Loading the official DeepSeek-OCR v1 checkpoint layout (llm_perf_opt.models.deepseek_ocr.checkpoint).

Synthetic vendor-layout checkpoints with random values (llm_perf_opt.models.deepseek_ocr.synthetic) stand in for
the 6.2 GiB hub checkpoint. The expected tensors are computed here from the vendor tensors with the name map written
out independently of the loader. The full-size name map is checked on the meta device against the published tensor
table (deepseek-ocr-facts.md §1.5): 2,710 tensors, 3,336,106,240 parameters.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.models.deepseek_ocr import checkpoint
from llm_perf_opt.models.deepseek_ocr.checkpoint import (
    build_empty_model,
    build_plan,
    find_problems,
    load_v1_checkpoint,
    model_shapes,
    read_v1_architecture,
    shipped_architecture,
)
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration
from llm_perf_opt.models.deepseek_ocr.synthetic import (
    WEIGHTS_FILE,
    vendor_config,
    vendor_tensor_shapes,
    write_synthetic_v1_checkpoint,
)

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

IMAGE_TOKEN = 128815
PUBLISHED_TENSORS = 2_710
PUBLISHED_PARAMETERS = 3_336_106_240

# deepseek-ai/DeepSeek-OCR config.json as published (deepseek-ocr-facts.md §1.1; auto_map entries left out).
_LANGUAGE = {
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 1,
    "hidden_size": 1280,
    "intermediate_size": 6848,
    "kv_lora_rank": None,
    "lm_head": True,
    "max_position_embeddings": 8192,
    "moe_intermediate_size": 896,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_attention_heads": 10,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 12,
    "num_key_value_heads": 10,
    "q_lora_rank": None,
    "qk_nope_head_dim": 0,
    "qk_rope_head_dim": 0,
    "rm_head": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "use_mla": False,
    "v_head_dim": 0,
    "vocab_size": 129280,
}
PUBLISHED_CONFIG: dict[str, Any] = {
    "_name_or_path": "deepseek-ai/DeepSeek-OCR",
    "candidate_resolutions": [[1024, 1024]],
    "global_view_pos": "head",
    "architectures": ["DeepseekOCRForCausalLM"],
    "language_config": {"architectures": ["DeepseekV2ForCausalLM"], **_LANGUAGE, "torch_dtype": "bfloat16"},
    "model_type": "deepseek_vl_v2",
    "projector_config": {"input_dim": 2048, "model_type": "mlp_projector", "n_embed": 1280, "projector_type": "linear"},
    "tile_tag": "2D",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "vision_config": {
        "image_size": 1024,
        "mlp_ratio": 3.7362,
        "model_name": "deeplip_b_l",
        "model_type": "vision",
        "width": {
            "clip-l-14-224": {"heads": 16, "image_size": 224, "layers": 24, "patch_size": 14, "width": 1024},
            "sam_vit_b": {
                "downsample_channels": [512, 1024],
                "global_attn_indexes": [2, 5, 8, 11],
                "heads": 12,
                "layers": 12,
                "width": 768,
            },
        },
    },
    **_LANGUAGE,
}


def published_tensor_table() -> dict[str, tuple[int, ...]]:
    """The hub checkpoint's tensor names and shapes, written out from its published table (facts §1.5)."""
    table: dict[str, tuple[int, ...]] = {
        "lm_head.weight": (129280, 1280),
        "model.embed_tokens.weight": (129280, 1280),
        "model.norm.weight": (1280,),
        "model.image_newline": (1280,),
        "model.view_seperator": (1280,),
        "model.projector.layers.weight": (1280, 2048),
        "model.projector.layers.bias": (1280,),
    }
    table.update(_published_decoder())
    table.update(_published_sam())
    table.update(_published_clip())
    return table


def _published_decoder() -> Iterator[tuple[str, tuple[int, ...]]]:
    for layer in range(12):
        p = f"model.layers.{layer}."
        yield from ((p + f"{norm}.weight", (1280,)) for norm in ("input_layernorm", "post_attention_layernorm"))
        yield from ((p + f"self_attn.{x}_proj.weight", (1280, 1280)) for x in "qkvo")
        if layer == 0:
            yield from ((p + f"mlp.{x}_proj.weight", (6848, 1280)) for x in ("gate", "up"))
            yield p + "mlp.down_proj.weight", (1280, 6848)
            continue
        yield p + "mlp.gate.weight", (64, 1280)
        yield from ((p + f"mlp.shared_experts.{x}_proj.weight", (1792, 1280)) for x in ("gate", "up"))
        yield p + "mlp.shared_experts.down_proj.weight", (1280, 1792)
        for expert in range(64):
            e = p + f"mlp.experts.{expert}."
            yield from ((e + f"{x}_proj.weight", (896, 1280)) for x in ("gate", "up"))
            yield e + "down_proj.weight", (1280, 896)


def _published_sam() -> Iterator[tuple[str, tuple[int, ...]]]:
    p = "model.sam_model."
    for block in range(12):
        b = p + f"blocks.{block}."
        rel = 127 if block in (2, 5, 8, 11) else 27
        yield from ((b + f"attn.rel_pos_{axis}", (rel, 64)) for axis in "hw")
        shapes = {"attn.qkv": (2304, 768), "attn.proj": (768, 768), "mlp.lin1": (3072, 768), "mlp.lin2": (768, 3072)}
        for name, shape in shapes.items():
            yield b + f"{name}.weight", shape
            yield b + f"{name}.bias", (shape[0],)
        for norm in ("norm1", "norm2"):
            yield from ((b + f"{norm}.{kind}", (768,)) for kind in ("weight", "bias"))
    yield p + "neck.0.weight", (256, 768, 1, 1)
    yield p + "neck.2.weight", (256, 256, 3, 3)
    yield from ((p + f"neck.{i}.{kind}", (256,)) for i in (1, 3) for kind in ("weight", "bias"))
    yield p + "net_2.weight", (512, 256, 3, 3)
    yield p + "net_3.weight", (1024, 512, 3, 3)
    yield p + "patch_embed.proj.weight", (768, 3, 16, 16)
    yield p + "patch_embed.proj.bias", (768,)
    yield p + "pos_embed", (1, 64, 64, 768)


def _published_clip() -> Iterator[tuple[str, tuple[int, ...]]]:
    p = "model.vision_model."
    yield p + "embeddings.class_embedding", (1024,)
    yield p + "embeddings.patch_embedding.weight", (1024, 3, 14, 14)
    yield p + "embeddings.position_embedding.weight", (257, 1024)
    yield from ((p + f"pre_layrnorm.{kind}", (1024,)) for kind in ("weight", "bias"))
    for layer in range(24):
        b = p + f"transformer.layers.{layer}."
        shapes = {"self_attn.qkv_proj": (3072, 1024), "self_attn.out_proj": (1024, 1024)}
        shapes |= {"mlp.fc1": (4096, 1024), "mlp.fc2": (1024, 4096), "layer_norm1": (1024,), "layer_norm2": (1024,)}
        for name, shape in shapes.items():
            yield b + f"{name}.weight", shape
            yield b + f"{name}.bias", (shape[0],)


# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_arch() -> dict[str, Any]:
    """`model=deepseek_ocr_tiny`'s architecture as a plain dict."""
    container = OmegaConf.to_container(compose_config("stage1", "model=deepseek_ocr_tiny").model.architecture)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory, tiny_arch: dict[str, Any]) -> Path:
    """A tiny synthetic vendor-layout checkpoint (bf16 random values, seed 1)."""
    return write_synthetic_v1_checkpoint(tmp_path_factory.mktemp("tiny_v1"), tiny_arch, seed=1)


@pytest.fixture(scope="module")
def vendor(tiny_folder: Path) -> dict[str, torch.Tensor]:
    """The tiny checkpoint's tensors by vendor name, in float32."""
    return {name: tensor.float() for name, tensor in load_file(tiny_folder / WEIGHTS_FILE).items()}


@pytest.fixture(scope="module")
def tiny_model(tiny_folder: Path) -> DeepseekOcrForConditionalGeneration:
    """The tiny checkpoint loaded in float32 on the CPU."""
    model, _ = load_v1_checkpoint(tiny_folder, device="cpu", dtype=torch.float32)
    return model


@pytest.fixture
def broken(tmp_path: Path, tiny_folder: Path) -> Callable[..., Path]:
    """`broken(edit_tensors=..., edit_config=...)` -> a copy of the tiny checkpoint with its tensors/config edited."""

    def make(
        edit_tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
        edit_config: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        folder = tmp_path / "checkpoint"
        shutil.copytree(tiny_folder, folder)
        if edit_tensors:
            tensors = load_file(folder / WEIGHTS_FILE)
            edit_tensors(tensors)
            save_file(tensors, folder / WEIGHTS_FILE)
        if edit_config:
            config = json.loads((folder / "config.json").read_text())
            edit_config(config)
            (folder / "config.json").write_text(json.dumps(config))
        return folder

    return make


def _load_error(folder: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_v1_checkpoint(folder, device="cpu", dtype=torch.float32)
    return str(caught.value)


# ------------------------------------------------------------------------ expected tensors, mapped independently


def _vendor_key(ours: str) -> str:
    """The vendor's name of one of our renamed tensors (the map of the brief, written out step by step)."""
    key = ours.replace("model.language_model.", "model.")
    key = key.replace("sam_model.patch_embed.projection.", "sam_model.patch_embed.proj.")
    key = re.sub(r"sam_model\.layers\.(\d+)\.layer_norm(\d)\.", r"sam_model.blocks.\1.norm\2.", key)
    key = key.replace("sam_model.layers.", "sam_model.blocks.")
    for ours_part, theirs in (("conv1", "0"), ("layer_norm1", "1"), ("conv2", "2"), ("layer_norm2", "3")):
        key = key.replace(f"sam_model.neck.{ours_part}.", f"sam_model.neck.{theirs}.")
    key = key.replace("sam_model.proj.conv1.", "sam_model.net_2.").replace("sam_model.proj.conv2.", "sam_model.net_3.")
    key = key.replace("vision_model.encoder.layers.", "vision_model.transformer.layers.")
    return key.replace("model.projector.", "model.projector.layers.")


def _expected(ours: str, shape: torch.Size, vendor: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    """Our tensor `ours` computed from the vendor tensors; records the vendor names it used in `used`."""
    qkv = re.match(r"(.*)\.encoder\.(layers\.\d+\.self_attn\.)([qkv])_proj\.(weight|bias)$", ours)
    if qkv:
        name = f"{qkv[1]}.transformer.{qkv[2]}qkv_proj.{qkv[4]}"
        used.add(name)
        return vendor[name].chunk(3, dim=0)["qkv".index(qkv[3])]
    experts = re.match(r"model\.language_model\.(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$", ours)
    if experts:
        kinds = ("gate_proj", "up_proj") if experts[2] == "gate_up_proj" else ("down_proj",)
        names = [[f"model.{experts[1]}.{e}.{kind}.weight" for kind in kinds] for e in range(shape[0])]
        used.update(name for row in names for name in row)
        return torch.stack([torch.cat([vendor[name] for name in row]) for row in names])
    used.add(_vendor_key(ours))
    return vendor[_vendor_key(ours)]


# -------------------------------------------------------------------------------------------------- config.json


def _write_config(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_published_config_gives_the_shipped_architecture(tmp_path: Path) -> None:
    assert read_v1_architecture(_write_config(tmp_path, PUBLISHED_CONFIG)) == shipped_architecture()


def test_top_level_language_fields_are_accepted(tmp_path: Path) -> None:
    config = {k: v for k, v in PUBLISHED_CONFIG.items() if k != "language_config"}
    assert read_v1_architecture(_write_config(tmp_path, config)) == shipped_architecture()


def test_language_config_is_honoured_and_vision_stays_vendor_sized(tmp_path: Path) -> None:
    config = copy.deepcopy(PUBLISHED_CONFIG)
    config["language_config"].update(num_hidden_layers=4, first_k_dense_replace=2, n_routed_experts=32)
    config["vision_config"]["width"]["sam_vit_b"]["width"] = 512  # ignored, as by the vendor's code
    architecture = read_v1_architecture(_write_config(tmp_path, config))
    text = architecture["text_config"]
    assert (text["num_hidden_layers"], text["n_routed_experts"]) == (4, 32)
    assert text["mlp_layer_types"] == ["dense", "dense", "sparse", "sparse"]
    assert text["head_dim"] == 128
    shipped = shipped_architecture()
    assert architecture["sam_config"] == shipped["sam_config"]
    assert architecture["clip_config"] == shipped["clip_config"]


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_vendor_config_round_trips(tmp_path: Path, tiny_arch: dict[str, Any], size: str) -> None:
    architecture = tiny_arch if size == "tiny" else shipped_architecture()
    assert read_v1_architecture(_write_config(tmp_path, vendor_config(architecture))) == architecture


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"architectures": ["DeepseekOCR2ForCausalLM"]}, "model=deepseek_ocr2"),
        ({"architectures": None, "model_type": "deepseek_ocr2"}, "model=deepseek_ocr2"),
        ({"architectures": ["DeepseekVLV2ForCausalLM"]}, "not a DeepSeek-OCR v1 checkpoint"),
        ({"language_config": {**_LANGUAGE, "norm_topk_prob": True}}, "norm_topk_prob=True"),
        ({"language_config": {**_LANGUAGE, "use_mla": True}}, "use_mla=True"),
    ],
)
def test_other_models_are_rejected(tmp_path: Path, edit: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserError, match=re.escape(expected)):
        read_v1_architecture(_write_config(tmp_path, {**PUBLISHED_CONFIG, **edit}))


def test_missing_decoder_fields_are_named(tmp_path: Path) -> None:
    config = {k: v for k, v in PUBLISHED_CONFIG.items() if k not in ("language_config", "vocab_size")}
    with pytest.raises(UserError, match="vocab_size"):
        read_v1_architecture(_write_config(tmp_path, config))


# ------------------------------------------------------------------------------------------------- round trip


def test_every_parameter_equals_the_mapped_vendor_tensor(
    tiny_model: DeepseekOcrForConditionalGeneration, vendor: dict[str, torch.Tensor]
) -> None:
    used: set[str] = set()
    state = tiny_model.state_dict()
    for name, tensor in state.items():
        assert torch.equal(tensor, _expected(name, tensor.shape, vendor, used)), name
    assert used == set(vendor)  # every vendor tensor went somewhere, and only once per use
    assert len(state) < len(vendor)  # the experts are fused


def test_buffers_are_real_and_equal_a_fresh_build(tiny_folder: Path, tiny_arch: dict[str, Any]) -> None:
    model, _ = load_v1_checkpoint(tiny_folder, device="cpu", dtype=torch.bfloat16)
    fresh = DeepseekOcrForConditionalGeneration(DeepseekOcrConfig.from_architecture(tiny_arch))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for name, buffer in fresh.named_buffers():
        loaded = model.get_buffer(name)
        assert not loaded.is_meta
        assert loaded.dtype == buffer.dtype  # rotary inv_freq stays float32, position_ids int64
        assert torch.equal(loaded, buffer), name


def _logits(model: DeepseekOcrForConditionalGeneration, device: str = "cpu") -> torch.Tensor:
    """A short prefill of one 512-px view (mode tiny: 8 rows x (8 + newline) + separator = 73 image tokens)."""
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 512, 512, generator=generator) * 2 - 1
    ids = torch.tensor([[0] + [IMAGE_TOKEN] * 73 + [10, 11, 12]])
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=ids.to(device), pixel_values=pixels.to(device, dtype)).logits
    return logits.float().cpu()


def test_logits_are_finite_deterministic_and_depend_on_the_weights(
    tmp_path: Path, tiny_folder: Path, tiny_arch: dict[str, Any], tiny_model: DeepseekOcrForConditionalGeneration
) -> None:
    first = _logits(tiny_model)
    again, _ = load_v1_checkpoint(tiny_folder, device="cpu", dtype=torch.float32)
    other, _ = load_v1_checkpoint(
        write_synthetic_v1_checkpoint(tmp_path, tiny_arch, seed=2), device="cpu", dtype=torch.float32
    )
    assert first.shape == (1, 77, 129280)
    assert torch.isfinite(first).all()
    assert torch.equal(first, _logits(again))
    assert not torch.allclose(first, _logits(other))


def _reference_moe(
    x: torch.Tensor, vendor: dict[str, torch.Tensor], layer: int, top_k: int, swap: bool = False
) -> torch.Tensor:
    """DeepSeek-V2 MoE from the vendor's per-expert tensors: softmax router, greedy top-k (no renormalisation),
    SiLU(gate) * up -> down per chosen expert, plus the shared experts. `swap` exchanges gate and up."""
    p = f"model.layers.{layer}.mlp."
    gate, up = ("up_proj", "gate_proj") if swap else ("gate_proj", "up_proj")
    weights, chosen = torch.softmax(x @ vendor[p + "gate.weight"].T, dim=-1).topk(top_k, dim=-1)
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(top_k):
            e = f"{p}experts.{int(chosen[token, slot])}."
            hidden = F.silu(x[token] @ vendor[e + f"{gate}.weight"].T) * (x[token] @ vendor[e + f"{up}.weight"].T)
            out[token] += weights[token, slot] * (hidden @ vendor[e + "down_proj.weight"].T)
    s = p + "shared_experts."
    shared = F.silu(x @ vendor[s + "gate_proj.weight"].T) * (x @ vendor[s + "up_proj.weight"].T)
    return out + shared @ vendor[s + "down_proj.weight"].T


@pytest.mark.parametrize("experts_implementation", ["eager", "batched_mm", "grouped_mm"])
def test_moe_layer_matches_per_expert_reference(
    tiny_folder: Path, vendor: dict[str, torch.Tensor], tiny_arch: dict[str, Any], experts_implementation: str
) -> None:
    model, _ = load_v1_checkpoint(
        tiny_folder, device="cpu", dtype=torch.float32, experts_implementation=experts_implementation
    )
    x = torch.randn(7, tiny_arch["text_config"]["hidden_size"], generator=torch.Generator().manual_seed(3))
    top_k = tiny_arch["text_config"]["num_experts_per_tok"]
    with torch.no_grad():
        for layer in (1, 2):
            got = model.model.language_model.layers[layer].mlp(x.unsqueeze(0)).squeeze(0)
            torch.testing.assert_close(got, _reference_moe(x, vendor, layer, top_k), rtol=1e-4, atol=1e-6)
            assert not torch.allclose(got, _reference_moe(x, vendor, layer, top_k, swap=True), atol=1e-4)


def test_clip_q_k_v_are_the_fused_qkv_blocks(
    tiny_model: DeepseekOcrForConditionalGeneration, vendor: dict[str, torch.Tensor]
) -> None:
    attention = tiny_model.model.vision_model.encoder.layers[1].self_attn
    fused_name = "model.vision_model.transformer.layers.1.self_attn.qkv_proj."
    x = torch.randn(5, attention.q_proj.in_features, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fused = F.linear(x, vendor[fused_name + "weight"], vendor[fused_name + "bias"])
        ours = [attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)]
    for block, projected in zip(fused.chunk(3, dim=-1), ours, strict=True):
        torch.testing.assert_close(projected, block)


def test_shards_are_found_by_index_and_by_glob(tmp_path: Path, tiny_folder: Path) -> None:
    tensors = load_file(tiny_folder / WEIGHTS_FILE)
    names = sorted(tensors)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({name: tensors[name] for name in part}, tmp_path / file)
    shutil.copy(tiny_folder / "config.json", tmp_path / "config.json")
    by_glob, _ = load_v1_checkpoint(tmp_path, device="cpu", dtype=torch.float32)
    weight_map = {name: file for file, part in shards.items() for name in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    save_file({"stray": torch.zeros(1)}, tmp_path / "unlisted.safetensors")  # not in the index: not read
    by_index, _ = load_v1_checkpoint(tmp_path, device="cpu", dtype=torch.float32)
    reference = load_v1_checkpoint(tiny_folder, device="cpu", dtype=torch.float32)[0].state_dict()
    for model in (by_glob, by_index):
        assert all(torch.equal(tensor, reference[name]) for name, tensor in model.state_dict().items())


def test_position_ids_of_the_float32_resave_are_ignored(broken: Callable[..., Path]) -> None:
    def add(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.vision_model.embeddings.position_ids"] = torch.arange(257).unsqueeze(0)

    model, _ = load_v1_checkpoint(broken(edit_tensors=add), device="cpu", dtype=torch.float32)
    assert torch.equal(model.model.vision_model.embeddings.position_ids, torch.arange(257).unsqueeze(0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_loads_onto_cuda(tiny_folder: Path, tiny_model: DeepseekOcrForConditionalGeneration) -> None:
    model, _ = load_v1_checkpoint(tiny_folder, device="cuda", dtype=torch.float32)
    assert {t.device.type for t in (*model.parameters(), *model.buffers())} == {"cuda"}
    torch.testing.assert_close(_logits(model, "cuda"), _logits(tiny_model), rtol=1e-3, atol=1e-3)
    half, _ = load_v1_checkpoint(tiny_folder, device="cuda", dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert torch.isfinite(_logits(half, "cuda")).all()


# ------------------------------------------------------------------------------------------------------ errors


def test_missing_tensor_is_named(broken: Callable[..., Path]) -> None:
    message = _load_error(broken(edit_tensors=lambda t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight")))
    assert "1 missing" in message
    assert "model.layers.2.mlp.experts.3.up_proj.weight" in message


def test_many_missing_tensors_are_counted_and_listed_in_part(broken: Callable[..., Path]) -> None:
    def drop_layer(tensors: dict[str, torch.Tensor]) -> None:
        for name in [n for n in tensors if n.startswith("model.layers.2.mlp.experts.")]:
            del tensors[name]

    message = _load_error(broken(edit_tensors=drop_layer))
    assert "24 missing" in message  # 8 experts x 3 projections
    assert "(14 more)" in message
    assert message.count("model.layers.2.mlp.experts.") == checkpoint.SHOWN


def test_unexpected_tensor_is_named(broken: Callable[..., Path]) -> None:
    def add(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.2.mlp.experts.8.gate_proj.weight"] = torch.zeros(32, 64)  # the tiny model has 8

    message = _load_error(broken(edit_tensors=add))
    assert "1 unexpected" in message
    assert "model.layers.2.mlp.experts.8.gate_proj.weight" in message


def test_misshaped_tensors_are_named_before_anything_is_read(
    broken: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def reshape(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.projector.layers.weight"] = torch.zeros(64, 95)
        tensors["model.vision_model.transformer.layers.0.self_attn.qkv_proj.bias"] = torch.zeros(145)

    def must_not_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("tensors were read although the checks failed")

    monkeypatch.setattr(checkpoint, "read_state", must_not_read)
    message = _load_error(broken(edit_tensors=reshape))
    assert "mis-shaped" in message
    assert "model.projector.weight <- model.projector.layers.weight [64, 95]" in message
    assert "model expects [64, 96]" in message
    assert "model.vision_model.encoder.layers.0.self_attn.q_proj.bias" in message
    assert "do not fit together" in message


def test_ocr2_config_is_rejected(broken: Callable[..., Path]) -> None:
    message = _load_error(broken(edit_config=lambda c: c.update(architectures=["DeepseekOCR2ForCausalLM"])))
    assert "DeepSeek-OCR-2" in message
    assert "model=deepseek_ocr2" in message


def test_empty_folder_is_rejected(tmp_path: Path) -> None:
    assert "holds no config.json" in _load_error(tmp_path)
    assert "does not exist" in _load_error(tmp_path / "absent")


def test_folder_without_weights_is_rejected(tmp_path: Path, tiny_folder: Path) -> None:
    shutil.copy(tiny_folder / "config.json", tmp_path / "config.json")
    assert "no *.safetensors" in _load_error(tmp_path)


def test_tensor_in_two_shards_is_rejected(tmp_path: Path, tiny_folder: Path) -> None:
    shutil.copytree(tiny_folder, tmp_path, dirs_exist_ok=True)
    save_file({"lm_head.weight": torch.zeros(1)}, tmp_path / "stale.safetensors")
    message = _load_error(tmp_path)
    assert "lm_head.weight is stored twice" in message


# ------------------------------------------------------------------------------------------- full size (meta)


@pytest.fixture(scope="module")
def full_shapes() -> dict[str, tuple[int, ...]]:
    """Our full-size state-dict shapes, from the meta device."""
    config = DeepseekOcrConfig.from_architecture(shipped_architecture())
    return model_shapes(build_empty_model(config))


def test_published_table_has_the_published_totals() -> None:
    table = published_tensor_table()
    assert len(table) == PUBLISHED_TENSORS
    assert sum(math.prod(shape) for shape in table.values()) == PUBLISHED_PARAMETERS


def test_full_size_map_fills_the_model_from_exactly_the_published_tensors(
    full_shapes: dict[str, tuple[int, ...]],
) -> None:
    plan = build_plan(full_shapes)
    assert not find_problems(plan, full_shapes, published_tensor_table())
    assert sum(math.prod(shape) for shape in full_shapes.values()) == PUBLISHED_PARAMETERS


def test_synthetic_writer_uses_the_published_names_and_shapes() -> None:
    assert vendor_tensor_shapes(shipped_architecture()) == published_tensor_table()


def test_full_size_problems_are_found(full_shapes: dict[str, tuple[int, ...]]) -> None:
    table = published_tensor_table()
    del table["model.layers.5.mlp.experts.63.down_proj.weight"]
    table["model.sam_model.net_3.weight"] = (896, 512, 3, 3)  # OCR-2's SAM
    problems = find_problems(build_plan(full_shapes), full_shapes, table)
    assert problems.missing == ["model.layers.5.mlp.experts.63.down_proj.weight"]
    assert problems.unexpected == []
    assert [line.split(" <- ")[0] for line in problems.misshaped] == ["model.sam_model.proj.conv2.weight"]

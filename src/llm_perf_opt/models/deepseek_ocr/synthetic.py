"""Synthetic DeepSeek-OCR v1 checkpoints in the vendor layout, for tests and for benchmarking the loading path.

``write_synthetic_v1_checkpoint`` writes what ``deepseek-ai/DeepSeek-OCR`` ships (vendor config.json, one
safetensors file of vendor names and shapes) with random values, for any ``architecture``. config.json also records
the vision sizes (which the vendor's code hard-codes) under ``llm_perf_opt.vision_architecture``, so reduced (tiny)
checkpoints round-trip. The whole tensor set is held in memory while writing (6.2 GiB in bf16 at full size).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers.utils import CONFIG_NAME

from llm_perf_opt.models.deepseek_ocr.checkpoint import (
    LANGUAGE_COPIED,
    OWN_KEY,
    OWN_VISION_KEYS,
    V1_ARCHITECTURE,
    Target,
    build_empty_model,
    build_plan,
    model_shapes,
)
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig

WEIGHTS_FILE = "model-00001-of-000001.safetensors"  # the hub checkpoint's single file
INIT_STD = 0.02


def vendor_tensor_shapes(architecture: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The vendor checkpoint's tensor names and shapes for `architecture` (the loader's name map, inverted)."""
    model = build_empty_model(DeepseekOcrConfig.from_architecture(architecture))
    shapes = model_shapes(model)
    vendor: dict[str, tuple[int, ...]] = {}
    for target in build_plan(shapes):
        for name, shape in _source_shapes(target, shapes[target.name]).items():
            if vendor.setdefault(name, shape) != shape:
                raise ValueError(f"vendor tensor {name} would need two shapes: {vendor[name]} and {shape}")
    return vendor


def _source_shapes(target: Target, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The vendor shapes whose pieces build a tensor of `shape` (rows split evenly among their pieces)."""
    row = shape[1:] if target.stacked else shape
    sources = {}
    for pieces in target.rows:
        block = row[0] // len(pieces)
        for piece in pieces:
            sources[piece.name] = (block * piece.parts, *row[1:])
    return sources


def random_tensors(
    shapes: Mapping[str, tuple[int, ...]], seed: int, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) values per name (sorted, so the seed fixes every value); norm weights (1-D ``*.weight``)
    are 1 + that noise, so that a forward stays well scaled."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        values = torch.randn(shapes[name], generator=generator) * INIT_STD
        if name.endswith(".weight") and len(shapes[name]) == 1:
            values += 1.0
        tensors[name] = values.to(dtype)
    return tensors


def vendor_config(architecture: Mapping[str, Any], *, torch_dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json in the vendor layout for `architecture` (DeepSeek-V2 ``language_config``, repeated at top level)."""
    language = _language_config(architecture["text_config"], torch_dtype)
    sam, clip = architecture["sam_config"], architecture["clip_config"]
    hidden = int(architecture["text_config"]["hidden_size"])
    top_level = {k: v for k, v in language.items() if k not in ("architectures", "auto_map", "torch_dtype")}
    return {
        "_name_or_path": "deepseek-ai/DeepSeek-OCR",
        "architectures": [V1_ARCHITECTURE],
        "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[1024, 1024]],
        "global_view_pos": "head",
        "tile_tag": "2D",
        "torch_dtype": torch_dtype,
        "transformers_version": "4.46.3",
        "language_config": language,
        "vision_config": {
            "image_size": 1024,
            "mlp_ratio": 3.7362,
            "model_name": "deeplip_b_l",
            "model_type": "vision",
            "width": {
                "clip-l-14-224": {
                    "heads": clip["num_attention_heads"],
                    "image_size": clip["image_size"],
                    "layers": clip["num_hidden_layers"],
                    "patch_size": clip["patch_size"],
                    "width": clip["hidden_size"],
                },
                "sam_vit_b": {
                    "downsample_channels": list(sam["downsample_channels"]),
                    "global_attn_indexes": list(sam["global_attn_indexes"]),
                    "heads": sam["num_attention_heads"],
                    "layers": sam["num_hidden_layers"],
                    "width": sam["hidden_size"],
                },
            },
        },
        "projector_config": {
            "input_dim": architecture["projector_input_dim"],
            "model_type": "mlp_projector",
            "n_embed": hidden,
            "projector_type": "linear",
        },
        **top_level,
        # the vision sizes as plain JSON values
        OWN_KEY: {"vision_architecture": json.loads(json.dumps({key: architecture[key] for key in OWN_VISION_KEYS}))},
    }


def _language_config(text: Mapping[str, Any], torch_dtype: str) -> dict[str, Any]:
    """DeepSeek-V2 fields (MHA, no MLA) for our ``text_config``; ValueError for what the layout cannot express."""
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    if int(text["head_dim"]) * heads != hidden:
        raise ValueError(f"head_dim {text['head_dim']} x {heads} heads != hidden_size {hidden}: not DeepSeek-V2 MHA")
    rope_theta, rope_scaling = _rope_fields(text["rope_parameters"])
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        **{name: text[name] for name in (*LANGUAGE_COPIED, "num_key_value_heads")},  # what the loader reads back
        "first_k_dense_replace": _first_dense(list(text["mlp_layer_types"])),
        "moe_layer_freq": 1,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "use_mla": False,
        "q_lora_rank": None,
        "kv_lora_rank": None,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "lm_head": True,
        "rm_head": False,
        "torch_dtype": torch_dtype,
    }


def _first_dense(layer_types: list[str]) -> int:
    """DeepSeek-V2's ``first_k_dense_replace``: the layout must be k dense layers, then only MoE layers."""
    dense = layer_types.index("sparse") if "sparse" in layer_types else len(layer_types)
    if any(kind != "sparse" for kind in layer_types[dense:]):
        raise ValueError(f"mlp_layer_types {layer_types} is not 'k dense layers, then MoE' (first_k_dense_replace)")
    return dense


def _rope_fields(rope: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    theta = float(rope["rope_theta"])
    if rope.get("rope_type", "default") == "default":
        return theta, None
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type")}
    return theta, {"type": rope["rope_type"], **scaling}


def write_synthetic_v1_checkpoint(
    folder: Path, architecture: Mapping[str, Any], seed: int = 0, *, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Write config.json and one safetensors file of random values, vendor names and shapes; returns `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = random_tensors(vendor_tensor_shapes(architecture), seed, dtype)
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    config = vendor_config(architecture, torch_dtype=str(dtype).removeprefix("torch."))
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder

"""Load the official DeepSeek-OCR v1 checkpoint (``deepseek-ai/DeepSeek-OCR`` layout) without its remote code.

The folder holds ``config.json`` in the vendor layout (``language_config`` / ``vision_config`` /
``projector_config``) and ``*.safetensors`` files with the vendor's tensor names. The decoder comes from
``language_config``; the vision sizes are hard-coded in the vendor's code, so they come from the shipped
``conf/model/deepseek_ocr.yaml`` unless the folder records its own under ``llm_perf_opt.vision_architecture``
(reduced synthetic checkpoints do). Each tensor of our model (built on the meta device) is a rename of a vendor
tensor, a block of CLIP's fused ``qkv_proj``, or the per-expert MoE weights fused into ``gate_up_proj`` /
``down_proj``; the whole plan is checked before any tensor is read.

See ../shared/reference/deepseek-ocr-facts.md §1.1 (config.json) and §1.5 (tensor table).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import torch
import yaml
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers.utils import CONFIG_NAME

from llm_perf_opt.errors import UserError
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration

V1_ARCHITECTURE = "DeepseekOCRForCausalLM"
V1_MODEL_TYPES = ("deepseek_vl_v2", "DeepseekOCR")  # hub config / the float32 re-save
OCR2_ARCHITECTURE = "DeepseekOCR2ForCausalLM"
OCR2_MODEL_TYPE = "deepseek_ocr2"  # transformers' native DeepSeek-OCR-2 layout
OWN_KEY = "llm_perf_opt"  # config.json block the vendor code ignores; synthetic checkpoints record vision sizes here
OWN_VISION_KEYS = ("sam_config", "clip_config", "projector_input_dim", "image_token_id")
INDEX_FILE = "model.safetensors.index.json"
IGNORED_VENDOR_TENSORS = re.compile(r"^model\.vision_model\.embeddings\.position_ids$")  # f32 re-save; a buffer here
SHOWN = 10  # names listed per kind of problem

_USE_V1_CHECKPOINT = (
    "Point model.path at a local deepseek-ai/DeepSeek-OCR checkpoint folder (its config.json and every *.safetensors "
    "file), or leave model.path unset to build the published architecture with random weights"
)

# DeepSeek-V2 config defaults: what the vendor's code uses when language_config and the top level omit a field.
_LANGUAGE_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "use_mla": False,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
}
_LANGUAGE_REQUIRED = (
    *("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"),
    *("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size"),
)
# Fields copied unchanged into text_config (synthetic.py writes them back).
LANGUAGE_COPIED = (
    *_LANGUAGE_REQUIRED,
    *("max_position_embeddings", "rms_norm_eps", "topk_method", "n_group", "topk_group", "routed_scaling_factor"),
    *("bos_token_id", "eos_token_id", "attention_bias", "hidden_act", "tie_word_embeddings"),
)
# Values this implementation computes differently: (field, the one value it supports).
_LANGUAGE_SUPPORTED = (("scoring_func", "softmax"), ("norm_topk_prob", False), ("use_mla", False))


# --------------------------------------------------------------------------------------------------- config.json


def shipped_architecture() -> dict[str, Any]:
    """The published full-size ``architecture`` of the shipped ``conf/model/deepseek_ocr.yaml`` (a fresh copy)."""
    source = resources.files("llm_perf_opt.conf").joinpath("model/deepseek_ocr.yaml")
    architecture = yaml.safe_load(source.read_text(encoding="utf-8"))["architecture"]
    assert isinstance(architecture, dict)
    return {str(k): v for k, v in architecture.items()}


def read_config_json(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a dict (UserError when absent or not a JSON object)."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        reason = "does not exist" if not folder.exists() else f"holds no config.json ({folder.resolve()})"
        raise UserError(f"The DeepSeek-OCR checkpoint folder {folder} {reason}", _USE_V1_CHECKPOINT)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc})", _USE_V1_CHECKPOINT) from exc
    if not isinstance(config, dict):
        raise UserError(f"{path} holds a JSON {type(config).__name__}, not an object", _USE_V1_CHECKPOINT)
    return config


def check_v1_config(config: Mapping[str, Any], where: Path) -> None:
    """UserError unless config.json declares DeepSeek-OCR v1 (OCR-2 gets the fix ``model=deepseek_ocr2``)."""
    architectures = [str(a) for a in config.get("architectures") or []]
    model_type = str(config.get("model_type"))
    vision = config.get("vision_config") or {}
    found = f"model_type {model_type!r}, architectures {architectures}"
    is_ocr2 = (
        OCR2_ARCHITECTURE in architectures
        or model_type == OCR2_MODEL_TYPE
        or (isinstance(vision, Mapping) and vision.get("model_name") == "deepencoderv2")
    )
    if is_ocr2:
        raise UserError(
            f"{where} is a DeepSeek-OCR-2 checkpoint ({found}), not DeepSeek-OCR v1",
            "Use model=deepseek_ocr2 for this folder, or point model.path at a deepseek-ai/DeepSeek-OCR checkpoint",
        )
    if V1_ARCHITECTURE in architectures or (not architectures and model_type in V1_MODEL_TYPES):
        return
    raise UserError(
        f"{where} is not a DeepSeek-OCR v1 checkpoint ({found}; expected architectures [{V1_ARCHITECTURE!r}])",
        f"{_USE_V1_CHECKPOINT}; for DeepSeek-OCR-2 use model=deepseek_ocr2",
    )


def language_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's fields: ``language_config`` over the top-level copies over the DeepSeek-V2 defaults (nulls
    count as absent)."""
    language = config.get("language_config") or {}
    given = [{k: v for k, v in source.items() if v is not None} for source in (config, language)]
    return {**_LANGUAGE_DEFAULTS, **given[0], **given[1]}


def text_config_from_language(fields: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """Our ``text_config`` (DeepseekOcr2TextConfig kwargs) from DeepSeek-V2 language fields."""
    _require_language_fields(fields, where)
    text: dict[str, Any] = {name: fields[name] for name in LANGUAGE_COPIED}
    hidden, heads = int(fields["hidden_size"]), int(fields["num_attention_heads"])
    if hidden % heads:
        raise UserError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
            "Fix language_config in config.json; DeepSeek-OCR v1 uses 1280 and 10",
        )
    text["num_key_value_heads"] = fields.get("num_key_value_heads") or heads
    text["head_dim"] = hidden // heads
    text["rope_parameters"] = _rope_parameters(fields)
    text["mlp_layer_types"] = _mlp_layer_types(fields)
    text["mlp_bias"] = False
    return text


def _require_language_fields(fields: Mapping[str, Any], where: Path) -> None:
    missing = [name for name in _LANGUAGE_REQUIRED if fields.get(name) is None]
    if missing:
        raise UserError(
            f"{where} does not give the decoder's {', '.join(missing)} (neither in language_config nor at top level)",
            "Use the config.json that came with the deepseek-ai/DeepSeek-OCR checkpoint",
        )
    unsupported = [f"{name}={fields[name]!r}" for name, value in _LANGUAGE_SUPPORTED if fields[name] != value]
    if unsupported:
        raise UserError(
            f"{where} asks for {', '.join(unsupported)}, which DeepSeek-OCR v1 does not use and this implementation "
            "does not support",
            "Use the config.json that came with the deepseek-ai/DeepSeek-OCR checkpoint",
        )


def _rope_parameters(fields: Mapping[str, Any]) -> dict[str, Any]:
    scaling = fields.get("rope_scaling")
    theta = float(fields["rope_theta"])
    if not scaling:
        return {"rope_theta": theta, "rope_type": "default"}
    kept = {k: v for k, v in dict(scaling).items() if k != "type"}
    return {**kept, "rope_type": scaling.get("rope_type", scaling.get("type")), "rope_theta": theta}


def _mlp_layer_types(fields: Mapping[str, Any]) -> list[str]:
    """DeepSeek-V2's rule: layer i is MoE iff experts exist, i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    first_dense = int(fields["first_k_dense_replace"])
    frequency = int(fields["moe_layer_freq"])
    experts = bool(fields["n_routed_experts"])
    return [
        "sparse" if experts and i >= first_dense and i % frequency == 0 else "dense"
        for i in range(int(fields["num_hidden_layers"]))
    ]


def read_v1_architecture(folder: Path) -> dict[str, Any]:
    """The ``architecture`` dict of a v1 checkpoint folder's config.json: its decoder, the vendor's vision sizes."""
    config, where = read_config_json(folder), folder / CONFIG_NAME
    check_v1_config(config, where)
    architecture = shipped_architecture()
    architecture["text_config"] = text_config_from_language(language_fields(config), where)
    own = config.get(OWN_KEY) or {}
    vision = own.get("vision_architecture") if isinstance(own, Mapping) else None
    if isinstance(vision, Mapping):
        architecture.update({key: vision[key] for key in OWN_VISION_KEYS if key in vision})
    return architecture


# ------------------------------------------------------------------------------------------------ tensor index


@attrs.frozen
class CheckpointIndex:
    """The vendor tensors of a checkpoint folder: shapes and the file each lives in (headers only, no data)."""

    shapes: dict[str, tuple[int, ...]]
    files: dict[str, Path]


def safetensors_files(folder: Path) -> list[Path]:
    """The shards named by ``model.safetensors.index.json``, else every ``*.safetensors`` of the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(f"{index} is not a safetensors index ({exc!r})", _USE_V1_CHECKPOINT) from exc
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise UserError(f"{index} names shards that are not in {folder}: {', '.join(absent)}", _USE_V1_CHECKPOINT)
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in folder.glob("*.bin"))
        extra = f" (it has {', '.join(others[:3])}: convert them to safetensors)" if others else ""
        raise UserError(f"{folder.resolve()} holds no *.safetensors weights{extra}", _USE_V1_CHECKPOINT)
    return files


def index_checkpoint(folder: Path) -> CheckpointIndex:
    """Name, shape and file of every tensor in the folder's safetensors files (lazy: reads the headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    files: dict[str, Path] = {}
    for path in safetensors_files(folder):
        for name, shape in _header_shapes(path).items():
            if name in files:
                raise UserError(
                    f"Tensor {name} is stored twice, in {files[name].name} and {path.name}",
                    "Remove the stale shard from the checkpoint folder",
                )
            shapes[name], files[name] = shape, path
    return CheckpointIndex(shapes=shapes, files=files)


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    except SafetensorError as exc:
        raise UserError(f"{path} is not a readable safetensors file ({exc})", _USE_V1_CHECKPOINT) from exc


# ------------------------------------------------------------------------------------------------------ the plan


@attrs.frozen
class Piece:
    """A vendor tensor, or its ``part``-th of ``parts`` equal blocks along dim 0 (CLIP's fused q/k/v)."""

    name: str
    part: int = 0
    parts: int = 1


@attrs.frozen
class Target:
    """One tensor of our state dict: each row's pieces concatenated along dim 0; with ``stacked``, rows stacked."""

    name: str
    rows: tuple[tuple[Piece, ...], ...]
    stacked: bool = False

    def pieces(self) -> Iterator[Piece]:
        """Every piece, row by row."""
        for row in self.rows:
            yield from row


# Our state-dict name -> the vendor's, first match wins (deepseek-ocr-facts.md §1.5 and the vendor's module names).
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"^model\.sam_model\.patch_embed\.projection\.", "model.sam_model.patch_embed.proj."),
        (r"^model\.sam_model\.layers\.(\d+)\.layer_norm([12])\.", r"model.sam_model.blocks.\1.norm\2."),
        (r"^model\.sam_model\.layers\.(\d+)\.", r"model.sam_model.blocks.\1."),
        (r"^model\.sam_model\.neck\.conv1\.", "model.sam_model.neck.0."),
        (r"^model\.sam_model\.neck\.layer_norm1\.", "model.sam_model.neck.1."),
        (r"^model\.sam_model\.neck\.conv2\.", "model.sam_model.neck.2."),
        (r"^model\.sam_model\.neck\.layer_norm2\.", "model.sam_model.neck.3."),
        (r"^model\.sam_model\.proj\.conv1\.", "model.sam_model.net_2."),
        (r"^model\.sam_model\.proj\.conv2\.", "model.sam_model.net_3."),
        (r"^model\.vision_model\.encoder\.layers\.", "model.vision_model.transformer.layers."),
        (r"^model\.projector\.", "model.projector.layers."),
        (r"^model\.language_model\.", "model."),
    )
)
_CLIP_QKV = re.compile(r"^model\.vision_model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$")
_EXPERTS = re.compile(r"^model\.language_model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def vendor_name(name: str) -> str:
    """The vendor's name of one of our tensors that is a plain rename."""
    for pattern, replacement in _RENAMES:
        renamed, count = pattern.subn(replacement, name, count=1)
        if count:
            return renamed
    return name


def target_for(name: str, shape: Sequence[int]) -> Target:
    """How our tensor `name` (of `shape`) is built from vendor tensors."""
    qkv = _CLIP_QKV.match(name)
    if qkv:
        layer, which, kind = qkv.groups()
        fused = f"model.vision_model.transformer.layers.{layer}.self_attn.qkv_proj.{kind}"
        return Target(name, ((Piece(fused, part="qkv".index(which), parts=3),),))
    experts = _EXPERTS.match(name)
    if experts:
        layer, kind = experts.groups()
        prefix = f"model.layers.{layer}.mlp.experts"
        projections = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
        rows = tuple(
            tuple(Piece(f"{prefix}.{expert}.{projection}.weight") for projection in projections)
            for expert in range(int(shape[0]))
        )
        return Target(name, rows, stacked=True)
    return Target(name, ((Piece(vendor_name(name)),),))


def build_plan(model_shapes: Mapping[str, Sequence[int]]) -> list[Target]:
    """One target per tensor of our state dict."""
    return [target_for(name, shape) for name, shape in model_shapes.items()]


def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the model's state dict (works on the meta device)."""
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------------ checks


@attrs.frozen
class PlanProblems:
    """What keeps a checkpoint from filling the model exactly."""

    missing: list[str]  # vendor names the model needs that the checkpoint lacks
    unexpected: list[str]  # checkpoint tensors nothing uses
    misshaped: list[str]  # "ours <- vendor: checkpoint gives X, model expects Y"

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.misshaped)


def find_problems(
    plan: Sequence[Target], expected: Mapping[str, Sequence[int]], vendor: Mapping[str, Sequence[int]]
) -> PlanProblems:
    """Missing, unexpected and mis-shaped tensors of `plan` given our shapes and the vendor's name -> shape."""
    used = {piece.name for target in plan for piece in target.pieces()}
    missing = sorted(used - vendor.keys())
    unexpected = sorted(name for name in vendor.keys() - used if not IGNORED_VENDOR_TENSORS.match(name))
    misshaped = []
    for target in plan:
        if any(piece.name not in vendor for piece in target.pieces()):
            continue
        built = built_shape(target, vendor)
        want = tuple(expected[target.name])
        if built != want:
            misshaped.append(f"{target.name} <- {_describe_sources(target, built, vendor)}: model expects {list(want)}")
    return PlanProblems(missing=missing, unexpected=unexpected, misshaped=misshaped)


def built_shape(target: Target, vendor: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    """The shape `target` builds from the vendor shapes, or None when its pieces do not fit together."""
    rows = [_row_shape(row, vendor) for row in target.rows]
    if any(row is None for row in rows) or len(set(rows)) != 1:
        return None
    row = rows[0]
    assert row is not None
    return (len(rows), *row) if target.stacked else row


def _row_shape(row: Sequence[Piece], vendor: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    shapes = [shape for piece in row if (shape := _piece_shape(piece, vendor)) is not None]
    if len(shapes) < len(row) or not shapes[0] or len({block[1:] for block in shapes}) != 1:
        return None
    return (sum(block[0] for block in shapes), *shapes[0][1:])


def _piece_shape(piece: Piece, vendor: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    shape = tuple(vendor[piece.name])
    if piece.parts == 1:
        return shape
    if not shape or shape[0] % piece.parts:
        return None
    return (shape[0] // piece.parts, *shape[1:])


def _describe_sources(target: Target, built: tuple[int, ...] | None, vendor: Mapping[str, Sequence[int]]) -> str:
    gives = "checkpoint pieces do not fit together" if built is None else f"checkpoint gives {list(built)}"
    pieces = list(dict.fromkeys(piece.name for piece in target.pieces()))
    first = f"{pieces[0]} {list(vendor[pieces[0]])}"
    more = f" and {len(pieces) - 1} more" if len(pieces) > 1 else ""
    return f"{first}{more} ({gives})"


def check_plan(
    plan: Sequence[Target], expected: Mapping[str, Sequence[int]], index: CheckpointIndex, folder: Path
) -> None:
    """One UserError listing every missing, unexpected and mis-shaped tensor (the first few of each), if any."""
    problems = find_problems(plan, expected, index.shapes)
    if not problems:
        return
    parts = [
        _listing("missing (the model needs them, the checkpoint lacks them)", problems.missing),
        _listing("unexpected (in the checkpoint, used by nothing)", problems.unexpected),
        _listing("mis-shaped", problems.misshaped),
    ]
    raise UserError(
        f"The checkpoint in {folder} does not match DeepSeek-OCR v1 as its config.json describes it "
        f"({len(index.shapes)} tensors in the checkpoint, {len(expected)} in the model); nothing was loaded: "
        + "; ".join(part for part in parts if part),
        f"{_USE_V1_CHECKPOINT}; a checkpoint of other sizes must state them in its config.json "
        "(llm_perf_opt.models.deepseek_ocr.synthetic writes such folders)",
    )


def _listing(what: str, names: Sequence[str]) -> str:
    if not names:
        return ""
    rest = f", … ({len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return f"{len(names)} {what}: {', '.join(names[:SHOWN])}{rest}"


# ----------------------------------------------------------------------------------------------------- loading


def read_state(
    plan: Sequence[Target], index: CheckpointIndex, *, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Our state dict from the checkpoint: each target built on the CPU, then cast and moved one at a time."""
    with ExitStack() as stack:
        handles = {
            path: stack.enter_context(safe_open(str(path), framework="pt")) for path in set(index.files.values())
        }
        return {target.name: _build_tensor(target, index, handles).to(device=device, dtype=dtype) for target in plan}


def _build_tensor(target: Target, index: CheckpointIndex, handles: Mapping[Path, Any]) -> torch.Tensor:
    rows = [torch.cat([_read_piece(piece, index, handles) for piece in row], dim=0) for row in target.rows]
    return torch.stack(rows) if target.stacked else rows[0]


def _read_piece(piece: Piece, index: CheckpointIndex, handles: Mapping[Path, Any]) -> torch.Tensor:
    handle = handles[index.files[piece.name]]
    if piece.parts == 1:
        tensor: torch.Tensor = handle.get_tensor(piece.name)
        return tensor
    block = index.shapes[piece.name][0] // piece.parts
    sliced: torch.Tensor = handle.get_slice(piece.name)[piece.part * block : (piece.part + 1) * block]
    return sliced


def build_empty_model(config: DeepseekOcrConfig) -> DeepseekOcrForConditionalGeneration:
    """The model on the meta device: shapes only, no memory, no initialisation cost."""
    with torch.device("meta"):
        return DeepseekOcrForConditionalGeneration(config)


def materialize_buffers(model: nn.Module, device: torch.device) -> None:
    """Give the non-persistent buffers left on meta (rotary inv_freq, CLIP position_ids; not in the checkpoint)
    their real values: the module that owns them is rebuilt on the CPU from its config (small modules) and its fresh
    buffers moved to `device` in their own dtype."""
    for module in model.modules():
        names = [name for name, buf in module.named_buffers(recurse=False) if buf is not None and buf.is_meta]
        if not names:
            continue
        config = getattr(module, "config", None)
        if config is None:
            raise RuntimeError(f"cannot rebuild meta buffers {names} of {type(module).__name__}: it has no config")
        with torch.device("cpu"):
            fresh = type(module)(config)
        for name in names:
            module._buffers[name] = fresh.get_buffer(name).to(device)


def load_v1_checkpoint(
    folder: Path | str,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    experts_implementation: str | None = None,
) -> tuple[DeepseekOcrForConditionalGeneration, dict[str, Any]]:
    """DeepSeek-OCR v1 from a vendor-layout checkpoint folder, in `dtype` on `device`, in eval mode, and the
    ``architecture`` dict it was built from. A checkpoint that does not fill the model exactly raises one UserError
    and loads nothing."""
    folder = Path(folder).expanduser()
    device = torch.device(device)
    architecture = read_v1_architecture(folder)
    index = index_checkpoint(folder)
    try:
        config = DeepseekOcrConfig.from_architecture(
            architecture, attn_implementation=attn_implementation, experts_implementation=experts_implementation
        )
        model = build_empty_model(config)  # its validation raises ValueError too
    except ValueError as exc:
        raise UserError(
            f"{folder / 'config.json'} describes a model this implementation cannot build: {exc}",
            "Use the config.json that came with the deepseek-ai/DeepSeek-OCR checkpoint",
        ) from exc
    shapes = model_shapes(model)
    plan = build_plan(shapes)
    check_plan(plan, shapes, index, folder)
    model.load_state_dict(read_state(plan, index, device=device, dtype=dtype), strict=True, assign=True)
    materialize_buffers(model, device)
    leftovers = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if leftovers:
        raise RuntimeError(f"tensors left on the meta device after loading: {leftovers[:SHOWN]}")
    return model.eval(), architecture

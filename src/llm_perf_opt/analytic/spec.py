"""The shapes of DeepSeek-OCR-2 that set its FLOPs and bytes, read from the model config, and the workload.

:class:`ModelSpec` is extracted from a transformers ``DeepseekOcr2Config`` (:meth:`ModelSpec.from_config`) or
from the project's Hydra ``architecture`` mapping (:meth:`ModelSpec.from_architecture`, which builds the
config first, so derived values such as the text ``head_dim = hidden // heads`` are exactly the model's).
Nothing in the analytic model is a constant of the full-size checkpoint except the two learned query banks,
whose sizes the model class hard-codes (see :data:`QUERY_BANK_SMALL`).

View geometry (``DeepseekOcr2VisionModel``): a square view of S pixels gives a g x g SAM grid with
g = floor(S / patch); the two stride-2, padding-1, 3x3 convolutions (net_2, net_3) give ceil(g/2) and then
ceil(ceil(g/2)/2) per side, i.e. m SAM positions. The Qwen2-style encoder runs over [m SAM tokens ; n queries]
with n = 144 if m <= 144 else 256, and keeps the n query outputs: a view yields n vision tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

# DeepseekOcr2VisionModel.__init__ hard-codes its two learned query banks (query_768_resolution = 12x12 and
# query_1024_resolution = 16x16); they are not config fields. A view whose SAM output has at most
# QUERY_BANK_SMALL positions uses the small bank, any other view the large one.
QUERY_BANK_SMALL = 144
QUERY_BANK_LARGE = 256


def _side(value: Any) -> int:
    """An int, or the first of an (h, w) pair (the model is only built with square images and patches)."""
    if isinstance(value, int):
        return value
    first, second = (int(v) for v in value)
    if first != second:
        raise ValueError(f"non-square size {value!r} is not modelled")
    return first


def _stride2(side: int) -> int:
    """Output side of a 3x3 convolution with stride 2 and padding 1."""
    return (side + 2 - 3) // 2 + 1


@attrs.frozen
class SamSpec:
    """SAM ViT-B (``DeepseekOcr2SamVisionEncoder``): patch embed, windowed/global blocks, neck, net_2, net_3."""

    hidden: int
    layers: int
    heads: int
    mlp_dim: int
    patch: int
    window: int
    global_attn_indexes: tuple[int, ...]
    out_channels: int  # neck
    downsample_channels: tuple[int, int]  # net_2, net_3 output channels
    image_size: int  # pretraining size: sets the pos-embed grid and the global blocks' rel-pos tables
    in_channels: int = 3
    qkv_bias: bool = True
    use_abs_pos: bool = True
    use_rel_pos: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def is_global(self, layer: int) -> bool:
        return layer in self.global_attn_indexes


@attrs.frozen
class EncoderSpec:
    """The Qwen2-style vision encoder (``DeepseekOcr2VisionEncoder``): GQA attention with q/k/v biases, SwiGLU."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@attrs.frozen
class TextSpec:
    """The DeepSeek-V2 MoE decoder (``DeepseekOcr2TextModel``) and the untied lm_head."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP layers
    moe_intermediate: int  # one routed expert; the shared experts are one MLP of moe_intermediate * n_shared
    n_routed: int
    n_shared: int
    top_k: int
    mlp_layer_types: tuple[str, ...]  # "dense" | "sparse" per layer
    vocab: int
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements per token (K and V, every layer); multiply by the dtype size for bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@attrs.frozen
class ModelSpec:
    """Everything the analytic FLOPs/bytes model needs, from one ``DeepseekOcr2Config``."""

    sam: SamSpec
    encoder: EncoderSpec
    text: TextSpec
    projector_in: int
    projector_out: int
    query_bank_small: int = QUERY_BANK_SMALL
    query_bank_large: int = QUERY_BANK_LARGE

    @classmethod
    def from_config(cls, config: Any) -> ModelSpec:
        """From a transformers ``DeepseekOcr2Config`` (or anything with the same attributes)."""
        vision, text = config.vision_config, config.text_config
        sam, enc = vision.sam_config, vision.encoder_config
        downsample = tuple(int(c) for c in sam.downsample_channels)
        if len(downsample) != 2:
            raise ValueError(f"expected two downsample channels, got {downsample!r}")
        enc_heads = int(enc.num_attention_heads)
        text_heads = int(text.num_attention_heads)
        layer_types = tuple(str(t) for t in text.mlp_layer_types)
        if len(layer_types) != int(text.num_hidden_layers) or set(layer_types) - {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types {layer_types!r} do not describe {text.num_hidden_layers} layers")
        return cls(
            sam=SamSpec(
                hidden=int(sam.hidden_size),
                layers=int(sam.num_hidden_layers),
                heads=int(sam.num_attention_heads),
                mlp_dim=int(sam.mlp_dim),
                patch=_side(sam.patch_size),
                window=int(sam.window_size),
                global_attn_indexes=tuple(int(i) for i in sam.global_attn_indexes),
                out_channels=int(sam.output_channels),
                downsample_channels=(downsample[0], downsample[1]),
                image_size=_side(sam.image_size),
                in_channels=int(sam.num_channels),
                qkv_bias=bool(sam.qkv_bias),
                use_abs_pos=bool(sam.use_abs_pos),
                use_rel_pos=bool(sam.use_rel_pos),
            ),
            encoder=EncoderSpec(
                hidden=int(enc.hidden_size),
                layers=int(enc.num_hidden_layers),
                heads=enc_heads,
                kv_heads=int(enc.num_key_value_heads or enc_heads),
                # the same lookup as DeepseekOcr2VisionAttention
                head_dim=int(getattr(enc, "head_dim", None) or enc.hidden_size // enc_heads),
                intermediate=int(enc.intermediate_size),
            ),
            text=TextSpec(
                hidden=int(text.hidden_size),
                layers=int(text.num_hidden_layers),
                heads=text_heads,
                kv_heads=int(text.num_key_value_heads or text_heads),
                head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // text_heads),
                intermediate=int(text.intermediate_size),
                moe_intermediate=int(text.moe_intermediate_size),
                n_routed=int(text.n_routed_experts),
                n_shared=int(text.n_shared_experts),
                top_k=int(text.num_experts_per_tok),
                mlp_layer_types=layer_types,
                vocab=int(text.vocab_size),
                attention_bias=bool(text.attention_bias),
                mlp_bias=bool(text.mlp_bias),
            ),
            # DeepseekOcr2Model.multi_modal_projector = Linear(encoder hidden, text hidden) with bias
            projector_in=int(enc.hidden_size),
            projector_out=int(text.hidden_size),
        )

    @classmethod
    def from_architecture(cls, architecture: Mapping[str, Any]) -> ModelSpec:
        """From the Hydra ``model.architecture`` mapping (DictConfig or dict), via ``DeepseekOcr2Config(**it)``."""
        from transformers import DeepseekOcr2Config

        plain: Any = architecture
        if not isinstance(architecture, dict):
            from omegaconf import DictConfig, OmegaConf

            if isinstance(architecture, DictConfig):
                plain = OmegaConf.to_container(architecture, resolve=True)
        return cls.from_config(DeepseekOcr2Config(**dict(plain)))

    # ---- view geometry ---------------------------------------------------------------------------------
    def sam_grid(self, side_px: int) -> int:
        """Patches per side of a square view (the patch-embed convolution has no padding)."""
        return side_px // self.sam.patch

    def sam_positions(self, side_px: int) -> int:
        """SAM output positions of a view after net_2 and net_3 (the encoder's image tokens)."""
        return _stride2(_stride2(self.sam_grid(side_px))) ** 2

    def view_tokens(self, side_px: int) -> int:
        """Vision tokens a view yields: the size of the query bank it selects."""
        return self.query_bank_small if self.sam_positions(side_px) <= self.query_bank_small else self.query_bank_large

    def windowed_grid(self, side_px: int) -> int:
        """Side of the padded grid the windowed SAM blocks attend over: ceil(g / window) * window."""
        return math.ceil(self.sam_grid(side_px) / self.sam.window) * self.sam.window


@attrs.frozen(kw_only=True)
class Workload:
    """One image's work: a global view, `tiles` local tiles, the text after the image, and the tokens generated.

    ``new_tokens`` counts every generated token; the first comes out of the prefill forward, so decoding runs
    ``new_tokens - 1`` steps (the convention of ``measure.flops.StageFlops``).
    """

    global_size: int = 1024
    tile_size: int = 768
    tiles: int = 0
    text_tokens: int = 12
    new_tokens: int = 1
    dtype_bytes: int = 2  # 2 = bf16/fp16, 4 = fp32

    def image_tokens(self, spec: ModelSpec) -> int:
        """Image placeholder tokens: the global view's + each tile's + 1 view separator."""
        return spec.view_tokens(self.global_size) + self.tiles * spec.view_tokens(self.tile_size) + 1

    def prompt_tokens(self, spec: ModelSpec) -> int:
        """Prompt length: 1 BOS + image tokens + text tokens."""
        return 1 + self.image_tokens(spec) + self.text_tokens

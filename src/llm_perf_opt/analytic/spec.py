"""The shapes of DeepSeek-OCR-2 and DeepSeek-OCR (v1) that set their FLOPs and bytes, and the workload.

:class:`ModelSpec` comes from a model config or from the Hydra ``architecture`` mapping (which builds the config
first, so derived values such as the text ``head_dim = hidden // heads`` are exactly the model's). Both models
share SAM ViT-B and the DeepSeek-V2 MoE decoder; their vision encoder over SAM's features differs:

* DeepSeek-OCR-2 (:class:`EncoderSpec`, stage "vision/encoder"): a Qwen2-style encoder over [m SAM tokens ;
  n learned queries], n = 144 if m <= 144 else 256; a view yields its n query outputs. No newline tokens.
* DeepSeek-OCR v1 (:class:`ClipSpec`, stage "vision/clip"): CLIP-L over [class token ; m SAM tokens] (its patch
  embedding is not run); a view yields m tokens, and a learned newline ends every row of features
  (``tile_tag "2D"``; tiles are stitched into one grid first, so the crop grid matters, not only the tile count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from llm_perf_opt.records.vocabulary import VISION_PREFIX

if TYPE_CHECKING:  # not at run time: it imports torch
    from llm_perf_opt.models.deepseek_ocr.preprocess import Mode

# DeepseekOcr2VisionModel.__init__ hard-codes its two learned query banks (query_768_resolution = 12x12 and
# query_1024_resolution = 16x16); they are not config fields. A view whose SAM output has at most
# QUERY_BANK_SMALL positions uses the small bank, any other view the large one.
QUERY_BANK_SMALL = 144
QUERY_BANK_LARGE = 256

SAM_STAGE = VISION_PREFIX + "sam"
PROJECTOR_STAGE = VISION_PREFIX + "projector"


def _side(value: Any) -> int:
    """An int, or the first of an (h, w) pair (the model is only built with square images and patches)."""
    if isinstance(value, int):
        return value
    first, second = (int(v) for v in value)
    if first != second:
        raise ValueError(f"non-square size {value!r} is not modelled")
    return first


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

    @classmethod
    def from_config(cls, sam: Any) -> SamSpec:
        """From a ``DeepseekOcr2SamVisionConfig`` (both models use it)."""
        downsample = tuple(int(c) for c in sam.downsample_channels)
        if len(downsample) != 2:
            raise ValueError(f"expected two downsample channels, got {downsample!r}")
        return cls(
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
        )


@attrs.frozen
class EncoderSpec:
    """DeepSeek-OCR-2's Qwen2-style vision encoder (``DeepseekOcr2VisionEncoder``): GQA with q/k/v biases, SwiGLU,
    over [SAM tokens ; learned queries]; a view yields its queries' outputs."""

    stage: ClassVar[str] = VISION_PREFIX + "encoder"
    prefix: ClassVar[str] = "encoder"  # module-name prefix in the analytic model

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    query_bank_small: int = QUERY_BANK_SMALL
    query_bank_large: int = QUERY_BANK_LARGE

    def view_tokens(self, positions: int) -> int:
        """Vision tokens of a view with `positions` SAM positions: the size of the query bank it selects."""
        return self.query_bank_small if positions <= self.query_bank_small else self.query_bank_large

    def sequence(self, positions: int) -> int:
        """Encoder sequence length: the SAM tokens followed by the queries."""
        return positions + self.view_tokens(positions)

    @classmethod
    def from_config(cls, enc: Any) -> EncoderSpec:
        heads = int(enc.num_attention_heads)
        return cls(
            hidden=int(enc.hidden_size),
            layers=int(enc.num_hidden_layers),
            heads=heads,
            kv_heads=int(enc.num_key_value_heads or heads),
            # the same lookup as DeepseekOcr2VisionAttention
            head_dim=int(getattr(enc, "head_dim", None) or enc.hidden_size // heads),
            intermediate=int(enc.intermediate_size),
        )


@attrs.frozen
class ClipSpec:
    """DeepSeek-OCR v1's CLIP-L over SAM features (``CLIPEncoder`` layers: MHA with biases, fc1/act/fc2): the
    sequence is [class token ; SAM tokens]; a view yields one token per SAM position (the class token dropped)."""

    stage: ClassVar[str] = VISION_PREFIX + "clip"
    prefix: ClassVar[str] = "clip"

    hidden: int
    layers: int
    heads: int
    intermediate: int
    pos_grid: int  # side of the pretrained position table (image_size // patch_size); other grids are resized

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def view_tokens(self, positions: int) -> int:
        return positions

    def sequence(self, positions: int) -> int:
        """CLIP sequence length: the class token and the SAM tokens."""
        return positions + 1

    @classmethod
    def from_config(cls, clip: Any) -> ClipSpec:
        """From a transformers ``CLIPVisionConfig``."""
        return cls(
            hidden=int(clip.hidden_size),
            layers=int(clip.num_hidden_layers),
            heads=int(clip.num_attention_heads),
            intermediate=int(clip.intermediate_size),
            pos_grid=_side(clip.image_size) // _side(clip.patch_size),
        )


@attrs.frozen
class TextSpec:
    """The DeepSeek-V2 MoE decoder (``DeepseekOcr2TextModel``, both models) and the untied lm_head."""

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

    @classmethod
    def from_config(cls, text: Any) -> TextSpec:
        """From a ``DeepseekOcr2TextConfig`` (both models use it)."""
        heads = int(text.num_attention_heads)
        layer_types = tuple(str(t) for t in text.mlp_layer_types)
        if len(layer_types) != int(text.num_hidden_layers) or set(layer_types) - {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types {layer_types!r} do not describe {text.num_hidden_layers} layers")
        return cls(
            hidden=int(text.hidden_size),
            layers=int(text.num_hidden_layers),
            heads=heads,
            kv_heads=int(text.num_key_value_heads or heads),
            head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
            intermediate=int(text.intermediate_size),
            moe_intermediate=int(text.moe_intermediate_size),
            n_routed=int(text.n_routed_experts),
            n_shared=int(text.n_shared_experts),
            top_k=int(text.num_experts_per_tok),
            mlp_layer_types=layer_types,
            vocab=int(text.vocab_size),
            attention_bias=bool(text.attention_bias),
            mlp_bias=bool(text.mlp_bias),
        )


@attrs.frozen
class ModelSpec:
    """Everything the analytic FLOPs/bytes model needs, from one model config (OCR-2 or v1)."""

    sam: SamSpec
    encoder: EncoderSpec | ClipSpec  # the vision encoder over SAM's features
    text: TextSpec
    projector_in: int
    projector_out: int
    image_newline: bool = False  # v1: a learned newline token ends every row of features

    @classmethod
    def from_config(cls, config: Any) -> ModelSpec:
        """From a transformers ``DeepseekOcr2Config`` or the project's v1 ``DeepseekOcrConfig`` (a v1 config has
        ``clip_config``), or anything with the same attributes."""
        if hasattr(config, "clip_config"):
            return cls(
                sam=SamSpec.from_config(config.sam_config),
                encoder=ClipSpec.from_config(config.clip_config),
                text=TextSpec.from_config(config.text_config),
                # DeepseekOcrModel.projector = Linear(CLIP width + SAM channels, text hidden) with bias
                projector_in=int(config.projector_input_dim),
                projector_out=int(config.text_config.hidden_size),
                image_newline=True,
            )
        vision = config.vision_config
        return cls(
            sam=SamSpec.from_config(vision.sam_config),
            encoder=EncoderSpec.from_config(vision.encoder_config),
            text=TextSpec.from_config(config.text_config),
            # DeepseekOcr2Model.multi_modal_projector = Linear(encoder hidden, text hidden) with bias
            projector_in=int(vision.encoder_config.hidden_size),
            projector_out=int(config.text_config.hidden_size),
        )

    @classmethod
    def from_architecture(cls, architecture: Mapping[str, Any]) -> ModelSpec:
        """From the ``model.architecture`` mapping of either model as plain data (``config_data.plain`` of the Hydra
        node): a mapping with ``clip_config`` is v1 (``DeepseekOcrConfig.from_architecture``), any other
        ``DeepseekOcr2Config(**it)``."""
        plain = dict(architecture)
        if "clip_config" in plain:
            from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig

            return cls.from_config(DeepseekOcrConfig.from_architecture(plain))
        from transformers import DeepseekOcr2Config

        return cls.from_config(DeepseekOcr2Config(**plain))

    @property
    def vision_stages(self) -> tuple[str, str, str]:
        """The vision sub-stages of prefill, in order: SAM, the encoder over its features, the projector."""
        return (SAM_STAGE, self.encoder.stage, PROJECTOR_STAGE)

    # ---- view geometry ---------------------------------------------------------------------------------
    def sam_grid(self, side_px: int) -> int:
        """Patches per side of a square view (the patch-embed convolution has no padding)."""
        return side_px // self.sam.patch

    def feature_side(self, side_px: int) -> int:
        """SAM output positions per side of a view: ceil(g / 4) after net_2 and net_3 (3x3, stride 2, padding 1)."""
        return (self.sam_grid(side_px) + 3) // 4

    def sam_positions(self, side_px: int) -> int:
        """SAM output positions of a view (the vision encoder's image tokens)."""
        return self.feature_side(side_px) ** 2

    def view_tokens(self, side_px: int) -> int:
        """Feature tokens a view yields (newlines not included)."""
        return self.encoder.view_tokens(self.sam_positions(side_px))

    def windowed_grid(self, side_px: int) -> int:
        """Side of the padded grid the windowed SAM blocks attend over: ceil(g / window) * window."""
        return math.ceil(self.sam_grid(side_px) / self.sam.window) * self.sam.window

    def grid_tokens(self, side_px: int, across: int = 1, down: int = 1) -> int:
        """Tokens of `across` x `down` views stitched into one grid: their features, plus one newline per
        stitched row of features when the model has an image newline (v1)."""
        if not self.image_newline:
            return across * down * self.view_tokens(side_px)
        side = self.feature_side(side_px)
        return (down * side) * (across * side + 1)


def grid_tiles(crop_grid: tuple[int, int] | None) -> int:
    """Tiles a v1 crop grid (n_w, n_h) runs: n_w * n_h, none for no grid or a 1x1 grid (the vendor's rule)."""
    if crop_grid is None or tuple(crop_grid) == (1, 1):
        return 0
    across, down = crop_grid
    return across * down


def _check_grid(
    instance: Workload, attribute: attrs.Attribute[tuple[int, int] | None], value: tuple[int, int] | None
) -> None:
    if value is not None and (len(value) != 2 or min(value) < 1):
        raise ValueError(f"crop_grid {value!r} is not a (tiles across, tiles down) pair of positive ints")


def _check_tiles(instance: Workload, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"tiles={value} is negative")
    if instance.crop_grid is not None and value != grid_tiles(instance.crop_grid):
        raise ValueError(f"tiles={value} does not match crop_grid {instance.crop_grid!r}")


def as_crop_grid(value: Any) -> tuple[int, int] | None:
    """A crop grid (any pair of numbers, e.g. a list from a config or a tensor's values) as a tuple of ints."""
    return None if value is None else tuple(int(v) for v in value)  # type: ignore[return-value]


@attrs.frozen(kw_only=True)
class Workload:
    """One image's work: a global view, local tiles, the text after the image, and the tokens generated.

    Tiles: DeepSeek-OCR-2 needs only their count; v1 needs the crop grid (tiles across, tiles down; ``tiles``
    follows from it, none for 1x1), because a newline ends each stitched row of tiles. ``new_tokens`` counts every
    generated token; the first comes out of prefill, so decoding runs ``new_tokens - 1`` steps (as
    ``measure.stage_flops.StageFlops``).
    """

    global_size: int = 1024
    tile_size: int = 768
    crop_grid: tuple[int, int] | None = attrs.field(default=None, converter=as_crop_grid, validator=_check_grid)
    tiles: int = attrs.field(
        default=attrs.Factory(lambda self: grid_tiles(self.crop_grid), takes_self=True), validator=_check_tiles
    )
    text_tokens: int = 12
    new_tokens: int = 1
    dtype_bytes: int = 2  # 2 = bf16/fp16, 4 = fp32

    def with_mode(self, mode: Mode, crop_grid: tuple[int, int] | None) -> Workload:
        """This workload with a v1 mode's views: its global view and, in a crop mode, the tiles of `crop_grid`."""
        grid = crop_grid if mode.crop_mode else None
        return attrs.evolve(
            self, global_size=mode.global_size, tile_size=mode.image_size, crop_grid=grid, tiles=grid_tiles(grid)
        )

    def image_tokens(self, spec: ModelSpec) -> int:
        """Image placeholder tokens: the tiles' (stitched, v1) + the global view's + 1 view separator."""
        tiles = 0
        if self.tiles:
            if spec.image_newline and self.crop_grid is None:
                raise ValueError("this model lays tiles out on their crop grid: give Workload(crop_grid=(n_w, n_h))")
            across, down = self.crop_grid or (self.tiles, 1)
            tiles = spec.grid_tokens(self.tile_size, across, down)
        return tiles + spec.grid_tokens(self.global_size) + 1

    def prompt_tokens(self, spec: ModelSpec) -> int:
        """Prompt length: 1 BOS + image tokens + text tokens."""
        return 1 + self.image_tokens(spec) + self.text_tokens

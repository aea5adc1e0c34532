"""Analytic FLOPs and bytes of DeepSeek-OCR-2 and DeepSeek-OCR (v1), per module and per stage, from a
:class:`ModelSpec`. SAM and the decoder are shared; the encoder over SAM's features is OCR-2's Qwen2-style encoder
("encoder.*", stage "vision/encoder") or v1's CLIP-L ("clip.*", stage "vision/clip").

Conventions
-----------
* 1 multiply-add (MAC) = 2 FLOPs, as ``torch.utils.flop_counter.FlopCounterMode`` counts (2·M·N·K).
* The *counted* figure (:attr:`StageCost.matmul_flops`: categories "matmul", "attention", "convolution") is what
  ``instruments.flops`` counts on the real modules, exactly (tests/test_analytic_model.py, test_analytic_v1.py):

  - every linear and convolution (no bias add: FlopCounterMode counts ``addmm`` as its ``mm``); convolutions over
    their whole output grid, padding positions included;
  - attention QKᵀ and AV over the full score matrix SDPA computes, 4·b·h·s_q·s_k·d per call, with no causal
    halving (the decoder's causal prefill and the Qwen2 encoder's masked attention alike; v1's CLIP attends over
    [class token ; SAM tokens] without a mask);
  - SAM's windowed blocks run qkv, attention and proj on the padded grid (ceil(g/14)·14)², their MLP on g²;
    global blocks attend over all g² positions; SAM's decomposed rel-pos einsums (2·windows·heads·side³·d MACs);
  - the MoE router (a linear to n_routed logits, in fp32), the routed experts for the ACTIVE experts only (top_k
    rows per token) and the shared experts;
  - the lm_head only on the positions whose logits are kept: the last prefill token, and each decode step.

* Non-matmul work (norms, softmax, activations, residual adds, RoPE, the rel-pos bias add, MoE combine, the
  bicubic pos-embed resize of SAM's non-1024 views and CLIP's non-16x16 grids) is estimated in the categories
  "normalization" and "elementwise" (the ``*_FLOPS`` constants below) and left out of the counted figure, as are
  the rel-pos tables' ``F.interpolate`` and the router's top-k, which FlopCounterMode does not count. Data movement
  without arithmetic (embedding gathers, window partition, concatenation, v1's newlines, KV-cache writes) is
  category "other" with 0 FLOPs. On the meta device and in the CPU/eager math path SDPA decomposes into ``bmm``s
  that the counter counts exactly like the fused kernel.

Bytes (``dtype_bytes`` per element unless noted)
------------------------------------------------
* ``weight_bytes``: the parameters a module reads once per forward call. The vision tower runs once for the
  global view and once for the batch of tiles, so its weights are read twice when there are tiles. Routed
  experts: a forward over T tokens reads the distinct experts its tokens hit; with uniform routing that is
  E·(1 − (1 − k/E)^T) (k at T = 1, all E to within 1e-6 past a few hundred tokens, as in any image's prefill).
  The embedding reads one row per token.
* ``activation_bytes``: approximate; each module reads its inputs once and writes its outputs once, from and to
  memory (cache hits are not subtracted: measured DRAM bytes can be lower). Fused attention reads Q, K, V (plus
  SAM's rel-pos bias, materialised as a (b, h, N, N) ``attn_mask``) and writes O; the score matrix is not
  materialised (flash / memory-efficient kernels; the eager and math paths add about 2·b·h·s_q·s_k elements).
  fp32 upcasts inside norms are ignored; the router's fp32 logits count 4 bytes.
* SAM's layout copies (category "other"; transformers' ``DeepseekOcr2SamVisionLayer`` with SDPA, as an H100 run's
  kernels show them), each reading and writing its tensor once: the rel-pos bias ``reshape`` to (b, heads, N, N)
  copies the whole score-sized bias, the largest (the einsum outputs' strides are permuted); with more than one
  attention batch q/k/v are split and the heads merged by copies; the einsum copies the query for its bmm (once
  after the split, twice on one batch's strided view); ``F.pad`` writes the zero-filled padded grid and the crop
  back is a copy; and each layer norm first copies its input (the residual stream keeps patch_embed's permuted
  NCHW strides). Left out: the pos-embed interpolation's fp32 casts and the neck's layout copies (under 1% of
  SAM's bytes on an H100), and the conv bias add cuDNN may run apart.
* ``kv_bytes``: the decoder's KV cache: written in prefill (all prompt tokens), read (the ``context`` keys
  attended) and written (one token) in each decode step. ``DynamicCache``'s re-concatenation of the cache on
  every update is an implementation artefact and is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, Protocol

import attrs

from llm_perf_opt.analytic.spec import PROJECTOR_STAGE, SAM_STAGE, ClipSpec, EncoderSpec, ModelSpec, Workload
from llm_perf_opt.records.vocabulary import DECODE, DECODE_STEP, PREFILL

Category = Literal["matmul", "attention", "convolution", "normalization", "elementwise", "other"]

#: Categories whose FLOPs FlopCounterMode counts (the cross-checked figure).
COUNTED_CATEGORIES: frozenset[str] = frozenset({"matmul", "attention", "convolution"})

# Non-matmul FLOP estimates per element (documented approximations, excluded from the counted figure).
NORM_FLOPS = 5  # LayerNorm / RMSNorm: square, reduce, scale, affine
SOFTMAX_FLOPS = 5  # per score element: max, subtract, exp, sum, divide
GELU_FLOPS = 8  # erf-based GELU (SAM MLP)
QUICK_GELU_FLOPS = 5  # x * sigmoid(1.702 x) (v1's CLIP MLP): a scale, the sigmoid (exp, add, divide), a multiply
BICUBIC_FLOPS = 16  # per output element of a bicubic resize of a position table (4x4 taps)
SILU_GLU_FLOPS = 5  # silu(gate) * up: sigmoid (exp, add, divide), two multiplies
ROPE_FLOPS = 3  # per q/k element: two multiplies, one add
ADD_FLOPS = 1  # residual / bias-style adds

#: DeepSeek-OCR-2's vision sub-stages; :attr:`ModelSpec.vision_stages` gives any model's (v1: "vision/clip").
VISION_STAGES = (SAM_STAGE, EncoderSpec.stage, PROJECTOR_STAGE)


@attrs.frozen
class ModuleCost:
    """FLOPs and bytes of one module (or one op of a module) for one forward call."""

    name: str
    category: Category
    flops: float = 0.0
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0
    kv_bytes: float = 0.0

    @property
    def counted(self) -> bool:
        """True when FlopCounterMode counts this module's FLOPs (matmul, attention, convolution)."""
        return self.category in COUNTED_CATEGORIES

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes + self.kv_bytes


@attrs.frozen
class StageCost:
    """The modules of one stage and their totals."""

    stage: str
    modules: tuple[ModuleCost, ...]

    @property
    def flops(self) -> float:
        """All FLOPs, non-matmul estimates included."""
        return sum(m.flops for m in self.modules)

    @property
    def matmul_flops(self) -> float:
        """Matmul + attention + convolution FLOPs: the figure cross-checked against FlopCounterMode."""
        return sum(m.flops for m in self.modules if m.counted)

    @property
    def non_matmul_flops(self) -> float:
        """Norm / elementwise estimates (not counted by FlopCounterMode)."""
        return self.flops - self.matmul_flops

    @property
    def weight_bytes(self) -> float:
        return sum(m.weight_bytes for m in self.modules)

    @property
    def activation_bytes(self) -> float:
        return sum(m.activation_bytes for m in self.modules)

    @property
    def kv_bytes(self) -> float:
        return sum(m.kv_bytes for m in self.modules)

    @property
    def bytes(self) -> float:
        """Weight + activation + KV bytes."""
        return self.weight_bytes + self.activation_bytes + self.kv_bytes


# ---- building blocks ---------------------------------------------------------------------------------------
def _linear(name: str, tokens: float, d_in: int, d_out: int, db: int, *, bias: bool) -> ModuleCost:
    return ModuleCost(
        name,
        "matmul",
        flops=2.0 * tokens * d_in * d_out,
        weight_bytes=float(d_in * d_out + (d_out if bias else 0)) * db,
        activation_bytes=float(tokens * (d_in + d_out)) * db,
    )


def _conv(
    name: str, batch: int, out_side: int, c_in: int, c_out: int, kernel: int, in_side: int, db: int, *, bias: bool
) -> ModuleCost:
    return ModuleCost(
        name,
        "convolution",
        flops=2.0 * batch * out_side**2 * c_out * c_in * kernel**2,
        weight_bytes=float(c_out * c_in * kernel**2 + (c_out if bias else 0)) * db,
        activation_bytes=float(batch * (in_side**2 * c_in + out_side**2 * c_out)) * db,
    )


def _norm(name: str, elements: float, width: int, db: int, *, bias: bool) -> ModuleCost:
    return ModuleCost(
        name,
        "normalization",
        flops=float(NORM_FLOPS * elements),
        weight_bytes=float(width * (2 if bias else 1)) * db,
        activation_bytes=2.0 * elements * db,
    )


def _eltwise(name: str, elements: float, flops_per: int, db: int, *, reads: int = 1) -> ModuleCost:
    """An elementwise op over `elements` outputs reading `reads` tensors of the same size."""
    return ModuleCost(
        name, "elementwise", flops=float(flops_per * elements), activation_bytes=(reads + 1.0) * elements * db
    )


def _move(name: str, elements: float, db: int) -> ModuleCost:
    """Data movement (read + write) without arithmetic."""
    return ModuleCost(name, "other", activation_bytes=2.0 * elements * db)


def expected_experts(tokens: float, n_routed: int, top_k: int) -> float:
    """Distinct routed experts that `tokens` tokens hit, each picking top_k of n_routed uniformly at random."""
    if tokens <= 0:
        return 0.0
    if tokens == 1 or top_k >= n_routed:
        return float(min(top_k, n_routed))
    return n_routed * -math.expm1(tokens * math.log1p(-top_k / n_routed))


# ---- vision ------------------------------------------------------------------------------------------------
def _abs_pos(name: str, elements: float, resized: float, table: float, width: int, db: int) -> ModuleCost:
    """A learned position table (`table` rows of `width`) added to `elements` elements; `resized` output rows are
    first interpolated from the table (bicubic, when the view's grid is not the pretraining one)."""
    return ModuleCost(
        name,
        "elementwise",
        flops=float(ADD_FLOPS * elements + BICUBIC_FLOPS * resized * width),
        weight_bytes=float(table * width) * db,
        activation_bytes=2.0 * elements * db,
    )


def _qkv(prefix: str, tokens: float, h: int, q_dim: int, kv_dim: int, db: int, *, bias: bool) -> list[ModuleCost]:
    """The q, k and v projections of an attention block."""
    return [
        _linear(prefix + "q_proj", tokens, h, q_dim, db, bias=bias),
        _linear(prefix + "k_proj", tokens, h, kv_dim, db, bias=bias),
        _linear(prefix + "v_proj", tokens, h, kv_dim, db, bias=bias),
    ]


def _sdpa(name: str, scores: float, head_dim: int, activation_bytes: float, kv_bytes: float = 0.0) -> ModuleCost:
    """QKᵀ and AV over `scores` score elements (batch x heads x queries x keys): 4·scores·head_dim FLOPs."""
    return ModuleCost(
        name, "attention", flops=4.0 * scores * head_dim, activation_bytes=activation_bytes, kv_bytes=kv_bytes
    )


def _mlp(
    prefix: str, t: float, h: int, inter: int, act_flops: int, db: int, names: tuple[str, str]
) -> list[ModuleCost]:
    """A two-layer MLP with biases: `names[0]` (h -> inter), the activation, `names[1]` (inter -> h)."""
    up, down = names
    return [
        _linear(prefix + up, t, h, inter, db, bias=True),
        _eltwise(prefix + "act", t * inter, act_flops, db),
        _linear(prefix + down, t, inter, h, db, bias=True),
    ]


def _sam(spec: ModelSpec, side_px: int, batch: int, db: int) -> list[ModuleCost]:
    """SAM ViT-B over a `side_px` view (`batch` views at once): patch embedding, the blocks, the neck."""
    sam = spec.sam
    h = sam.hidden
    g = spec.sam_grid(side_px)
    n = batch * g * g  # positions over the batch
    out: list[ModuleCost] = [_conv("sam.patch_embed", batch, g, sam.in_channels, h, sam.patch, side_px, db, bias=True)]
    if sam.use_abs_pos:
        pos_grid = sam.image_size // sam.patch
        out.append(_abs_pos("sam.pos_embed", n * h, g * g if g != pos_grid else 0, pos_grid * pos_grid, h, db))
    for i in range(sam.layers):
        out += _sam_block(spec, i, side_px, batch, db)
    return out + _sam_neck(spec, side_px, batch, db)


def _sam_block(spec: ModelSpec, i: int, side_px: int, batch: int, db: int) -> list[ModuleCost]:
    """SAM block `i` over a `side_px` view: windowed or global attention with the relative-position bias, the MLP,
    and the layout copies the implementation makes."""
    sam = spec.sam
    h, hd = sam.hidden, sam.head_dim
    g = spec.sam_grid(side_px)
    n = batch * g * g  # positions over the batch
    out: list[ModuleCost] = []
    p = f"sam.layers.{i}."
    padded = g
    if sam.is_global(i):
        side, windows, table = g, batch, sam.image_size // sam.patch
    else:
        side = table = sam.window
        padded = spec.windowed_grid(side_px)
        windows = batch * (padded // sam.window) ** 2
    seq = side * side
    tokens = windows * seq  # positions attention runs over (the padded grid for windowed blocks)
    scores = float(windows * sam.heads * seq * seq)
    windowed = not sam.is_global(i)
    padded_grid = windowed and padded > g
    split = windows > 1  # more than one attention batch: q/k/v and the output are laid out by copies
    # the residual stream keeps the strides of patch_embed's permuted NCHW output, so layer_norm copies it
    out.append(_move(p + "layer_norm1.contiguous", n * h, db))
    out.append(_norm(p + "layer_norm1", n * h, h, db, bias=True))
    if windowed:
        # F.pad: a zero-filled padded grid and the copy of the g x g positions into it (a clone when unpadded)
        fill = tokens if padded_grid else 0
        out.append(ModuleCost(p + "window_pad", "other", activation_bytes=(2.0 * n + fill) * h * db))
        out.append(_move(p + "window_partition", tokens * h, db))
    out.append(_linear(p + "attn.qkv", tokens, h, 3 * h, db, bias=sam.qkv_bias))
    if split:
        # .reshape(b, N, 3, heads, d).permute(2, 0, 3, 1, 4).reshape(3, b·heads, N, d) cannot be a view
        out.append(_move(p + "attn.qkv_split", 3.0 * tokens * h, db))
    bias_read = 0.0
    if sam.use_rel_pos:
        # rel_h = einsum("bhwc,hkc->bhwk"), rel_w likewise: windows·heads·side³·head_dim MACs each
        rel = float(windows * sam.heads * side**3)
        # einsum lays the query out for its bmm: one copy (rel_h) after the split, two on the strided view
        out.append(_move(p + "attn.rel_pos.query_copy", (1.0 if split else 2.0) * tokens * h, db))
        out.append(
            ModuleCost(
                p + "attn.rel_pos",
                "attention",
                flops=2.0 * 2.0 * rel * hd,
                # the stored tables (interpolated to 2·side − 1 rows when a global grid is not the
                # pretraining one)
                weight_bytes=2.0 * (2 * table - 1) * hd * db,
                activation_bytes=(tokens * h + 2.0 * rel) * db,
            )
        )
        # rel_h[..., None] + rel_w[..., None, :]: the (windows, heads, seq, seq) bias SDPA takes as attn_mask
        out.append(
            ModuleCost(
                p + "attn.rel_pos_bias",
                "elementwise",
                flops=float(ADD_FLOPS) * scores,
                activation_bytes=(2.0 * rel + scores) * db,
            )
        )
        # the sum keeps the einsum outputs' permuted strides, so .reshape(b, heads, N, N) copies all of it
        out.append(_move(p + "attn.rel_pos_bias.reshape", scores, db))
        bias_read = scores
    out.append(_sdpa(p + "attn.sdpa", scores, hd, (4.0 * tokens * h + bias_read) * db))
    out.append(ModuleCost(p + "attn.softmax", "elementwise", flops=float(SOFTMAX_FLOPS) * scores))
    if split:
        # the (b, heads, N, d) output .permute(0, 2, 3, 1, 4).reshape(b, h, w, heads·d) for proj
        out.append(_move(p + "attn.merge_heads", tokens * h, db))
    out.append(_linear(p + "attn.proj", tokens, h, h, db, bias=True))
    if windowed:
        out.append(_move(p + "window_unpartition", tokens * h, db))
        if padded_grid:
            out.append(_move(p + "window_crop", n * h, db))  # [:, :g, :g].contiguous()
    out.append(_eltwise(p + "residual1", n * h, ADD_FLOPS, db, reads=2))
    out.append(_move(p + "layer_norm2.contiguous", n * h, db))
    out.append(_norm(p + "layer_norm2", n * h, h, db, bias=True))
    out += _mlp(p + "mlp.", n, h, sam.mlp_dim, GELU_FLOPS, db, ("lin1", "lin2"))
    out.append(_eltwise(p + "residual2", n * h, ADD_FLOPS, db, reads=2))
    return out


def _sam_neck(spec: ModelSpec, side_px: int, batch: int, db: int) -> list[ModuleCost]:
    """SAM's neck and its two downsampling convolutions."""
    sam = spec.sam
    h = sam.hidden
    g = spec.sam_grid(side_px)
    n = batch * g * g
    c = sam.out_channels
    g2 = (g - 1) // 2 + 1
    g3 = (g2 - 1) // 2 + 1
    d0, d1 = sam.downsample_channels
    return [
        _conv("sam.neck.conv1", batch, g, h, c, 1, g, db, bias=False),
        _norm("sam.neck.layer_norm1", n * c, c, db, bias=True),
        _conv("sam.neck.conv2", batch, g, c, c, 3, g, db, bias=False),
        _norm("sam.neck.layer_norm2", n * c, c, db, bias=True),
        _conv("sam.net_2", batch, g2, c, d0, 3, g, db, bias=False),
        _conv("sam.net_3", batch, g3, d0, d1, 3, g2, db, bias=False),
    ]


def _qwen2_encoder(spec: ModelSpec, enc: EncoderSpec, side_px: int, batch: int, db: int) -> list[ModuleCost]:
    """DeepSeek-OCR-2's encoder over [SAM tokens ; queries] (masked attention, counted over the full scores)."""
    h, hd = enc.hidden, enc.head_dim
    m = spec.sam_positions(side_px)
    s = enc.sequence(m)
    t = batch * s
    q_dim, kv_dim = enc.heads * hd, enc.kv_heads * hd
    scores = float(batch * enc.heads * s * s)
    out: list[ModuleCost] = [
        ModuleCost(
            "encoder.concat_queries",
            "other",
            weight_bytes=float(enc.view_tokens(m) * h) * db,
            activation_bytes=2.0 * t * h * db,
        )
    ]
    for i in range(enc.layers):
        p = f"encoder.layers.{i}."
        out += [
            _norm(p + "input_layernorm", t * h, h, db, bias=False),
            *_qkv(p + "self_attn.", t, h, q_dim, kv_dim, db, bias=True),
            _eltwise(p + "self_attn.rope", t * (q_dim + kv_dim), ROPE_FLOPS, db),
            _sdpa(p + "self_attn.sdpa", scores, hd, float(t * (2 * q_dim + 2 * kv_dim)) * db),
            ModuleCost(p + "self_attn.softmax", "elementwise", flops=float(SOFTMAX_FLOPS + ADD_FLOPS) * scores),
            _linear(p + "self_attn.o_proj", t, q_dim, h, db, bias=False),
            _eltwise(p + "residual1", t * h, ADD_FLOPS, db, reads=2),
            _norm(p + "post_attention_layernorm", t * h, h, db, bias=False),
            *_glu(p + "mlp.", t, h, enc.intermediate, db, bias=False),
            _eltwise(p + "residual2", t * h, ADD_FLOPS, db, reads=2),
        ]
    out.append(_norm("encoder.norm", t * h, h, db, bias=False))
    return out


def _clip(spec: ModelSpec, clip: ClipSpec, side_px: int, batch: int, db: int) -> list[ModuleCost]:
    """v1's CLIP-L over [class token ; SAM tokens]: embeddings (no patch embedding), pre_layrnorm, the layers."""
    h, hd = clip.hidden, clip.head_dim
    m = spec.sam_positions(side_px)
    s = clip.sequence(m)
    t = batch * s
    scores = float(batch * clip.heads * s * s)
    resized = m if spec.feature_side(side_px) != clip.pos_grid else 0
    out: list[ModuleCost] = [
        ModuleCost(
            "clip.embeddings.class_token", "other", weight_bytes=float(h) * db, activation_bytes=2.0 * t * h * db
        ),
        _abs_pos("clip.embeddings.position", t * h, resized, clip.pos_grid**2 + 1, h, db),
        _norm("clip.pre_layrnorm", t * h, h, db, bias=True),
    ]
    for i in range(clip.layers):
        p = f"clip.layers.{i}."
        out += [
            _norm(p + "layer_norm1", t * h, h, db, bias=True),
            *_qkv(p + "self_attn.", t, h, h, h, db, bias=True),
            _sdpa(p + "self_attn.sdpa", scores, hd, 4.0 * t * h * db),
            ModuleCost(p + "self_attn.softmax", "elementwise", flops=float(SOFTMAX_FLOPS) * scores),
            _linear(p + "self_attn.out_proj", t, h, h, db, bias=True),
            _eltwise(p + "residual1", t * h, ADD_FLOPS, db, reads=2),
            _norm(p + "layer_norm2", t * h, h, db, bias=True),
            *_mlp(p + "mlp.", t, h, clip.intermediate, QUICK_GELU_FLOPS, db, ("fc1", "fc2")),
            _eltwise(p + "residual2", t * h, ADD_FLOPS, db, reads=2),
        ]
    return out


def vision_view(spec: ModelSpec, side_px: int, dtype_bytes: int = 2, batch: int = 1) -> list[ModuleCost]:
    """Modules of the vision tower and projector for `batch` square views of `side_px` pixels run as one call
    (weights read once): "sam.", the encoder's prefix ("encoder." for OCR-2, "clip." for v1) and "projector"."""
    tokens = batch * spec.view_tokens(side_px)
    enc = spec.encoder
    if isinstance(enc, ClipSpec):
        encoded = _clip(spec, enc, side_px, batch, dtype_bytes)
    else:
        encoded = _qwen2_encoder(spec, enc, side_px, batch, dtype_bytes)
    return [
        *_sam(spec, side_px, batch, dtype_bytes),
        *encoded,
        _linear("projector", tokens, spec.projector_in, spec.projector_out, dtype_bytes, bias=True),
    ]


# ---- decoder -----------------------------------------------------------------------------------------------
class DecoderShape(Protocol):
    """What a decoder forward reads of its spec (``spec.TextSpec``, ``dense.DenseSpec``)."""

    @property
    def hidden(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab(self) -> int: ...


def _decoder_forward(
    prefix: str,
    shape: DecoderShape,
    tokens: int,
    keys: int,
    db: int,
    mlp: Callable[[str, int, float], list[ModuleCost]],
    *,
    qkv_bias: bool,
    o_bias: bool,
    prefill: bool,
    batch: int,
) -> list[ModuleCost]:
    """A decoder over `batch` sequences of `tokens` new positions, each attending `keys` keys of its own sequence
    (full score matrix), + lm_head on the last position of each sequence. Each layer: RMSNorm, self-attention with
    a KV cache (q/k/v, RoPE, the cache write, attention, softmax, o_proj; each sequence has its own `keys` cached
    keys), RMSNorm, the MLP `mlp(prefix, layer, tokens over the batch)`."""
    h, hd = shape.hidden, shape.head_dim
    t = float(batch * tokens)
    q_dim, kv_dim = shape.heads * hd, shape.kv_heads * hd
    scores = t * shape.heads * keys
    kv_read = float(batch * keys * 2 * kv_dim) * db
    out = [ModuleCost(prefix + "embed_tokens", "other", weight_bytes=t * h * db, activation_bytes=t * h * db)]
    for i in range(shape.layers):
        p = f"{prefix}layers.{i}."
        a = p + "self_attn."
        out += [
            _norm(p + "input_layernorm", t * h, h, db, bias=False),
            *_qkv(a, t, h, q_dim, kv_dim, db, bias=qkv_bias),
            _eltwise(a + "rope", t * (q_dim + kv_dim), ROPE_FLOPS, db),
            ModuleCost(a + "kv_write", "other", kv_bytes=t * 2 * kv_dim * db),
            # prefill: K/V are this forward's own activations; decode: they are read from the cache
            _sdpa(
                a + "sdpa",
                scores,
                hd,
                2.0 * t * q_dim * db + (kv_read if prefill else 0.0),
                kv_bytes=0.0 if prefill else kv_read,
            ),
            ModuleCost(a + "softmax", "elementwise", flops=float(SOFTMAX_FLOPS) * scores),
            _linear(a + "o_proj", t, q_dim, h, db, bias=o_bias),
            _eltwise(p + "residual1", t * h, ADD_FLOPS, db, reads=2),
            _norm(p + "post_attention_layernorm", t * h, h, db, bias=False),
            *mlp(p + "mlp.", i, t),
            _eltwise(p + "residual2", t * h, ADD_FLOPS, db, reads=2),
        ]
    out.append(_norm(prefix + "norm", t * h, h, db, bias=False))
    out.append(_linear("lm_head", batch, h, shape.vocab, db, bias=False))
    return out


def _decoder(
    spec: ModelSpec, tokens: int, keys: int, db: int, *, prefill: bool, batch: int = 1, experts_hit: float | None = None
) -> list[ModuleCost]:
    """The text model ("decoder.*", see :func:`_decoder_forward`) with its dense and MoE MLPs. `experts_hit`:
    distinct routed experts per MoE layer (default: the uniform-routing expectation for the forward's tokens)."""
    tx = spec.text

    def mlp(prefix: str, layer: int, t: float) -> list[ModuleCost]:
        if tx.mlp_layer_types[layer] == "dense":
            return _glu(prefix, t, tx.hidden, tx.intermediate, db, bias=tx.mlp_bias)
        return _moe(spec, prefix, t, db, experts_hit)

    bias = tx.attention_bias
    return _decoder_forward(
        "decoder.", tx, tokens, keys, db, mlp, qkv_bias=bias, o_bias=bias, prefill=prefill, batch=batch
    )


def _glu(prefix: str, t: float, h: int, inter: int, db: int, *, bias: bool) -> list[ModuleCost]:
    return [
        _linear(prefix + "gate_proj", t, h, inter, db, bias=bias),
        _linear(prefix + "up_proj", t, h, inter, db, bias=bias),
        _eltwise(prefix + "act", t * inter, SILU_GLU_FLOPS, db, reads=2),
        _linear(prefix + "down_proj", t, inter, h, db, bias=bias),
    ]


def _moe(spec: ModelSpec, prefix: str, t: float, db: int, experts_hit: float | None = None) -> list[ModuleCost]:
    """An MoE MLP over `t` tokens; its routed weights are those of `experts_hit` distinct experts (default: the
    uniform-routing expectation E·(1 − (1 − k/E)^t))."""
    tx = spec.text
    h, mi, e, k = tx.hidden, tx.moe_intermediate, tx.n_routed, tx.top_k
    rows = t * k  # (token, expert) pairs actually computed
    hit = expected_experts(t, e, k) if experts_hit is None else experts_hit
    return [
        ModuleCost(
            prefix + "gate",
            "matmul",
            flops=2.0 * t * h * e,
            weight_bytes=float(e * h) * db,
            activation_bytes=t * h * db + t * e * 4.0,  # fp32 logits
        ),
        ModuleCost(prefix + "gate.softmax_topk", "elementwise", flops=float(SOFTMAX_FLOPS) * t * e),
        ModuleCost(
            prefix + "experts.gate_up_proj",
            "matmul",
            flops=2.0 * rows * h * 2 * mi,
            weight_bytes=hit * 2 * mi * h * db,
            activation_bytes=rows * (h + 2 * mi) * db,
        ),
        _eltwise(prefix + "experts.act", rows * mi, SILU_GLU_FLOPS, db, reads=2),
        ModuleCost(
            prefix + "experts.down_proj",
            "matmul",
            flops=2.0 * rows * mi * h,
            weight_bytes=hit * h * mi * db,
            activation_bytes=rows * (mi + h) * db,
        ),
        _eltwise(prefix + "experts.combine", rows * h, 2 * ADD_FLOPS, db, reads=2),  # weight and index_add
        *_glu(prefix + "shared_experts.", t, h, mi * tx.n_shared, db, bias=tx.mlp_bias),
        _eltwise(prefix + "add_shared", t * h, ADD_FLOPS, db, reads=2),
    ]


# ---- stages ------------------------------------------------------------------------------------------------
def _prefixed(prefix: str, modules: Iterable[ModuleCost]) -> list[ModuleCost]:
    return [attrs.evolve(m, name=prefix + m.name) for m in modules]


def _image_layout(spec: ModelSpec, workload: Workload) -> list[ModuleCost]:
    """Laying the features out as the prompt's image tokens: v1's row newlines, then the scatter into the prompt."""
    h, db = spec.projector_out, workload.dtype_bytes
    image = workload.image_tokens(spec)
    length = workload.prompt_tokens(spec)
    out = []
    if spec.image_newline:
        features = spec.view_tokens(workload.global_size) + workload.tiles * spec.view_tokens(workload.tile_size)
        out.append(
            ModuleCost(
                "image_features.newlines",
                "other",
                weight_bytes=float(h) * db,  # the image_newline vector
                activation_bytes=float(features + image) * h * db,
            )
        )
    out.append(
        ModuleCost(
            "image_features.masked_scatter",
            "other",
            weight_bytes=float(h) * db,  # the view separator
            activation_bytes=float(image + 2 * length) * h * db,
        )
    )
    return out


def _vision_stage(spec: ModelSpec, name: str) -> str:
    """The vision sub-stage of a vision module name ("tiles/clip.layers.3.fc1" -> "vision/clip")."""
    part = name.split("/", 1)[1].split(".", 1)[0]
    sam, encoder, projector = spec.vision_stages
    return {"sam": sam, spec.encoder.prefix: encoder, "projector": projector}[part]


def prefill(spec: ModelSpec, workload: Workload) -> dict[str, StageCost]:
    """The vision sub-stages (``spec.vision_stages``, global view + all tiles) and "prefill", the whole prefill
    forward: the vision modules ("global/..." for the global view, then "tiles/..." for the tiles as one batch),
    the features' layout (v1: a newline per row), the decoder over the prompt (every position attending all
    prompt positions) and the lm_head on the last position."""
    return _batch_prefill(spec, [workload])


def _batch_prefill(spec: ModelSpec, workloads: Sequence[Workload]) -> dict[str, StageCost]:
    """The vision sub-stages and "prefill" of images run together (see :func:`batch_stage_costs`)."""
    by_stage: dict[str, list[ModuleCost]] = {stage: [] for stage in spec.vision_stages}
    image: list[ModuleCost] = []
    for w in workloads:
        vision = _prefixed("global/", vision_view(spec, w.global_size, w.dtype_bytes))
        if w.tiles:
            vision += _prefixed("tiles/", vision_view(spec, w.tile_size, w.dtype_bytes, batch=w.tiles))
        for m in vision:
            by_stage[_vision_stage(spec, m.name)].append(m)
        image += [*vision, *_image_layout(spec, w)]
    length = max(w.prompt_tokens(spec) for w in workloads)
    text = _decoder(spec, length, length, workloads[0].dtype_bytes, prefill=True, batch=len(workloads))
    stages = {stage: StageCost(stage, tuple(mods)) for stage, mods in by_stage.items()}
    return {**stages, PREFILL: StageCost(PREFILL, (*image, *text))}


def decode_step(
    spec: ModelSpec, context: int, dtype_bytes: int = 2, *, batch: int = 1, experts_hit: float | None = None
) -> StageCost:
    """One decode step: one new token per sequence of the batch, whose query attends `context` keys (the cache
    plus itself). Weight bytes are the active weights, with the routed experts hit in each MoE layer
    (`experts_hit`; default the top_k at batch 1, E·(1 − (1 − k/E)^B) at batch B); KV bytes each sequence's
    `context` cached keys/values read plus its new token's written."""
    modules = _decoder(spec, 1, context, dtype_bytes, prefill=False, batch=batch, experts_hit=experts_hit)
    return StageCost(DECODE_STEP, tuple(modules))


def decode(spec: ModelSpec, workload: Workload) -> StageCost:
    """The new_tokens − 1 decode steps after prefill; step i (1-based) attends prompt + i keys."""
    return sum_of_steps(
        lambda context: decode_step(spec, context, workload.dtype_bytes).modules,
        workload.prompt_tokens(spec),
        workload.new_tokens,
    )


def sum_of_steps(step_at: Callable[[int], tuple[ModuleCost, ...]], prompt_tokens: int, new_tokens: int) -> StageCost:
    """The "decode" stage: the new_tokens − 1 steps after prefill, step i (1-based) attending prompt + i keys.
    Every field of a step is affine in its context, so the sum is exact from the steps at the prompt length and
    one past it: Σᵢ f(P + i) = (n − 1)·f(P) + (Σᵢ i)·(f(P + 1) − f(P))."""
    steps = new_tokens - 1
    if steps <= 0:
        return StageCost(DECODE, ())
    at_p, at_p1 = step_at(prompt_tokens), step_at(prompt_tokens + 1)
    ctx_sum = steps * (steps + 1) / 2  # Σ i for i = 1 … steps
    fields = ("flops", "weight_bytes", "activation_bytes", "kv_bytes")
    modules = []
    for a, b in zip(at_p, at_p1, strict=True):
        values = {f: steps * getattr(a, f) + ctx_sum * (getattr(b, f) - getattr(a, f)) for f in fields}
        modules.append(attrs.evolve(a, **values))
    return StageCost(DECODE, tuple(modules))


def stage_costs(spec: ModelSpec, workload: Workload) -> dict[str, StageCost]:
    """Every stage of one image: the vision sub-stages, "prefill" (which contains them) and "decode"."""
    return batch_stage_costs(spec, [workload])


def batch_stage_costs(
    spec: ModelSpec, workloads: Sequence[Workload], experts_hit: float | None = None
) -> dict[str, StageCost]:
    """Every stage of one batch of images run together. The vision sub-stages hold every image's modules;
    "prefill" every image's vision and layout in turn, then one decoder forward over the batch, each sequence
    left-padded to the longest prompt (padding positions computed, read and cached like tokens); "decode" the
    new_tokens − 1 batched steps, step i attending padded prompt + i keys per sequence, with `experts_hit` distinct
    routed experts per MoE layer and step (default E·(1 − (1 − k/E)^B)). The workloads share new_tokens and
    dtype_bytes."""
    if not workloads:
        raise ValueError("no images in the batch")
    db, size = workloads[0].dtype_bytes, len(workloads)
    stages = _batch_prefill(spec, workloads)
    stages[DECODE] = sum_of_steps(
        lambda context: decode_step(spec, context, db, batch=size, experts_hit=experts_hit).modules,
        max(w.prompt_tokens(spec) for w in workloads),
        workloads[0].new_tokens,
    )
    return stages


def summed_stages(per_input: Sequence[Mapping[str, StageCost]]) -> dict[str, StageCost]:
    """Several inputs' stages as one pass over all of them: each stage holds every input's modules, in input order."""
    if not per_input:
        raise ValueError("no inputs to sum")
    return {
        stage: StageCost(stage, tuple(m for costs in per_input for m in costs[stage].modules)) for stage in per_input[0]
    }


#: What the analytic figures count, as every analytic report states it.
CONVENTIONS = (
    "1 MAC = 2 FLOPs; matmul/attention/convolution FLOPs as executed (attention over the full score matrix); MoE "
    "routed experts counted for the active top-k only; norms and elementwise ops estimated separately "
    "(non_matmul_flops); bytes = weights read + activations + KV cache, analytic estimates"
)

"""SAM's attention with the decomposed relative-position term added inside the attention kernel (FlexAttention).

transformers' SAM attention (DeepSeek-OCR v1 and OCR-2) adds a relative-position bias of heads × N × N to the
scores: SDPA materialises it as a mask (a 1024-px global block, N = 4,096: 12 heads × N² × 2 bytes ≈ 400 MB per
view). The bias is the sum of two small terms, rel_h[q, k_row] + rel_w[q, k_col] (each N × side), so `score_mod`
adds them per score without building the N × N tensor: the same arithmetic in another kernel (numerics within
rounding). `model.sam_attention=flex` swaps the class of every SAM attention module of a built model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, cast

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from llm_perf_opt.errors import UserError

SAM_ATTENTION_CHOICES = ("sdpa", "flex")


@cache
def _flex_attention(device_type: str) -> Callable[..., torch.Tensor]:
    """FlexAttention, compiled on a GPU (its fast path); eager elsewhere (a slow reference, fine for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    chosen: Any = torch.compile(flex_attention, dynamic=False) if device_type == "cuda" else flex_attention
    return cast(Callable[..., torch.Tensor], chosen)


def _sam_attention_base() -> Any:
    try:
        from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import DeepseekOcr2SamVisionAttention
    except ImportError:
        return None
    return DeepseekOcr2SamVisionAttention


def flex_forward(self: Any, hidden_states: torch.Tensor, output_attentions: bool | None = None) -> tuple[Any, None]:
    """SAM attention over (batch, height, width, channels) with the relative-position term in `score_mod`. Under a
    dispatch mode (the FLOP counter: FlexAttention's operator has no rule for it) the reference path runs instead:
    the same arithmetic, so the same FLOPs."""
    if _get_current_dispatch_mode() is not None:
        out, _ = _sam_attention_base().forward(self, hidden_states)
        return out, None
    batch, height, width, _ = hidden_states.shape
    heads, n = self.num_attention_heads, height * width
    qkv = self.qkv(hidden_states).reshape(batch, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
    query, key, value = qkv.unbind(0)  # (batch, heads, n, head_dim)
    score_mod = None
    if self.use_rel_pos:
        rel_h = self.get_rel_pos(height, height, self.rel_pos_h)  # (height, height, head_dim)
        rel_w = self.get_rel_pos(width, width, self.rel_pos_w)
        grid = query.reshape(batch * heads, height, width, -1)
        bias_h = torch.einsum("bhwc,hkc->bhwk", grid, rel_h).reshape(batch, heads, n, height)
        bias_w = torch.einsum("bhwc,wkc->bhwk", grid, rel_w).reshape(batch, heads, n, width)

        def score_mod(score: torch.Tensor, b: Any, h: Any, q: Any, k: Any) -> torch.Tensor:
            return score + bias_h[b, h, q, k // width] + bias_w[b, h, q, k % width]

    out = _flex_attention(query.device.type)(query, key, value, score_mod=score_mod)
    out = out.view(batch, heads, height, width, -1).permute(0, 2, 3, 1, 4).reshape(batch, height, width, -1)
    return self.proj(out), None


@cache
def _flex_class(base: Any) -> type[nn.Module]:
    """The FlexAttention subclass of transformers' SAM attention (one class, so a swapped module is recognised)."""
    return type("DeepseekOcr2SamVisionFlexAttention", (base,), {"forward": flex_forward})


def use_flex_sam_attention(model: nn.Module) -> int:
    """Give every SAM attention module of `model` the FlexAttention forward; how many were changed."""
    base = _sam_attention_base()
    if base is None:
        return 0
    flex_class = _flex_class(base)
    changed = 0
    for module in model.modules():
        if isinstance(module, base) and not isinstance(module, flex_class):
            module.__class__ = flex_class
            changed += 1
    return changed


def apply_sam_attention(choice: str, model: nn.Module) -> None:
    """`model.sam_attention`: "sdpa" leaves the model as built; "flex" swaps its SAM attention modules."""
    if choice not in SAM_ATTENTION_CHOICES:
        raise UserError(
            f"model.sam_attention={choice} is not a SAM attention choice",
            f"Use one of {', '.join(SAM_ATTENTION_CHOICES)} (sdpa: as built; flex: the relative-position bias inside "
            "FlexAttention)",
        )
    if choice == "flex" and use_flex_sam_attention(model) == 0:
        raise UserError(
            f"model.sam_attention=flex: {type(model).__name__} has no SAM attention module to change",
            "Leave model.sam_attention=sdpa for this model (the lever applies to DeepSeek-OCR v1 and OCR-2)",
        )

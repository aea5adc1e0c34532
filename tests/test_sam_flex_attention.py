"""model.sam_attention=flex: SAM's relative-position bias added inside FlexAttention gives the SDPA path's output
(global and windowed blocks), every SAM attention module is swapped, and bad choices are one clear error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.models.sam_flex_attention import apply_sam_attention, use_flex_sam_attention
from llm_perf_opt.session.session import DeepSeekOCRSession


def _sam_attention_modules(model: torch.nn.Module) -> list[Any]:
    return [m for name, m in model.named_modules() if name.endswith(".attn") and hasattr(m, "rel_pos_h")]


@pytest.mark.parametrize("side", [16, 7], ids=["global-grid", "window"])
def test_flex_attention_matches_the_sdpa_path(tiny_session: Any, side: int) -> None:
    reference = _sam_attention_modules(tiny_session.model)[0]
    flex = copy.deepcopy(reference)
    with torch.no_grad():
        for p in (flex.rel_pos_h, flex.rel_pos_w):
            p.normal_(0, 0.5)  # random weights start at zero: give the bias something to add
        reference = copy.deepcopy(flex)
        assert use_flex_sam_attention(torch.nn.Sequential(flex)) == 1
        hidden = torch.randn(2, side, side, reference.qkv.in_features)
        expected, _ = reference(hidden)
        got, weights = flex(hidden)
    assert weights is None
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_every_sam_attention_module_is_swapped_once(tiny_session: Any) -> None:
    model = copy.deepcopy(tiny_session.model)
    count = len(_sam_attention_modules(model))
    assert count > 0 and use_flex_sam_attention(model) == count
    assert use_flex_sam_attention(model) == 0  # already flex: nothing left to change
    assert all(type(m).__name__.endswith("FlexAttention") for m in _sam_attention_modules(model))


def test_bad_choices_are_one_clear_error() -> None:
    with pytest.raises(UserError, match="not a SAM attention choice"):
        apply_sam_attention("fused", torch.nn.Linear(2, 2))
    with pytest.raises(UserError, match="no SAM attention module"):
        apply_sam_attention("flex", torch.nn.Linear(2, 2))
    apply_sam_attention("sdpa", torch.nn.Linear(2, 2))  # as built: nothing to do, no error


def test_a_session_built_with_flex_runs(compose_model: Any, page_images: dict[str, Any]) -> None:
    session = DeepSeekOCRSession.load(
        compose_model("model=deepseek_ocr2_tiny", "model.sam_attention=flex"), torch.device("cpu")
    )
    assert all(type(m).__name__.endswith("FlexAttention") for m in _sam_attention_modules(session.model))
    measured = session.run_image(page_images["small"], 2, nvtx=False)
    assert len(measured.token_ids) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("side", [64, 14], ids=["global-1024px", "window"])
def test_compiled_flex_attention_matches_sdpa_on_the_gpu(tiny_session: Any, side: int) -> None:
    """bf16 on the GPU, FlexAttention compiled: the full-size SAM grid (64 × 64 at 1024 px) and a 14 × 14 window."""
    reference = copy.deepcopy(_sam_attention_modules(tiny_session.model)[0]).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in (reference.rel_pos_h, reference.rel_pos_w):
            p.normal_(0, 0.5)
        flex = copy.deepcopy(reference)
        use_flex_sam_attention(torch.nn.Sequential(flex))
        hidden = torch.randn(1, side, side, reference.qkv.in_features, device="cuda", dtype=torch.bfloat16)
        expected, _ = reference(hidden)
        got, _ = flex(hidden)
    torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)


def test_flops_are_counted_on_the_reference_path(compose_model: Any, page_images: dict[str, Any]) -> None:
    """FlexAttention has no FLOP-counter rule: under the counter the reference path runs, with the same FLOPs."""
    from llm_perf_opt.instruments.flops import count_stage_flops

    counts = []
    for choice in ("sdpa", "flex"):
        node = compose_model("model=deepseek_ocr2_tiny", f"model.sam_attention={choice}")
        session = DeepSeekOCRSession.load(node, torch.device("cpu"))
        counts.append(count_stage_flops(session, session.prepare(page_images["small"])))
    sdpa, flex = counts
    reference = sdpa.stage_total("vision/sam", 3)
    assert reference and flex.stage_total("vision/sam", 3) == reference

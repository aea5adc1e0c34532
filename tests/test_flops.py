"""Executed-FLOP counting (instruments/flops.py) on the tiny model, and the added grouped_mm / CPU-SDPA formulas."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from llm_perf_opt.instruments.flops import _extra_formulas, _grouped_mm_flops, count_stage_flops, flop_counter
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.measure.stage_flops import GROUPED_MM_FALLBACK_OP, StageFlops
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session.session import DeepSeekOCRSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

VISION = ("vision/sam", "vision/encoder", "vision/projector")


@pytest.fixture(scope="module")
def eager_session(compose_model):
    """The tiny model with the eager attention and eager per-expert loop instead of sdpa + grouped_mm."""
    cfg = compose_model(
        "model=deepseek_ocr2_tiny", "model.attn_implementation=eager", "model.experts_implementation=eager"
    )
    return DeepSeekOCRSession.load(cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def small_flops(tiny_session, page_images) -> StageFlops:
    return count_stage_flops(tiny_session, tiny_session.prepare(page_images["small"]))


@pytest.fixture(scope="module")
def tiles_flops(tiny_session, page_images) -> StageFlops:
    return count_stage_flops(tiny_session, tiny_session.prepare(page_images["two_tiles"]))


@pytest.mark.slow
def test_flops_do_not_depend_on_the_kernel_implementation(tiny_session, eager_session, page_images, small_flops):
    info = eager_session.adapter.describe(eager_session.model)
    assert (info.attn_implementation, info.experts_implementation) == ("eager", "eager")
    default = tiny_session.adapter.describe(tiny_session.model)
    assert (default.attn_implementation, default.experts_implementation) == ("sdpa", "grouped_mm")
    # Same seed, same weights: the same routing, so the same active expert rows.
    eager = count_stage_flops(eager_session, eager_session.prepare(page_images["small"]))
    assert eager.prompt_tokens == small_flops.prompt_tokens
    assert eager.prefill == small_flops.prefill
    assert eager.vision == small_flops.vision
    assert eager.decode_step_base == small_flops.decode_step_base
    assert eager.decode_step_per_ctx == small_flops.decode_step_per_ctx
    # ... although different operators did the work.
    assert "aten._grouped_mm" in small_flops.by_operator
    assert "aten._grouped_mm" not in eager.by_operator
    assert sum(eager.by_operator.values()) == pytest.approx(eager.prefill)


def test_decode_per_context_cost_is_the_attention_over_one_more_key(tiny_session, small_flops) -> None:
    text = tiny_session.model.config.text_config
    # 2 FLOPs per MAC x 2 matmuls (QK^T and AV) per attended key, per head dimension, head and layer.
    assert small_flops.decode_step_per_ctx == 4 * text.num_attention_heads * text.head_dim * text.num_hidden_layers
    assert small_flops.decode_step_per_ctx == 768


@pytest.mark.parametrize("cached", [0, 17, 1500])
def test_affine_decode_model_is_exact(tiny_session, small_flops, decode_step_flops, cached) -> None:
    """A decode step counted on its own (cache of `cached` positions, query attends cached + 1 keys) equals the
    model's decode_step(cached + 1), at contexts far from the two steps it was fitted on."""
    assert small_flops.decode_step(cached + 1) == decode_step_flops(tiny_session, cached)


def test_third_decode_step_counted_through_generate(tiny_session, page_images, small_flops) -> None:
    counters = {}

    class Count:
        def __init__(self, step):
            self.step = step

        def __enter__(self):
            counters[self.step] = flop_counter().__enter__()

        def __exit__(self, *exc):
            counters[self.step].__exit__(*exc)

    prepared = tiny_session.prepare(page_images["small"])
    tiny_session.generate(prepared, 4, StageRecorder(torch.device("cpu"), nvtx=False), around_step=Count)
    assert sorted(counters) == [0, 1, 2, 3]
    assert counters[0].get_total_flops() == small_flops.prefill
    for step in (1, 2, 3):  # step i attends prompt + i keys
        assert counters[step].get_total_flops() == small_flops.decode_step(prepared.prompt_tokens + step)


def test_decode_totals(small_flops) -> None:
    p = small_flops.prompt_tokens
    assert small_flops.decode_total(1) == 0
    assert small_flops.decode_total(4) == sum(small_flops.decode_step(p + i) for i in (1, 2, 3))
    assert small_flops.stage_total(vocab.DECODE, 4) == small_flops.decode_total(4)
    assert small_flops.stage_total(vocab.DECODE_STEP, 4) == pytest.approx(small_flops.decode_total(4) / 3)
    assert small_flops.stage_total(vocab.PREFILL, 4) == small_flops.prefill
    assert small_flops.stage_total("vision/sam", 4) == small_flops.vision["vision/sam"]
    assert small_flops.stage_total(vocab.PREPROCESS, 4) is None


def test_vision_is_inside_prefill_and_grows_with_tiles(small_flops, tiles_flops) -> None:
    for f in (small_flops, tiles_flops):
        assert set(f.vision) == set(VISION)
        assert all(v > 0 for v in f.vision.values())
        assert sum(f.vision.values()) < f.prefill
        assert f.prefill == pytest.approx(sum(f.by_operator.values()))
    for stage in VISION:
        assert tiles_flops.vision[stage] > small_flops.vision[stage]
    assert tiles_flops.prefill > small_flops.prefill
    # Decode weights do not depend on the image; only the context does.
    assert tiles_flops.decode_step_base == small_flops.decode_step_base
    assert tiles_flops.decode_step_per_ctx == small_flops.decode_step_per_ctx
    assert tiles_flops.prompt_tokens - small_flops.prompt_tokens == 2 * 144


def test_transformers_grouped_mm_fallback_counts_like_grouped_mm(
    tiny_session, page_images, small_flops, decode_step_flops, monkeypatch
) -> None:
    """Where torch's grouped_mm cannot run, transformers loops over experts inside its own custom op, which the
    counter sees as one opaque call: its formula must give the same FLOPs as the grouped_mm path."""
    from transformers.integrations import moe

    calls = []

    def fallback_only(*args):
        calls.append(args)
        return False

    monkeypatch.setattr(moe, "_can_use_grouped_mm", fallback_only)
    fallback = count_stage_flops(tiny_session, tiny_session.prepare(page_images["small"]))
    assert calls  # the experts went through the fallback
    assert GROUPED_MM_FALLBACK_OP in fallback.by_operator and GROUPED_MM_FALLBACK_OP not in small_flops.by_operator
    assert "aten._grouped_mm" not in fallback.by_operator
    assert fallback.by_operator[GROUPED_MM_FALLBACK_OP] == small_flops.by_operator["aten._grouped_mm"]
    assert fallback.prefill == small_flops.prefill
    assert fallback.decode_step_base == small_flops.decode_step_base
    assert fallback.decode_step_per_ctx == small_flops.decode_step_per_ctx
    assert fallback.decode_total(32) == small_flops.decode_total(32) > 0

    # Without its formula the fallback's FLOPs (the routed experts') vanish from a decode step.
    def one_step(counter: FlopCounterMode) -> FlopCounterMode:
        with torch.inference_mode(), counter:
            tiny_session.model(input_ids=torch.tensor([[5]]), logits_to_keep=1)
        return counter

    fallback_op = torch.ops.transformers.grouped_mm_fallback
    without = {op: f for op, f in _extra_formulas().items() if op is not fallback_op}
    counted = one_step(flop_counter())
    missed = one_step(FlopCounterMode(display=False, custom_mapping=without))
    assert counted.get_total_flops() == decode_step_flops(tiny_session, 0)
    experts = counted.get_flop_counts()["Global"][fallback_op]
    assert experts > 0
    assert counted.get_total_flops() - missed.get_total_flops() == experts


def test_cpu_sdpa_is_counted(small_flops) -> None:
    assert small_flops.by_operator.get("aten._scaled_dot_product_flash_attention_for_cpu", 0) > 0


# ---- the grouped_mm formula --------------------------------------------------------------------------------


def test_grouped_mm_2d_x_3d_counts_only_the_rows_the_offsets_cover() -> None:
    tokens, k, n = 12, 8, 4
    mat_a, mat_b = torch.randn(tokens, k), torch.randn(3, k, n)
    offs = torch.tensor([3, 7, 9], dtype=torch.int32)  # rows 9..11 are padding past the last group
    assert _grouped_mm_flops(mat_a, mat_b, offs) == 2 * 9 * k * n
    assert _grouped_mm_flops(mat_a, mat_b, None) == 2 * tokens * k * n
    with flop_counter() as counter:
        out = torch._grouped_mm(mat_a, mat_b, offs=offs)
    assert counter.get_total_flops() == 2 * 9 * k * n
    torch.testing.assert_close(out[3:7], mat_a[3:7] @ mat_b[1])


def test_grouped_mm_3d_x_3d_is_a_batched_matmul() -> None:
    groups, m, k, n = 3, 4, 8, 4
    mat_a, mat_b = torch.randn(groups, m, k), torch.randn(groups, k, n)
    assert _grouped_mm_flops(mat_a, mat_b) == 2 * groups * m * k * n
    with flop_counter() as counter:
        out = torch._grouped_mm(mat_a, mat_b)
    assert counter.get_total_flops() == 2 * groups * m * k * n
    torch.testing.assert_close(out, torch.bmm(mat_a, mat_b))


def test_grouped_mm_2d_x_2d_groups_along_k() -> None:
    m, k, n = 4, 12, 8
    mat_a, mat_b = torch.randn(m, k), torch.randn(k, n)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    assert _grouped_mm_flops(mat_a, mat_b, offs) == 2 * m * k * n


def test_grouped_mm_meta_offsets_fall_back_to_all_rows() -> None:
    mat_a, mat_b = torch.empty(12, 8, device="meta"), torch.empty(3, 8, 4, device="meta")
    offs = torch.empty(3, dtype=torch.int32, device="meta")
    assert _grouped_mm_flops(mat_a, mat_b, offs) == 2 * 12 * 8 * 4


def test_grouped_mm_3d_x_2d_groups_along_n() -> None:
    groups, m, k, n_total = 3, 4, 8, 12
    mat_a, mat_b = torch.randn(groups, m, k), torch.randn(k, n_total)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    out = torch._grouped_mm(mat_a, mat_b, offs=offs)
    assert out.shape == (m, n_total)
    torch.testing.assert_close(out[:, 4:8], mat_a[1] @ mat_b[:, 4:8])  # group 1 -> columns 4..7 only
    assert _grouped_mm_flops(mat_a, mat_b, offs) == 2 * m * k * n_total

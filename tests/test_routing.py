"""MoE routing record: hooks on the DeepSeek-V2 routers of tiny v1 and v2 record the experts each decode step hit,
per layer; the summary gives distinct experts per step (mean, p50, p90), a hit histogram, and E·(1 − (1 − k/E)^B)."""

from __future__ import annotations

import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.instruments.routing import find_routers
from llm_perf_opt.measure.routing_summary import RoutingTrace, expected_unique_experts, summarize_routing
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")
NEW_TOKENS = 5


def test_routers_found_in_both_tiny_models(tiny_session, v1_session) -> None:
    for session in (tiny_session, v1_session):
        routers = find_routers(session.model)
        assert [layer for layer, _ in routers] == [1, 2]  # mlp_layer_types: [dense, sparse, sparse]
        assert all(type(r).__name__ == "DeepseekOcr2TextTopkRouter" for _, r in routers)
        assert session.routing is not None
        assert (session.routing.experts, session.routing.top_k) == (8, 2)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["v1", "v2"])
@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_trace_holds_the_routers_choices_of_each_decode_step(
    tiny_session, v1_session, page_images, model, kv_cache
) -> None:
    base = v1_session if model == "v1" else tiny_session
    session = base.with_runtime(RuntimeSettings(kv_cache=kv_cache))
    seen: list[list[int]] = []  # every router call: its top-k indices, as the test's own hook sees them
    handles = [
        router.register_forward_hook(lambda _m, _a, out: seen.append(sorted(out[-1].flatten().tolist())))
        for _, router in find_routers(session.model)
    ]
    try:
        measured = session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False)
    finally:
        for handle in handles:
            handle.remove()
        session.close()
    trace = measured.routing
    assert trace is not None
    assert (trace.layers, trace.experts, trace.top_k, trace.tokens_per_step) == ((1, 2), 8, 2, 1)
    assert trace.steps == NEW_TOKENS - 1
    decode_calls = seen[2:]  # the first two router calls are the prefill's (one per MoE layer)
    expected = [tuple(tuple(sorted(set(decode_calls[s * 2 + i]))) for i in range(2)) for s in range(NEW_TOKENS - 1)]
    assert trace.hits == tuple(expected)
    assert all(len(experts) == 2 for step in trace.hits for experts in step)  # one token: k distinct experts


def test_routing_record_can_be_switched_off(tiny_session, page_images) -> None:
    session = tiny_session.with_runtime(RuntimeSettings(record_routing=False))
    try:
        assert session.routing is None
        assert session.run_image(page_images["small"], 3, nvtx=False).routing is None
    finally:
        session.close()


def test_dense_model_has_no_routing() -> None:
    cfg = compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model
    session = InferenceSession.load(cfg, CPU)
    assert session.routing is None
    assert find_routers(session.model) == []


def test_single_token_pass_has_an_empty_trace(tiny_session, page_images) -> None:
    trace = tiny_session.run_image(page_images["small"], 1, nvtx=False).routing
    assert trace is not None and trace.steps == 0
    assert summarize_routing([trace]) is None


def test_expected_unique_experts() -> None:
    assert expected_unique_experts(64, 6, 1) == pytest.approx(6.0)
    assert expected_unique_experts(64, 6, 8) == pytest.approx(64 * (1 - (58 / 64) ** 8))
    assert expected_unique_experts(64, 6, 8) == pytest.approx(34.88, abs=0.01)
    assert expected_unique_experts(8, 2, 1000) == pytest.approx(8.0)


def test_summary_pools_passes_per_layer() -> None:
    a = RoutingTrace(layers=(1, 2), experts=4, top_k=2, tokens_per_step=2, hits=(((0, 1), (0, 1, 2)), ((1, 3), (2,))))
    b = RoutingTrace(layers=(1, 2), experts=4, top_k=2, tokens_per_step=2, hits=(((0, 1, 2, 3), (3, 2)),))
    summary = summarize_routing([a, b])
    assert summary is not None
    assert summary.steps == 3
    assert [lr.layer for lr in summary.per_layer] == [1, 2]
    layer1, layer2 = (lr.unique_per_step for lr in summary.per_layer)
    assert (layer1.n, layer1.mean, layer1.p50, layer1.max) == (3, pytest.approx(8 / 3), 2.0, 4.0)
    assert (layer2.mean, layer2.min) == (pytest.approx(2.0), 1.0)
    assert layer1.unit == "experts"
    assert summary.overall.n == 6
    assert summary.overall.mean == pytest.approx((2 + 2 + 4 + 3 + 1 + 2) / 6)
    assert summary.overall.p90 == pytest.approx(3.5)
    assert summary.hit_histogram == ((2, 3, 1, 2), (1, 1, 3, 1))
    assert summary.expected_unique == pytest.approx(4 * (1 - 0.5**2))


def test_summary_refuses_mixed_batch_sizes() -> None:
    a = RoutingTrace(layers=(1,), experts=4, top_k=2, tokens_per_step=1, hits=(((0, 1),),))
    b = RoutingTrace(layers=(1,), experts=4, top_k=2, tokens_per_step=2, hits=(((0, 1),),))
    with pytest.raises(ValueError, match="cannot be pooled"):
        summarize_routing([a, b])


@pytest.mark.slow
def test_detached_hooks_record_nothing_until_attached_again(tiny_session, page_images) -> None:
    routing = tiny_session.routing
    assert routing is not None
    routing.remove()
    try:
        assert tiny_session.run_image(page_images["small"], 3, nvtx=False).routing.steps == 0  # type: ignore[union-attr]
    finally:
        routing.attach()
    assert tiny_session.run_image(page_images["small"], 3, nvtx=False).routing.steps == 2  # type: ignore[union-attr]

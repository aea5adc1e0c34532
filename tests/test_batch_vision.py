"""Batched vision (`runtime.batch_vision`): the views of a batch's pages through the vision stages together, one call
per view shape, split back per page: the same image embeddings as each page's vision on its own (fp32 on the CPU)
and the same tokens, for pages of different tile counts in one batch; the vision sub-stages timed once per view
group; compiled vision padded to fixed group shapes; refused where it cannot apply (tiny models on the CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import NullRecorder
from llm_perf_opt.models.view_groups import encode_grouped, padded_count
from llm_perf_opt.override_keys import check_override_keys
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session import compiled
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

CPU = torch.device("cpu")
NEW_TOKENS = 4
#: Page sizes of different v1 crop grids (tiles: 6, 2, 3) and OCR-2 tile counts (0, 2, 3).
SIZES = {"a_page": (700, 500), "b_two": (1536, 768), "c_wide": (3000, 1000)}
BATCH_VISION = RuntimeSettings(batch_size=3, batch_vision=True)


@pytest.fixture(scope="module")
def noisy_pages(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Noisy pages (every tile differs, so a view out of place changes the embeddings)."""
    root = tmp_path_factory.mktemp("noisy_pages")
    rng = np.random.default_rng(0)
    out = []
    for name, (width, height) in SIZES.items():
        out.append(root / f"{name}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out[-1])
    return out


@pytest.fixture(scope="module")
def v1_expected(v1_session: InferenceSession, noisy_pages: list[Path]) -> list[tuple[int, ...]]:
    """Each noisy page's tokens run alone (eager, batch 1) by the tiny v1 model."""
    return [v1_session.run_image(p, NEW_TOKENS, nvtx=False).token_ids for p in noisy_pages]


@pytest.fixture
def eager_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.compile traced with the eager backend (the compile bookkeeping without inductor's minutes)."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "compile_function", lambda fn, *_: torch.compile(fn, backend="eager", dynamic=False))
    yield
    torch._dynamo.reset()


def _embeddings(session: InferenceSession, pages: list[Path], multiples: tuple[int, ...]) -> tuple[list[Any], ...]:
    """Each page's embeddings alone, then the batch's with each view-group padding multiple."""
    prepared = [session.prepare(p) for p in pages]
    with torch.inference_mode():
        alone = [session.adapter.embed_prompt(session.model, p) for p in prepared]
        together = [session.adapter.embed_prompts(session.model, prepared, m) for m in multiples]
    return (alone, *together)


def _assert_close(alone: list[Any], *batched: list[Any] | None) -> None:
    for embeds in batched:
        assert embeds is not None
        for one, together in zip(alone, embeds, strict=True):
            assert one is not None and together.shape == one.shape
            torch.testing.assert_close(together, one, rtol=1e-4, atol=1e-5)  # fp32: sums in another order


def test_encode_grouped_groups_by_shape_and_drops_the_padding() -> None:
    calls: list[tuple[int, ...]] = []

    def encode(views: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(views.shape))
        return views.flatten(1).sum(-1, keepdim=True) * 2

    small = [torch.rand(n, 3, 2, 2) for n in (1, 1, 1)]
    large = [torch.rand(4, 3, 5, 5), None, torch.rand(0, 3, 5, 5)]
    stacks = [small[0], large[0], small[1], large[1], small[2], large[2]]
    out = encode_grouped(stacks, encode, multiple=4)
    assert sorted(calls) == [(4, 3, 2, 2), (4, 3, 5, 5)]  # one call per view shape, padded to a multiple of 4
    for stack, features in zip(stacks, out, strict=True):
        if stack is None or stack.shape[0] == 0:
            assert features is None
        else:
            assert features is not None
            torch.testing.assert_close(features, encode(stack))
    assert padded_count(9, 4) == 12 and padded_count(8, 4) == 8


def test_v1_batched_embeddings_equal_each_page_alone(v1_session, noisy_pages) -> None:
    alone, *batched = _embeddings(v1_session, noisy_pages, (1, 4))
    assert [p.tiles for p in map(v1_session.prepare, noisy_pages)] == [6, 2, 3]  # three crop grids in one batch
    _assert_close(alone, *batched)
    assert not torch.allclose(alone[1], alone[2][:, : alone[1].shape[1]])  # the pages do differ


def test_ocr2_batched_embeddings_equal_each_page_alone(tiny_session, noisy_pages) -> None:
    alone, *batched = _embeddings(tiny_session, noisy_pages, (1,))
    assert [p.tiles for p in map(tiny_session.prepare, noisy_pages)] == [0, 2, 3]  # a page without tiles too
    _assert_close(alone, *batched)


@pytest.mark.slow
def test_v1_batched_vision_gives_each_page_its_tokens_and_times_the_batch(v1_session, noisy_pages, v1_expected) -> None:
    session = v1_session.with_runtime(BATCH_VISION)
    try:
        m = session.run_batch(noisy_pages, NEW_TOKENS, nvtx=False)
    finally:
        session.close()
    assert [p.token_ids for p in m.pages] == v1_expected
    for stage in session.vision_stages:
        assert m.stage_calls[stage] == 2  # once per view group (the global views, the tiles), not per page
        shares = [p.vision_ms[stage] for p in m.pages]
        assert shares == [shares[0]] * 3 and sum(shares) == pytest.approx(m.stage_ms[stage])
    record = m.record(0, 0, ("a", "b", "c"))
    assert record.vision_ms == {s: ms for s, ms in m.stage_ms.items() if vocab.is_vision(s)}
    assert sum(record.vision_ms.values()) < record.prefill_ms
    assert "vision batched" in BATCH_VISION.label


@pytest.mark.slow
def test_compiled_vision_and_prefill_at_the_batch_shapes(v1_session, noisy_pages, v1_expected, eager_backend) -> None:
    runtime = RuntimeSettings(
        kv_cache="static",
        compile="prefill_decode",
        compile_mode="default",
        compile_vision="default",
        batch_size=3,
        batch_vision=True,
    )
    session = v1_session.with_runtime(runtime)
    try:
        first = session.run_batch(noisy_pages, NEW_TOKENS, nvtx=False)
        again = session.run_batch(noisy_pages, NEW_TOKENS, nvtx=False)
    finally:
        session.close()
    assert [p.token_ids for p in first.pages] == [p.token_ids for p in again.pages] == v1_expected
    vision_shapes = {e.shape for e in first.compile_events if e.function == vocab.VISION_SAM}
    assert vision_shapes == {(3, 3, 1024, 1024), (12, 3, 640, 640)}  # 11 tiles padded to a multiple of the batch
    assert {e.function for e in first.compile_events} >= {"prefill", "decode"}
    assert again.compile_events == ()  # fixed shapes: nothing compiles again


def test_bounded_profile_embeddings_with_batched_vision(v1_session, noisy_pages) -> None:
    session = v1_session.with_runtime(BATCH_VISION)
    batch = [session.prepare(p) for p in noisy_pages[1:]] * 2  # the two cheaper pages, twice
    try:
        plain = session.generate_batch(batch, 2, NullRecorder(CPU))
        with session.embeddings_kept(batch, 1):
            kept = session.generate_batch(batch, 2, NullRecorder(CPU))
    finally:
        session.close()
    assert kept == plain


def test_batch_vision_needs_a_batch() -> None:
    cfg = compose_config("stage1", "model=deepseek_ocr_tiny", "runtime.batch_vision=true")
    with pytest.raises(UserError, match=r"runtime.batch_vision=true .* run.batch_size=1") as info:
        RuntimeSettings.from_nodes(stage1_nodes(cfg))
    assert "run.batch_size to 2 or more" in info.value.fix
    batched = compose_config("stage1", "model=deepseek_ocr_tiny", "runtime.batch_vision=true", "run.batch_size=2")
    assert RuntimeSettings.from_nodes(stage1_nodes(batched)).batch_vision
    with pytest.raises(UserError, match=r"runtime.batch_vision"):
        check_override_keys("stage1", ["runtime.batch_vision=often"], command="stage1-run")


def test_batch_vision_is_refused_for_a_model_that_cannot_batch_it() -> None:
    cfg = compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model
    with pytest.raises(UserError, match=r"runtime.batch_vision=true cannot run here: the hf adapter") as info:
        InferenceSession.load(cfg, CPU, RuntimeSettings(batch_size=2, batch_vision=True))
    assert "runtime.batch_vision=false" in info.value.fix

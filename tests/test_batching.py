"""run.batch_size > 1: vision per input, the decoder batched with left padding and ready 4-D masks; greedy outputs of
a batch equal the same inputs run alone (tiny v1 and v2 with pages of different tile counts, a tiny Qwen2 on prompts
of different lengths), with dynamic and static caches; per-input and per-batch figures; unsupported cases fail as
UserErrors."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import host_reads
from hf_fixtures import save_tiny_llava
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session import compiled
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import BatchMeasurement, InferenceSession, batches

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")
NEW_TOKENS = 5
PAGES = ("small", "two_tiles", "wide")  # 0, 2 and 3 tiles: three prompt lengths
BATCH = RuntimeSettings(batch_size=3)
STATIC_BATCH = RuntimeSettings(kv_cache="static", batch_size=3)


@pytest.fixture(scope="module")
def qwen_session() -> InferenceSession:
    return InferenceSession.load(compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model, CPU)


def alone(session: InferenceSession, paths: list[Path]) -> list[tuple[int, ...]]:
    return [session.run_image(path, NEW_TOKENS, nvtx=False).token_ids for path in paths]


def batched(session: InferenceSession, paths: list[Path], runtime: RuntimeSettings) -> BatchMeasurement:
    run = session.with_runtime(runtime)
    try:
        return run.run_batch(paths, NEW_TOKENS, nvtx=False)
    finally:
        run.close()


@pytest.fixture(scope="module")
def v2_pages(page_images: dict[str, Path]) -> list[Path]:
    return [page_images[p] for p in PAGES]


@pytest.fixture(scope="module")
def v2_alone(tiny_session: InferenceSession, v2_pages: list[Path]) -> list[tuple[int, ...]]:
    return alone(tiny_session, v2_pages)


@pytest.fixture(scope="module")
def v2_batch(tiny_session: InferenceSession, v2_pages: list[Path]) -> BatchMeasurement:
    return batched(tiny_session, v2_pages, BATCH)


@pytest.mark.slow
def test_v2_batch_equals_pages_alone(v2_batch, v2_alone) -> None:
    assert [p.tiles for p in v2_batch.pages] == [0, 2, 3]
    assert len({p.prompt_tokens for p in v2_batch.pages}) == 3
    assert [p.token_ids for p in v2_batch.pages] == v2_alone
    assert len(set(v2_alone)) > 1  # the pages do give different tokens: equality means something


@pytest.mark.parametrize(
    "runtime", [STATIC_BATCH, RuntimeSettings(kv_cache="static", batch_size=3, static_cache_len=800)]
)
def test_v2_static_batch_equals_pages_alone(tiny_session, v2_pages, v2_alone, runtime) -> None:
    assert [p.token_ids for p in batched(tiny_session, v2_pages, runtime).pages] == v2_alone


@pytest.mark.slow
def test_v1_batch_equals_pages_alone(v1_session, page_images) -> None:
    pages = [page_images[p] for p in ("small", "a4", "two_tiles")]
    expected = alone(v1_session, pages)
    for runtime in (BATCH, STATIC_BATCH):
        measured = batched(v1_session, pages, runtime)
        assert [p.token_ids for p in measured.pages] == expected
    assert measured.pages[1].image_tokens == 903


def test_text_batch_equals_prompts_alone(qwen_session) -> None:
    prompts = [bundled_prompts_dir() / name for name in ("question_short.txt", "email_summary.txt", "code_review.txt")]
    expected = alone(qwen_session, prompts)
    for runtime in (BATCH, STATIC_BATCH):
        measured = batched(qwen_session, prompts, runtime)
        assert len({p.prompt_tokens for p in measured.pages}) == 3
        assert [p.token_ids for p in measured.pages] == expected


@pytest.mark.slow
def test_eager_attention_takes_an_additive_mask(compose_model, v2_pages) -> None:
    """Two pages of different prompt lengths (0 and 2 tiles): the shorter one is padded (the third page would only
    add eager vision over 3 more tiles)."""
    pages = v2_pages[:2]
    session = InferenceSession.load(compose_model("model=deepseek_ocr2_tiny", "model.attn_implementation=eager"), CPU)
    measured = batched(session, pages, RuntimeSettings(batch_size=2))
    assert len({p.prompt_tokens for p in measured.pages}) == 2
    assert [p.token_ids for p in measured.pages] == alone(session, pages)


def test_batch_figures(v2_batch) -> None:
    m = v2_batch
    assert m.batch_size == 3 and m.new_tokens == NEW_TOKENS
    assert m.padded_prompt_tokens == max(p.prompt_tokens for p in m.pages)
    assert len(m.decode_step_ms) == NEW_TOKENS - 1 and all(ms > 0 for ms in m.decode_step_ms)
    assert m.stage_calls[vocab.PREFILL] == 1 and m.stage_calls[vocab.DECODE_STEP] == NEW_TOKENS - 1
    # vision ran per page: the global view, plus one call for the tiles of a page that has some
    assert [p.vision_calls["vision/sam"] for p in m.pages] == [1, 2, 2]
    assert m.stage_calls["vision/sam"] == 5
    assert m.stage_ms["vision/sam"] == pytest.approx(sum(p.vision_ms["vision/sam"] for p in m.pages))
    vision = sum(m.stage_ms[s] for s in ("vision/sam", "vision/encoder", "vision/projector"))
    assert 0 < vision <= m.prefill_ms  # every page's vision runs inside the batch's prefill
    assert m.preprocess_ms == pytest.approx(sum(p.preprocess_ms for p in m.pages))
    assert m.ttft_ms == pytest.approx(m.preprocess_ms + m.prefill_ms)
    assert m.decode_tokens_per_s == pytest.approx((NEW_TOKENS - 1) / m.decode_ms * 1e3)
    assert m.aggregate_decode_tokens_per_s == pytest.approx(3 * m.decode_tokens_per_s)
    assert m.pages_per_s == pytest.approx(3 / (m.preprocess_ms + m.prefill_ms + m.decode_ms) * 1e3)
    assert m.peak_memory_bytes is None  # CPU
    assert m.routing is not None and m.routing.tokens_per_step == 3 and m.routing.steps == NEW_TOKENS - 1
    assert all(2 <= len(experts) <= 6 for step in m.routing.hits for experts in step)  # 3 tokens x top-2 of 8
    assert all(p.output_check is not None and p.output_check.first_departure is None for p in m.pages)


def test_page_measurements_carry_the_batch_times(v2_batch) -> None:
    views = v2_batch.page_measurements()
    assert [v.token_ids for v in views] == [p.token_ids for p in v2_batch.pages]
    for view, page in zip(views, v2_batch.pages, strict=True):
        assert view.ttft_ms == pytest.approx(v2_batch.ttft_ms)
        assert view.decode_ms == v2_batch.decode_ms
        assert view.stage_ms["vision/sam"] == page.vision_ms["vision/sam"]
        assert view.stage_calls["vision/sam"] == page.vision_calls["vision/sam"]
        assert view.routing is None and view.compile_events == ()  # batch-level, not per page


def test_one_input_batch_is_a_plain_run(tiny_session, page_images, v2_alone) -> None:
    m = batched(tiny_session, [page_images["two_tiles"]], BATCH)  # a last batch smaller than run.batch_size
    assert m.batch_size == 1
    assert m.pages[0].token_ids == v2_alone[1]
    assert m.pages[0].vision_calls["vision/sam"] == 2
    assert m.routing is not None and m.routing.tokens_per_step == 1


def test_batches_plan_keeps_a_smaller_last_batch(tmp_path) -> None:
    paths = [tmp_path / f"{i}.png" for i in range(5)]
    assert batches(paths, 2) == [tuple(paths[:2]), tuple(paths[2:4]), (paths[4],)]
    assert batches(paths, 8) == [tuple(paths)]
    with pytest.raises(UserError, match=r"run\.batch_size=0"):
        batches(paths, 0)


def test_padded_decode_steps_get_4d_masks_and_read_nothing_on_the_host(tiny_session, v2_pages) -> None:
    calls: list[dict[str, Any]] = []
    handle = tiny_session.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append(dict(kwargs)), with_kwargs=True
    )
    spies: list[Any] = []

    def around(step: int) -> Any:
        if step == 0:
            return nullcontext()
        spies.append(host_reads())
        return spies[-1]

    for runtime in (BATCH, STATIC_BATCH):
        run = tiny_session.with_runtime(runtime)
        try:
            batch = [run.prepare(p) for p in v2_pages]
            run.generate_batch(batch, 4, StageRecorder(CPU, nvtx=False), around_step=around)
        finally:
            run.close()
    handle.remove()
    assert [spy.ops for spy in spies] == [[]] * 6
    decodes = [c for c in calls if "input_ids" in c and c["input_ids"].shape == (3, 1)]
    assert len(decodes) == 6
    for c in decodes:
        assert c["attention_mask"].dim() == 4 and c["attention_mask"].dtype == torch.bool
        assert c["position_ids"].shape == (3, 1)


@pytest.mark.slow
def test_compiled_decode_of_a_padded_batch(tiny_session, v2_pages, v2_alone, monkeypatch) -> None:
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "compile_function", lambda fn, *_: torch.compile(fn, backend="eager"))
    runtime = RuntimeSettings(kv_cache="static", compile="decode", compile_mode="default", batch_size=3)
    try:
        m = batched(tiny_session, v2_pages, runtime)
    finally:
        torch._dynamo.reset()
    assert [p.token_ids for p in m.pages] == v2_alone
    assert m.compile_events and m.compile_events[0].shape[0] == 3


def test_flash_attention_cannot_take_a_padded_batch(tiny_session, v2_pages) -> None:
    run = tiny_session.with_runtime(BATCH)
    run._loop.attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(UserError, match=r"attn_implementation=flash_attention_2") as info:
            run.run_batch(v2_pages, 2, nvtx=False)
    finally:
        run.close()
    assert "model.attn_implementation=sdpa" in info.value.fix


def test_image_text_model_cannot_batch(tmp_path) -> None:
    folder = save_tiny_llava(tmp_path / "llava")
    cfg = compose_config("stage1", "model=hf", f"model.name_or_path={folder}").model
    session = InferenceSession.load(cfg, CPU, BATCH)
    page = tmp_path / "page.png"
    from PIL import Image

    Image.new("RGB", (64, 48), "white").save(page)
    with pytest.raises(UserError, match=r"merges its vision features inside its own forward") as info:
        session.run_batch([page, page], 2, nvtx=False)
    assert "run.batch_size=1" in info.value.fix
    assert len(session.run_batch([page], 2, nvtx=False).pages[0].token_ids) == 2  # alone it runs

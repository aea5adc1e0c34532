"""runtime.kv_cache=static: transformers' StaticCache in the explicit loop gives exactly the dynamic-cache tokens
(tiny DeepSeek-OCR v1 and v2, a tiny Qwen2), is reused across passes, and every unsupported case is a UserError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.session.adapters.base import ModelAdapter
from llm_perf_opt.session.kv_cache import KvCaches
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")
NEW_TOKENS = 5
STATIC = RuntimeSettings(kv_cache="static")


@pytest.fixture(scope="module")
def qwen_session() -> InferenceSession:
    cfg = compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model
    return InferenceSession.load(cfg, CPU)


def static_and_dynamic(session: InferenceSession, path: Path, runtime: RuntimeSettings = STATIC) -> tuple[Any, Any]:
    static = session.with_runtime(runtime)
    try:
        return static.run_image(path, NEW_TOKENS, nvtx=False), session.run_image(path, NEW_TOKENS, nvtx=False)
    finally:
        static.close()


@pytest.mark.parametrize("page", ["small", "two_tiles"])
def test_static_cache_gives_the_dynamic_tokens_v2(tiny_session, page_images, page) -> None:
    static, dynamic = static_and_dynamic(tiny_session, page_images[page])
    assert len(static.token_ids) == NEW_TOKENS
    assert static.token_ids == dynamic.token_ids
    assert len(static.decode_step_ms) == NEW_TOKENS - 1


def test_static_cache_gives_the_dynamic_tokens_v1(v1_session, page_images) -> None:
    static, dynamic = static_and_dynamic(v1_session, page_images["a4"])  # Gundam: 2x3 tiles
    assert static.image_tokens == 903
    assert static.token_ids == dynamic.token_ids


def test_static_cache_gives_the_dynamic_tokens_qwen2(qwen_session) -> None:
    prompt = bundled_prompts_dir() / "question_short.txt"
    static, dynamic = static_and_dynamic(qwen_session, prompt)
    assert static.image_tokens == 0
    assert static.token_ids == dynamic.token_ids


@pytest.mark.slow
def test_fixed_length_static_cache_is_reused_across_passes(v1_session, page_images) -> None:
    """One cache length for every input: the same StaticCache object (same tensors) serves every pass, reset."""
    session = v1_session.with_runtime(RuntimeSettings(kv_cache="static", static_cache_len=1024))
    try:
        first = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        kept = dict(session._loop.caches._static)
        second = session.run_image(page_images["a4"], NEW_TOKENS, nvtx=False)
        again = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        assert list(session._loop.caches._static) == [(1, 1024)]
        assert session._loop.caches._static[(1, 1024)] is kept[(1, 1024)]
        assert first.token_ids == again.token_ids  # the reset left nothing of the a4 page behind
        assert second.token_ids == v1_session.run_image(page_images["a4"], NEW_TOKENS, nvtx=False).token_ids
    finally:
        session.close()


def test_static_cache_too_small_is_a_user_error(v1_session, page_images) -> None:
    session = v1_session.with_runtime(RuntimeSettings(kv_cache="static", static_cache_len=64))
    try:
        with pytest.raises(UserError, match=r"runtime\.static_cache_len=64 is too small") as info:
            session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        prompt = session.prepare(page_images["small"]).prompt_tokens
        assert f"at least {prompt + NEW_TOKENS - 1}" in info.value.fix
    finally:
        session.close()


def test_cache_length_covers_prompt_and_new_tokens() -> None:
    assert KvCaches("static", None).length_for(100, 8) == 108
    assert KvCaches("static", None, fixed_length=107).length_for(100, 8) == 107  # the last token is never fed back
    with pytest.raises(UserError):
        KvCaches("static", None, fixed_length=106).length_for(100, 8)


class _NoStaticCache(nn.Module):
    _can_compile_fullgraph = False


def test_model_without_static_cache_support_is_a_user_error(tiny_session) -> None:
    class Adapter(type(tiny_session.adapter)):  # type: ignore[misc]
        def decoder_module(self, model: nn.Module) -> nn.Module:
            return _NoStaticCache()

    adapter: ModelAdapter = Adapter(tiny_session.adapter.settings)
    assert "_can_compile_fullgraph is False" in (adapter.static_cache_blocker(tiny_session.model) or "")
    with pytest.raises(UserError, match=r"runtime\.kv_cache=static is not supported by this model") as info:
        InferenceSession(adapter, tiny_session.loaded, CPU, tiny_session.dtype, STATIC)
    assert "runtime.kv_cache=dynamic" in info.value.fix


def test_real_adapters_support_static_caches(tiny_session, v1_session, qwen_session) -> None:
    for session in (tiny_session, v1_session, qwen_session):
        assert session.adapter.static_cache_blocker(session.model) is None


def test_generate_reference_ignores_the_session_runtime(v1_session, page_images) -> None:
    session = v1_session.with_runtime(RuntimeSettings(kv_cache="static", static_cache_len=64))
    try:
        prepared = session.prepare(page_images["small"])
        recorder = StageRecorder(CPU, nvtx=False)
        # the static cache is too small, but the reference loop runs on a dynamic cache
        assert session.generate(prepared, 3, recorder, reference=True) == list(
            v1_session.run_image(page_images["small"], 3, nvtx=False).token_ids
        )
    finally:
        session.close()

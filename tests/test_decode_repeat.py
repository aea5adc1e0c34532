"""The decode section repeated over the same prompt (what the energy pass's decode-only loop runs): the KV cache is
rewound to the prompt before each repeat, so each repeat writes the same positions and gives the same tokens, for
dynamic and static caches, one input or a padded batch."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from llm_perf_opt.instruments.measured_session import DecodeNotRepeatable
from llm_perf_opt.instruments.timing import NullRecorder
from llm_perf_opt.session import compiled
from llm_perf_opt.session.kv_cache import rewind_blocker
from llm_perf_opt.session.runtime import RuntimeSettings

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

NEW_TOKENS = 4
REPEATS = 3


def _lengths(cache: Any) -> list[int]:
    return [int(layer.get_seq_length()) for layer in cache.layers]


@pytest.mark.parametrize(
    ("runtime", "pages"),
    [
        (RuntimeSettings(), ("small",)),
        (RuntimeSettings(kv_cache="static"), ("small",)),
        (RuntimeSettings(batch_size=2), ("small", "two_tiles")),
        (RuntimeSettings(kv_cache="static", batch_size=2), ("small", "two_tiles")),
    ],
    ids=["dynamic", "static", "dynamic-batch", "static-batch"],
)
def test_repeated_decode_sections_rewrite_the_same_positions_and_tokens(
    tiny_session: Any, page_images: Any, runtime: RuntimeSettings, pages: tuple[str, ...]
) -> None:
    session = tiny_session.with_runtime(runtime)
    try:
        prepared = [session.prepare(page_images[p]) for p in pages]
        plain = session.generate_batch(prepared, NEW_TOKENS, NullRecorder(session.device))
        caches: list[Any] = []
        after: list[list[int]] = []

        def repeater(again: Callable[[], None]) -> None:
            finished = _lengths(caches[-1])
            for _ in range(REPEATS):
                again()
                after.append(_lengths(caches[-1]))
            assert all(lengths == finished for lengths in after)

        with session.observe_cache(caches.append), session.repeat_decode(repeater):
            repeated = session.generate_batch(prepared, NEW_TOKENS, NullRecorder(session.device))
    finally:
        session.close()
    assert len(after) == REPEATS and after[0][0] > NEW_TOKENS - 1
    assert repeated == plain  # the last repeat's tokens: the same as one plain pass


def test_repeats_of_a_compiled_decode_step_compile_nothing_new(
    tiny_session: Any, page_images: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeats reach the compiled step in the state the pass left its guards (routing recorded as in the pass):
    one compilation in all, not one more for the repeats (on the H100 a recompile cost 10.7 s of the 2-s loop)."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "compile_function", lambda fn, *_: torch.compile(fn, backend="eager"))
    session = tiny_session.with_runtime(RuntimeSettings(kv_cache="static", compile="decode", compile_mode="default"))
    try:
        prepared = [session.prepare(page_images["small"])]
        session.generate_batch(prepared, NEW_TOKENS, NullRecorder(session.device))
        with session.repeat_decode(lambda again: [again() for _ in range(REPEATS)]):
            session.generate_batch(prepared, NEW_TOKENS, NullRecorder(session.device))
        events = session.compile_summary().events
    finally:
        session.close()
        torch._dynamo.reset()
    assert [(e.function, e.recompile) for e in events] == [("decode", False)]


def test_a_cache_that_cannot_rewind_is_named() -> None:
    class SlidingLayer:
        pass

    cache = types.SimpleNamespace(layers=[SlidingLayer()])
    assert "SlidingLayer" in str(rewind_blocker(cache))
    assert "not transformers' cache layers" in str(rewind_blocker(object()))
    assert DecodeNotRepeatable("why").reason == "why"

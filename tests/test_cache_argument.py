"""The KV cache under either of its names: transformers 5.17-5.23 say `past_key_values`, 5.24 on say `cache`.

These tests run on whichever release is installed; CI runs them on the newest and on 5.17."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.models.cache_argument import (
    CACHE_FIELD,
    CACHE_NAMES,
    accepted_cache,
    cache_kwargs,
    causal_lm_output,
    forward_cache_argument,
    output_cache,
)
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")


def _release() -> tuple[int, int]:
    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int(minor)


def test_the_field_is_the_one_the_installed_release_declares() -> None:
    declared = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    assert CACHE_FIELD in declared
    assert ("cache" if _release() >= (5, 24) else "past_key_values") == CACHE_FIELD


def test_a_forward_names_its_cache_newest_first() -> None:
    def new(input_ids: Any, cache: Any = None) -> None: ...
    def old(input_ids: Any, past_key_values: Any = None) -> None: ...
    def both(input_ids: Any, cache: Any = None, past_key_values: Any = None) -> None: ...
    def neither(input_ids: Any, state: Any = None) -> None: ...

    assert [forward_cache_argument(f) for f in (new, old, both, neither)] == ["cache", "past_key_values", "cache", None]
    assert CACHE_NAMES == ("cache", "past_key_values")


def test_outputs_carry_the_cache_under_either_name() -> None:
    marker = object()
    assert output_cache(causal_lm_output(torch.zeros(1), marker)) is marker
    assert cache_kwargs(marker) == {CACHE_FIELD: marker}

    @dataclasses.dataclass
    class RemoteOutput:  # a remote-code output class of its own, with the old name
        logits: Any
        past_key_values: Any

    assert output_cache(RemoteOutput(logits=None, past_key_values=marker)) is marker
    assert output_cache(object()) is None


def test_our_forwards_take_the_cache_by_either_name_but_not_both() -> None:
    assert accepted_cache(cache=1) == 1 and accepted_cache(past_key_values=2) == 2 and accepted_cache() is None
    with pytest.raises(ValueError, match="not both"):
        accepted_cache(cache=1, past_key_values=2)


@pytest.fixture(scope="module")
def v1_model() -> Any:
    return InferenceSession.load(compose_config("stage1", "model=deepseek_ocr_tiny").model, CPU).model


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_the_v1_model_decodes_the_same_with_either_name(v1_model: Any, name: str) -> None:
    """Our DeepSeek-OCR v1 forward takes the cache as `cache` and as `past_key_values`: the same logits as a
    step that is given the cache under the installed release's name."""
    ids = torch.tensor([[1, 5, 9, 13]])
    with torch.inference_mode():
        first = v1_model(input_ids=ids, use_cache=True)
        step = v1_model(input_ids=ids[:, -1:], use_cache=True, **{name: output_cache(first)})
        again = v1_model(input_ids=ids, use_cache=True)
        reference = v1_model(input_ids=ids[:, -1:], use_cache=True, **cache_kwargs(output_cache(again)))
        no_cache = v1_model(input_ids=ids[:, -1:], use_cache=True)
    assert output_cache(step).get_seq_length() == 5
    torch.testing.assert_close(step.logits, reference.logits)
    assert not torch.allclose(step.logits, no_cache.logits)  # the cache was used, not dropped


def test_the_loop_uses_the_name_each_model_declares(tiny_session: Any, v1_model: Any) -> None:
    """The native OCR-2 class declares the installed release's name; our v1 forward declares both (newest used)."""
    assert forward_cache_argument(tiny_session.model.forward) == CACHE_FIELD
    assert forward_cache_argument(v1_model.forward) == "cache"


def test_the_loop_passes_no_deprecated_name(caplog: pytest.LogCaptureFixture) -> None:
    """A generic HF model driven by the loop: no deprecation warning about the cache's name (5.24 warns on every
    call that uses `past_key_values`)."""
    session = InferenceSession.load(compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model, CPU)
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            prepared = session.prepare(bundled_prompts_dir() / "question_short.txt")
            tokens = session.generate(prepared, 3, StageRecorder(CPU, nvtx=False))
    finally:
        session.close()
    assert len(tokens) == 3
    assert not [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]

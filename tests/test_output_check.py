"""Output check: each run against an eager dynamic-cache reference of the same input (first departing token index,
max abs difference of the prefill logits), the reference run once per input."""

from __future__ import annotations

import pytest
import torch

from llm_perf_opt.session.output_check import (
    OutputCheck,
    ReferenceOutput,
    compare_outputs,
    first_departure,
)
from llm_perf_opt.session.runtime import RuntimeSettings

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

NEW_TOKENS = 4


def test_first_departure() -> None:
    assert first_departure([1, 2, 3], [1, 2, 3]) is None
    assert first_departure([1, 9, 3], [1, 2, 3]) == 1
    assert first_departure([7, 2, 3], [1, 2, 3]) == 0
    assert first_departure([1, 2], [1, 2, 3]) == 2  # one ends early
    assert first_departure([], []) is None


def test_compare_outputs() -> None:
    reference = ReferenceOutput(token_ids=(5, 6, 7), prefill_logits=torch.tensor([0.0, 1.0, -2.0]))
    check = compare_outputs((5, 6, 8), torch.tensor([0.5, 1.0, -2.25]), reference)
    assert check == OutputCheck(first_departure=2, compared_tokens=3, prefill_logits_max_abs_diff=0.5)
    assert not check.identical_tokens
    same = compare_outputs((5, 6, 7), torch.tensor([0.0, 1.0, -2.0], dtype=torch.bfloat16), reference)
    assert same.identical_tokens and same.prefill_logits_max_abs_diff == 0.0


def test_static_runs_are_checked_against_the_eager_reference(tiny_session, page_images) -> None:
    session = tiny_session.with_runtime(RuntimeSettings(kv_cache="static"))  # output_check=auto: checked
    try:
        first = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        second = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        assert len(session.references) == 1  # one reference per input, kept
        for m in (first, second):
            check = m.output_check
            assert check is not None
            assert check.first_departure is None
            assert check.compared_tokens == NEW_TOKENS
            assert 0.0 <= check.prefill_logits_max_abs_diff < 1e-3  # fp32 on the CPU: the same sums, other order
        reference = session.references.get((str(page_images["small"]), NEW_TOKENS), lambda: pytest.fail("rerun"))
        assert reference.token_ids == first.token_ids
        assert reference.prefill_logits.shape == (tiny_session.model.config.text_config.vocab_size,)
    finally:
        session.close()


@pytest.mark.slow
def test_a_departing_run_is_reported(tiny_session, page_images) -> None:
    session = tiny_session.with_runtime(RuntimeSettings(output_check="always"))
    try:
        measured = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        assert measured.output_check is not None
        assert measured.output_check.first_departure is None
        assert measured.output_check.prefill_logits_max_abs_diff == 0.0  # the reference is this very runtime
        # a reference that departs at token 2 and whose logits are all 1 higher
        key = (str(page_images["small"]), NEW_TOKENS)
        kept = session.references.get(key, lambda: pytest.fail("rerun"))
        tokens = list(kept.token_ids)
        tokens[2] += 1
        session.references._kept[key] = ReferenceOutput(tuple(tokens), kept.prefill_logits + 1.0)
        check = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False).output_check
        assert check is not None
        assert check.first_departure == 2
        assert check.prefill_logits_max_abs_diff == pytest.approx(1.0)
    finally:
        session.close()


def test_eager_reference_runtime_checks_nothing_by_default(tiny_session, page_images) -> None:
    assert tiny_session.runtime.is_reference
    assert tiny_session.run_image(page_images["small"], 2, nvtx=False).output_check is None
    never = tiny_session.with_runtime(RuntimeSettings(kv_cache="static", output_check="never"))
    try:
        assert never.run_image(page_images["small"], 2, nvtx=False).output_check is None
    finally:
        never.close()

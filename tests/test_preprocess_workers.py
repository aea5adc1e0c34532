"""Preprocessing a batch on threads (`runtime.preprocess_workers`): the same prepared inputs and tokens as one input
after the other, each input's preprocess time an equal share of the batch's; the setting checked and labelled."""

from __future__ import annotations

import pytest
import torch

from helpers import sample_pages
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession
from llm_perf_opt.settings_schema import check_config

CPU = torch.device("cpu")


def test_threads_prepare_the_same_inputs_and_share_the_batch_time(v1_session: InferenceSession) -> None:
    one_by_one = v1_session.with_runtime(RuntimeSettings(batch_size=3))
    threaded = v1_session.with_runtime(RuntimeSettings(batch_size=3, preprocess_workers=3))
    try:
        alone, _ = one_by_one._prepare_batch(sample_pages())
        together, _ = threaded._prepare_batch(sample_pages())
        plain = one_by_one.run_batch(sample_pages(), 2, nvtx=False)
        pooled = threaded.run_batch(sample_pages(), 2, nvtx=False)
    finally:
        one_by_one.close()
        threaded.close()
    for (a, _), (b, _) in zip(alone, together, strict=True):
        assert a.views == b.views and a.prompt_tokens == b.prompt_tokens
        for key, value in a.model_inputs.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(b.model_inputs[key], value, rtol=0, atol=0)
    assert len({ms for _, ms in together}) == 1 and together[0][1] > 0  # one share each
    assert [p.token_ids for p in pooled.pages] == [p.token_ids for p in plain.pages]
    assert pooled.preprocess_ms == pytest.approx(3 * pooled.pages[0].preprocess_ms)


def test_preprocess_workers_is_checked_and_labelled() -> None:
    cfg = compose_config("stage1", "model=deepseek_ocr_tiny", "runtime.preprocess_workers=8", "run.batch_size=4")
    settings = RuntimeSettings.from_nodes(stage1_nodes(cfg))
    assert settings.preprocess_workers == 8
    assert "preprocessing on 8 threads" in settings.label
    assert "threads" not in RuntimeSettings(batch_size=4, preprocess_workers=1).label
    with pytest.raises(UserError, match=r"runtime.preprocess_workers"):
        check_config(compose_config("stage1", "runtime.preprocess_workers=-1"))

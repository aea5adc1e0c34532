"""Batched vision on the GPU (`runtime.batch_vision`): the full-size DeepSeek-OCR v1 (random weights, bf16) at batch
4 of pages of different crop grids gives each page the embeddings and tokens of its vision run alone, and the
bounded profiled pass runs with it. Each test takes well under a minute on an H100; they skip without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.instruments.torch_profiler import profile_image
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import DeepSeekOCRSession

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NEW_TOKENS = 6
#: bf16 tolerances against each page's vision run alone: the same products summed in other orders (batched GEMMs
#: and attention kernels tile differently), through SAM's 12 and CLIP's 24 layers. Embeddings: relative Frobenius
#: error; prefill logits: max |difference| at the last prompt position (random-weight logits span about ±5).
EMBEDDING_REL_TOL = 2e-2
LOGIT_ABS_TOL = 0.25
#: Gundam crop grids 2x3 (6 tiles), 1x1 square (no tiles), a long receipt (its own grid), the A4 page again.
PAGES = ("page_portrait.png", "slide_square.png", "receipt_long.png", "page_portrait.png")


@pytest.fixture(scope="module")
def v1_bf16() -> DeepSeekOCRSession:
    cfg = compose_config("stage1", "model=deepseek_ocr", "model.dtype=bfloat16")
    return DeepSeekOCRSession.load(cfg.model, torch.device("cuda", 0))


def _pages() -> list[Path]:
    return [bundled_samples_dir() / name for name in PAGES]


def test_batched_vision_matches_per_page_vision_full_size_bf16(v1_bf16: DeepSeekOCRSession) -> None:
    prepared = [v1_bf16.prepare(p) for p in _pages()]
    assert len({p.tiles for p in prepared}) >= 2  # pages of different tile counts in one batch
    with torch.inference_mode():
        alone = [v1_bf16.adapter.embed_prompt(v1_bf16.model, p) for p in prepared]
        together = v1_bf16.adapter.embed_prompts(v1_bf16.model, prepared)
    assert together is not None
    for one, batched in zip(alone, together, strict=True):
        assert one is not None and batched.shape == one.shape
        error = (batched.float() - one.float()).norm() / one.float().norm()
        assert error < EMBEDDING_REL_TOL
    runs = {}
    for batch_vision in (False, True):
        runtime = RuntimeSettings(kv_cache="static", batch_size=4, batch_vision=batch_vision, output_check="always")
        session = v1_bf16.with_runtime(runtime)
        try:
            runs[batch_vision] = session.run_batch(_pages(), NEW_TOKENS, nvtx=False)
        finally:
            session.close()
    per_page, batched_run = runs[False], runs[True]
    assert batched_run.stage_calls[vocab.VISION_SAM] == 2  # the global views in one call, every tile in another
    assert per_page.stage_calls[vocab.VISION_SAM] > 2
    # the same decoder batch either way: only the vision's rounding differs
    assert [p.token_ids for p in batched_run.pages] == [p.token_ids for p in per_page.pages]
    for page in batched_run.pages:  # each page against itself alone: batch 1, eager, dynamic cache, its own vision
        check = page.output_check
        assert check is not None and check.prefill_logits_max_abs_diff < LOGIT_ABS_TOL


def test_bounded_profiled_pass_with_batched_vision(v1_bf16: DeepSeekOCRSession) -> None:
    session = v1_bf16.with_runtime(RuntimeSettings(kv_cache="static", batch_size=4, batch_vision=True))
    off = {"record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False}
    try:
        table = profile_image(session, _pages(), decode_steps=1, trace_path=None, max_vision_inputs=2, **off)
    finally:
        session.close()
    assert (table.inputs, table.vision_inputs) == (4, 2)
    sam = sum(row.calls for row in table.by_stage.get(vocab.VISION_SAM, ()))
    assert sam > 0  # the first two pages' views, batched, under the profiler
    assert sum(row.calls for row in table.by_stage.get(vocab.DECODE, ())) > 0

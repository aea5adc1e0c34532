"""No host synchronisation inside a decode step: the loop passes no attention mask when nothing is padded, so
transformers has no mask to inspect on the host (before, `fast_all(mask)` in masking_utils read it every step).
On the CPU a dispatch mode lists the ops that read tensor data on the host; tests/test_gpu.py checks the same on a
GPU with torch.cuda.set_sync_debug_mode("error")."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from helpers import host_reads
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.models.cache_argument import cache_kwargs, output_cache
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

CPU = torch.device("cpu")
RUNTIMES = [RuntimeSettings(), RuntimeSettings(kv_cache="static")]


@pytest.fixture(scope="module")
def qwen_session() -> InferenceSession:
    return InferenceSession.load(compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model, CPU)


def decode_step_reads(session: InferenceSession, path: Path, runtime: RuntimeSettings) -> list[list[str]]:
    """Host reads inside each decode step of a 4-token pass under `runtime`."""
    spies: list[Any] = []

    def around(step: int) -> Any:
        if step == 0:
            return nullcontext()
        spies.append(host_reads())
        return spies[-1]

    run = session.with_runtime(runtime)
    try:
        prepared = run.prepare(path)
        run.generate(prepared, 4, StageRecorder(CPU, nvtx=False), around_step=around)
    finally:
        run.close()
    return [spy.ops for spy in spies]


def test_the_detector_sees_the_mask_check_of_a_masked_step(tiny_session, page_images) -> None:
    """Control: a decode step given a 2-D attention mask makes transformers read it on the host."""
    prepared = tiny_session.prepare(page_images["small"])
    with torch.inference_mode():
        out = tiny_session.model(**prepared.model_inputs, use_cache=True, logits_to_keep=1)
        mask = torch.ones((1, prepared.prompt_tokens + 1), dtype=torch.long)
        with host_reads() as spy:
            tiny_session.model(
                input_ids=out.logits[:, -1].argmax(-1)[:, None],
                attention_mask=mask,
                **cache_kwargs(output_cache(out)),
                use_cache=True,
            )
    assert spy.ops  # e.g. aten.is_nonzero from masking_utils.fast_all


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.kv_cache)
def test_moe_decode_steps_read_nothing_on_the_host(tiny_session, page_images, runtime) -> None:
    assert decode_step_reads(tiny_session, page_images["two_tiles"], runtime) == [[], [], []]


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.kv_cache)
def test_dense_decode_steps_read_nothing_on_the_host(qwen_session, runtime) -> None:
    prompt = bundled_prompts_dir() / "question_short.txt"
    assert decode_step_reads(qwen_session, prompt, runtime) == [[], [], []]


def test_eager_experts_do_read_on_the_host(compose_model, page_images) -> None:
    """What the record above rules out: transformers' eager experts loop picks its experts on the host."""
    session = InferenceSession.load(
        compose_model("model=deepseek_ocr2_tiny", "model.experts_implementation=eager"), CPU
    )
    reads = decode_step_reads(session, page_images["small"], RuntimeSettings())
    assert all(any("nonzero" in op for op in step) for step in reads)


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.kv_cache)
def test_decode_steps_get_no_attention_mask(tiny_session, page_images, runtime) -> None:
    calls: list[dict[str, Any]] = []
    handle = tiny_session.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append(dict(kwargs)), with_kwargs=True
    )
    run = tiny_session.with_runtime(attrs.evolve(runtime, output_check="never"))  # no reference pass
    try:
        run.run_image(page_images["small"], 4, nvtx=False)
    finally:
        handle.remove()
        run.close()
    assert len(calls) == 4
    assert "pixel_values" in calls[0] and calls[0].get("attention_mask") is None
    for decode in calls[1:]:
        assert decode["input_ids"].shape == (1, 1)
        assert decode.get("attention_mask") is None
        assert decode.get("position_ids") is None  # the cache says where the token goes

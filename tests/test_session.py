"""DeepSeekOCRSession on the tiny model (fp32, CPU): the explicit prefill/decode loop, stage timing, and the
device / dtype / checkpoint checks that turn bad settings into UserErrors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.session import (
    DeepSeekOCRSession,
    resolve_device,
    resolve_dtype,
)

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

NEW_TOKENS = 4
VISION = ("vision/sam", "vision/encoder", "vision/projector")


@pytest.fixture(scope="module")
def runs(tiny_session, page_images):
    """run_image of a page without tiles and one with 2 tiles, NEW_TOKENS tokens each (runs the model twice)."""
    return {page: tiny_session.run_image(page_images[page], NEW_TOKENS, nvtx=True) for page in ("small", "two_tiles")}


def hf_greedy_ids(session, prepared, new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = session.model.generate(
            **prepared.model_inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    return [int(t) for t in out[0, prepared.prompt_tokens :]]


def test_tiny_session_is_fp32_cpu_with_the_default_backends(tiny_session) -> None:
    assert tiny_session.device == torch.device("cpu")
    assert tiny_session.dtype == torch.float32
    assert tiny_session.loaded.weights == "random"
    assert tiny_session.loaded.tokenizer is None
    info = tiny_session.adapter.describe(tiny_session.model)
    assert info.attn_implementation == "sdpa"
    assert info.experts_implementation == "grouped_mm"
    assert info.parameters == sum(p.numel() for p in tiny_session.model.parameters())
    assert tiny_session.vision_stages == VISION


@pytest.mark.parametrize("page", ["small", "two_tiles"])
def test_explicit_loop_matches_hf_generate(tiny_session, page_images, runs, page) -> None:
    prepared = tiny_session.prepare(page_images[page])
    assert prepared.tiles == (2 if page == "two_tiles" else 0)
    measured = runs[page]
    assert measured.tiles == prepared.tiles
    assert measured.prompt_tokens == prepared.prompt_tokens
    assert list(measured.token_ids) == hf_greedy_ids(tiny_session, prepared, NEW_TOKENS)


@pytest.mark.parametrize(("page", "views"), [("small", 1), ("two_tiles", 2)])
def test_run_image_stage_accounting(runs, page, views) -> None:
    m = runs[page]
    assert len(m.token_ids) == NEW_TOKENS  # the first comes from prefill
    assert len(m.decode_step_ms) == NEW_TOKENS - 1
    assert all(ms > 0 for ms in m.decode_step_ms)
    assert m.stage_calls[vocab.PREFILL] == 1
    assert m.stage_calls[vocab.DECODE] == 1
    assert m.stage_calls[vocab.DECODE_STEP] == NEW_TOKENS - 1
    # Vision runs once for the global view and, with tiles, once more for the batch of tiles.
    assert {s: m.stage_calls[s] for s in VISION} == dict.fromkeys(VISION, views)
    vision_ms = sum(m.stage_ms[s] for s in VISION)
    assert 0 < vision_ms <= m.prefill_ms
    assert m.stage_ms[vocab.DECODE_STEP] == pytest.approx(sum(m.decode_step_ms))
    assert m.decode_ms >= sum(m.decode_step_ms)
    assert m.preprocess_ms > 0
    assert m.ttft_ms == pytest.approx(m.preprocess_ms + m.prefill_ms)
    assert m.peak_memory_bytes is None  # CPU
    assert m.image_tokens == 256 + 144 * m.tiles + 1


def test_single_token_has_no_decode_spans(tiny_session, page_images, runs) -> None:
    m = tiny_session.run_image(page_images["small"], 1, nvtx=False)
    assert len(m.token_ids) == 1
    assert m.token_ids[0] == runs["small"].token_ids[0]  # greedy and deterministic
    assert m.decode_step_ms == ()
    assert m.decode_ms == 0.0
    assert vocab.DECODE not in m.stage_calls
    assert vocab.DECODE_STEP not in m.stage_calls
    assert m.stage_calls[vocab.PREFILL] == 1


def test_prepared_inputs_to_casts_only_floating_tensors(tiny_session, page_images) -> None:
    prepared = tiny_session.prepare(page_images["two_tiles"])
    moved = prepared.to(torch.device("cpu"), torch.bfloat16)
    assert moved.model_inputs["pixel_values"].dtype == torch.bfloat16
    assert moved.model_inputs["pixel_values_local"].dtype == torch.bfloat16
    assert moved.input_ids.dtype == torch.long
    assert moved.model_inputs["num_local_patches"] == [2]
    assert prepared.model_inputs["pixel_values"].dtype == torch.float32  # the original is unchanged


# ---- devices, dtypes, loading ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["cpu", " CPU "])
def test_resolve_device_cpu(spec) -> None:
    assert resolve_device(spec) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_resolve_device_auto_without_gpu_is_cpu() -> None:
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0"])
def test_resolve_device_cuda_without_gpu_names_the_fix(spec) -> None:
    with pytest.raises(UserError) as info:
        resolve_device(spec)
    assert f"device={spec}" in info.value.problem
    assert "device=cpu" in info.value.fix
    assert "device=cpu" in str(info.value)


def test_resolve_device_unknown_name() -> None:
    with pytest.raises(UserError, match=r"device=tpu is not a device name"):
        resolve_device("tpu")


def test_resolve_device_gpu_index_out_of_range(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match=r"cuda:0") as info:
        resolve_device("cuda:3")
    assert "GPU 3" in info.value.problem
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


def test_resolve_device_malformed_index_is_a_user_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError):
        resolve_device("cuda:x")


def test_resolve_dtype() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype(None, cpu) is torch.float32
    assert resolve_dtype("auto", cpu) is torch.float32
    assert resolve_dtype(None, gpu) is torch.bfloat16
    assert resolve_dtype("bf16", cpu) is torch.bfloat16
    assert resolve_dtype("FP16", gpu) is torch.float16
    assert resolve_dtype("float32", gpu) is torch.float32
    with pytest.raises(UserError, match=r"model\.dtype=int8") as info:
        resolve_dtype("int8", cpu)
    assert "bfloat16" in info.value.fix


def test_require_whole() -> None:
    assert require_whole("run.repeats", "3", 1) == 3
    assert require_whole("run.warmup", 0, 0) == 0
    with pytest.raises(UserError, match=r"run\.repeats=0 is out of range"):
        require_whole("run.repeats", 0, 1)
    with pytest.raises(UserError, match=r"not a whole number"):
        require_whole("run.repeats", "many", 1)
    with pytest.raises(UserError, match=r"not a whole number"):
        require_whole("run.repeats", True, 1)


def test_model_path_without_checkpoint_is_a_user_error(tiny_model_cfg, tmp_path) -> None:
    cfg = OmegaConf.merge(tiny_model_cfg, {"path": str(tmp_path)})
    with pytest.raises(UserError, match=r"config\.json") as info:
        DeepSeekOCRSession.load(cfg, torch.device("cpu"))
    assert f"model.path={tmp_path}" in info.value.problem
    assert "model.path" in info.value.fix


@pytest.mark.parametrize("model", ["model=deepseek_ocr_tiny", "model=deepseek_ocr2_tiny"])
def test_model_path_that_does_not_exist_says_so(model: str, compose_model, tmp_path) -> None:
    missing = tmp_path / "no_checkpoint_here"
    with pytest.raises(UserError, match=r"model\.path=.*no_checkpoint_here does not exist") as info:
        make_adapter(compose_model(model, f"model.path={missing}")).checkpoint_path()
    assert "leave model.path unset" in info.value.fix
    a_file = tmp_path / "weights.safetensors"
    a_file.write_bytes(b"")
    with pytest.raises(UserError, match=r"weights\.safetensors is a file, not a folder"):
        make_adapter(compose_model(model, f"model.path={a_file}")).checkpoint_path()
    assert make_adapter(compose_model(model, f"model.path={tmp_path}")).checkpoint_path() == str(tmp_path)


def test_unknown_adapter_is_a_user_error(tiny_model_cfg) -> None:
    with pytest.raises(UserError, match=r"model\.adapter=no_such_model") as info:
        make_adapter({"adapter": "no_such_model"})
    assert "deepseek_ocr2" in info.value.problem  # the known adapters are listed
    cfg = OmegaConf.merge(tiny_model_cfg, {"adapter": "no_such_model"})
    with pytest.raises(UserError):
        DeepSeekOCRSession.load(cfg, torch.device("cpu"))


def test_the_deepseek_session_runs_deepseek_models_only(compose_model: Any) -> None:
    from llm_perf_opt.errors import UserError
    from llm_perf_opt.session.session import DeepSeekOCRSession, InferenceSession

    assert issubclass(DeepSeekOCRSession, InferenceSession)
    cfg = compose_model("model=hf", "model.config=qwen2_tiny")
    with pytest.raises(UserError, match=r"DeepSeekOCRSession runs DeepSeek-OCR models.*InferenceSession"):
        DeepSeekOCRSession.load(cfg, torch.device("cpu"))

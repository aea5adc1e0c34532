"""GPU tests: run on the device machine (`pytest -m gpu`); they skip where CUDA is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import greedy_by_recomputation, require_tools, run_cli
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.session.session import DeepSeekOCRSession

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def tiny_cuda_fp32() -> DeepSeekOCRSession:
    cfg = compose_config("stage1", "model=deepseek_ocr2_tiny", "model.dtype=float32")
    return DeepSeekOCRSession.load(cfg.model, torch.device("cuda", 0))


def test_cuda_events_time_nested_spans() -> None:
    rec = StageRecorder(torch.device("cuda", 0))
    a = torch.randn(2048, 2048, device="cuda")
    with rec.span("outer"), rec.span("inner"):
        for _ in range(10):
            a = a @ a / 2048
    spans = dict(rec.spans_ms())
    assert rec.uses_cuda_events
    assert spans["outer"] >= spans["inner"] > 0


def test_explicit_loop_matches_generate_on_gpu(tiny_cuda_fp32: DeepSeekOCRSession) -> None:
    image = bundled_samples_dir() / "slide_square.png"
    measured = tiny_cuda_fp32.run_image(image, 6)
    prepared = tiny_cuda_fp32.prepare(image)
    reference = tiny_cuda_fp32.model.generate(
        **prepared.model_inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False
    )
    assert list(measured.token_ids) == reference[0, prepared.prompt_tokens :].tolist()
    assert measured.peak_memory_bytes and measured.peak_memory_bytes > 0
    assert measured.prefill_ms >= sum(measured.stage_ms[s] for s in tiny_cuda_fp32.vision_stages)


def test_v1_cached_decoding_matches_recomputation_on_gpu() -> None:
    cfg = compose_config("stage1", "model=deepseek_ocr_tiny", "model.dtype=float32")
    session = DeepSeekOCRSession.load(cfg.model, torch.device("cuda", 0))
    prepared = session.prepare(bundled_samples_dir() / "page_portrait.png")  # Gundam: 2x3 tiles, 903 tokens
    cached = session.generate(prepared, 5, StageRecorder(session.device))
    recomputed = greedy_by_recomputation(session, prepared, 5)
    assert prepared.image_tokens == 903
    assert cached == recomputed


@pytest.mark.parametrize("model", ["deepseek_ocr2_tiny", "deepseek_ocr_tiny"])
def test_stage1_tiny_on_gpu_has_mfu(tmp_path: Path, model: str) -> None:
    out = tmp_path / "run"
    done = run_cli(
        "llm_perf_opt.cli.stage1",
        f"model={model}",
        "device=cuda",
        "run.repeats=3",
        "infer.max_new_tokens=4",
        "dataset.max_images=2",
        f"hydra.run.dir={out}",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["device"]["timing_method"].startswith("CUDA events")
    mfu = {r["stage"]: r for r in metrics["mfu"]}
    if metrics["device"]["name"].startswith("NVIDIA H1") or "H200" in metrics["device"]["name"]:
        assert mfu["prefill"]["peak"]["dtype_key"] == "bf16"
        assert 0 < mfu["prefill"]["mfu"] < 1
    assert metrics["operator_sort_key"] == "self_device_ms"
    assert metrics["top_operators"][0]["self_device_ms"] > 0
    # the GPU default's one warm-up pass per input, kept as that input's first pass and timed with CUDA events
    firsts = {r["image"]: r for r in metrics["first_passes"]}
    assert set(firsts) == {r["image"] for r in metrics["records"]}
    assert all(r["prefill_ms"] > 0 and r["decode_ms"] > 0 for r in firsts.values())


@pytest.mark.parametrize("model", ["deepseek_ocr2_tiny", "deepseek_ocr_tiny"])
def test_stage2_light_on_the_tiny_model(tmp_path: Path, model: str) -> None:
    require_tools("nsys", "ncu")
    out = tmp_path / "s2"
    done = run_cli(
        "llm_perf_opt.cli.stage2",
        f"model={model}",
        "infer.max_new_tokens=6",
        "dataset.max_images=1",
        f"hydra.run.dir={out}",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (
        "report.md",
        "kernels.md",
        "stakeholder_summary.md",
        "metrics.json",
        "env.json",
        "inputs.yaml",
        "config.yaml",
        "nsys/cmd.txt",
        "nsys/report.nsys-rep",
        "nsys/report.sqlite",
        "ncu/targets.json",
    ):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    stages = {s["stage"]: s for s in metrics["stages"]}
    assert stages["decode/step"]["instances"] == 5  # one timed pass, warm-up outside every stage
    assert stages["prefill"]["stage1_cuda_event_ms"] > 0
    assert metrics["ncu_kernels"], metrics["warnings"]
    assert json.loads((out / "run_status.json").read_text())["state"] == "complete"


def test_stage2_traces_compiled_decode_node_by_node(tmp_path: Path) -> None:
    """CUDA-graph decode under nsys (`--cuda-graph-trace=node`): the kernels a graph replays land in their decode
    step, so kernels per step and the GPU-busy fraction exist for compiled decode (and are fewer per step than a
    graph-free run would launch as separate host calls)."""
    require_tools("nsys")
    out = tmp_path / "s2-compiled"
    done = run_cli(
        "llm_perf_opt.cli.stage2",
        "model=deepseek_ocr_tiny",
        "model.dtype=bfloat16",
        "runtime.kv_cache=static",
        "runtime.compile=decode",
        "infer.max_new_tokens=6",
        "dataset.max_images=1",
        "pipeline.ncu.enable=false",
        f"hydra.run.dir={out}",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert "--cuda-graph-trace=node" in (out / "nsys/cmd.txt").read_text().splitlines()[0]  # the profile command
    step = {s["stage"]: s for s in metrics["stages"]}["decode/step"]
    assert step["instances"] == 5  # one timed pass; compilation and capture fell in the warm-up
    assert step["kernels"] >= 5  # replayed graph nodes counted inside the steps
    assert 0 < step["busy_fraction"] <= 1
    assert json.loads((out / "run_status.json").read_text())["state"] == "complete"


def test_stage2_profiles_a_batch(tmp_path: Path) -> None:
    """run.batch_size=2: one NVTX prefill range and one set of decode steps per batch pass; Stage 1's batch records
    are what the GPU times are checked against, and the bytes pass profiles the first whole batch."""
    require_tools("nsys", "ncu")
    out = tmp_path / "s2-batch"
    done = run_cli(
        "llm_perf_opt.cli.stage2",
        "model=deepseek_ocr_tiny",
        "run.batch_size=2",
        "run.fill_batches=true",
        "dataset.max_images=2",
        "infer.max_new_tokens=6",
        "pipeline.ncu.bytes_pass=true",  # light mode leaves it out (deep runs it)
        f"hydra.run.dir={out}",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    stages = {s["stage"]: s for s in metrics["stages"]}
    assert stages["prefill"]["instances"] == 1 and stages["decode/step"]["instances"] == 5  # one batch, one pass
    assert stages["vision/sam"]["instances"] == 4  # per input: its global view and its tiles
    ratio = stages["prefill"]["stage1_cuda_event_ms"] / stages["prefill"]["wall_ms"]
    assert 0.5 < ratio < 2  # the batch's own prefill, not the sum of its inputs' copies of it
    assert "the first batch (2 inputs)" in (out / "report.md").read_text()


# ---- issue 11: runtimes ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_cuda_bf16() -> DeepSeekOCRSession:
    """Tiny DeepSeek-OCR v1 in bf16 (grouped_mm experts run their CUDA kernel, as at full size)."""
    cfg = compose_config("stage1", "model=deepseek_ocr_tiny", "model.dtype=bfloat16")
    return DeepSeekOCRSession.load(cfg.model, torch.device("cuda", 0))


def _sync_errors(step: int) -> Any:
    """Around decode steps (step >= 1): any host synchronisation raises."""
    from contextlib import contextmanager, nullcontext

    @contextmanager
    def strict() -> Any:
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    return strict() if step >= 1 else nullcontext()


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_decode_steps_do_not_synchronise_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession, kv_cache: str) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    session = tiny_cuda_bf16.with_runtime(RuntimeSettings(kv_cache=kv_cache))
    try:
        prepared = session.prepare(bundled_samples_dir() / "page_portrait.png")
        tokens = session.generate(prepared, 6, StageRecorder(session.device), around_step=_sync_errors)
    finally:
        session.close()
    assert len(tokens) == 6


def test_top_two_pass_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession) -> None:
    """bf16 on the GPU: the top-two pass's tokens are the eager loop's, each the first of its two candidates."""
    prepared = tiny_cuda_bf16.prepare(bundled_samples_dir() / "page_portrait.png")
    top2 = tiny_cuda_bf16.top_two(prepared, 6)
    tokens = tiny_cuda_bf16.generate(prepared, 6, StageRecorder(tiny_cuda_bf16.device), reference=True)
    assert list(top2.tokens) == tokens and [first for first, _ in top2.ids] == tokens
    assert all(high >= low for high, low in top2.logits)


CUDA_GRAPHS_DECODE = {"kv_cache": "static", "compile": "decode", "compile_mode": "reduce-overhead"}


@pytest.fixture
def fresh_dynamo() -> Any:
    """Compiled-step tests start without graphs compiled by earlier tests (each loop is its own guard set)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_decode_with_cuda_graphs_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession, fresh_dynamo: Any) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    session = tiny_cuda_bf16.with_runtime(RuntimeSettings(**CUDA_GRAPHS_DECODE, static_cache_len=1024))
    image = bundled_samples_dir() / "slide_square.png"
    try:
        warm = [session.run_image(image, 8, nvtx=False) for _ in range(3)]  # compilation, then graph capture
        timed = session.run_image(image, 8)
        summary = session.compile_summary()
    finally:
        session.close()
    assert warm[0].compile_events and warm[0].compile_events[0].function == "decode"
    assert warm[0].compile_events[0].shape == (1, 1, 1024)
    assert timed.compile_events == ()  # steady state: nothing compiles in a timed pass
    assert summary.recompiles == 0
    assert summary.cudagraph_skips == 0  # inductor captured the step as a CUDA graph
    assert len(timed.token_ids) == 8
    assert len(timed.decode_step_ms) == 7 and all(ms > 0 for ms in timed.decode_step_ms)  # events outside the graph
    assert timed.routing is not None and timed.routing.steps == 7  # the routers' indices came out of the graph
    check = timed.output_check
    assert check is not None and check.compared_tokens == 8  # bf16 may depart after a near-tie: recorded, not failed
    assert check.prefill_logits_max_abs_diff < 1.0  # the prefill is eager in both


def test_compiled_decode_steps_do_not_synchronise_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession, fresh_dynamo: Any) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    session = tiny_cuda_bf16.with_runtime(RuntimeSettings(**CUDA_GRAPHS_DECODE, static_cache_len=1024))
    try:
        prepared = session.prepare(bundled_samples_dir() / "slide_square.png")
        for _ in range(3):  # compile and capture first: those may synchronise
            session.generate(prepared, 6, StageRecorder(session.device))
        tokens = session.generate(prepared, 6, StageRecorder(session.device), around_step=_sync_errors)
    finally:
        session.close()
    assert len(tokens) == 6


def test_compiled_prefill_and_decode_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession, fresh_dynamo: Any) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    runtime = RuntimeSettings(kv_cache="static", compile="prefill_decode", compile_mode="reduce-overhead")
    session = tiny_cuda_bf16.with_runtime(runtime)
    image = bundled_samples_dir() / "page_portrait.png"
    try:
        runs = [session.run_image(image, 6, nvtx=False) for _ in range(4)]
    finally:
        session.close()
    assert {e.function for e in runs[0].compile_events} == {"prefill", "decode"}
    assert runs[-1].compile_events == ()
    assert runs[-1].stage_calls["vision/sam"] == 2  # vision eager, timed by its hooks
    assert runs[-1].output_check is not None


def test_vision_compiled_with_cuda_graphs_on_gpu(tiny_cuda_bf16: DeepSeekOCRSession, fresh_dynamo: Any) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    session = tiny_cuda_bf16.with_runtime(RuntimeSettings(compile_vision="reduce-overhead"))
    image = bundled_samples_dir() / "page_portrait.png"
    try:
        runs = [session.run_image(image, 6, nvtx=False) for _ in range(4)]
    finally:
        session.close()
    assert {e.function for e in runs[0].compile_events} == set(session.vision_stages)
    assert runs[-1].compile_events == ()
    last = runs[-1]
    assert last.stage_calls["vision/sam"] == 2 and last.stage_ms["vision/sam"] > 0  # tiles and global view, timed
    assert last.output_check is not None and last.output_check.prefill_logits_max_abs_diff < 0.1  # bf16 rounding
    assert all(len(r.token_ids) == 6 for r in runs)


def test_batch_of_pages_on_gpu(tiny_cuda_fp32: DeepSeekOCRSession) -> None:
    from llm_perf_opt.session.runtime import RuntimeSettings

    pages = [bundled_samples_dir() / name for name in ("slide_square.png", "page_portrait.png", "receipt_long.png")]
    session = tiny_cuda_fp32.with_runtime(RuntimeSettings(kv_cache="static", batch_size=3))
    try:
        m = session.run_batch(pages, 6)
    finally:
        session.close()
    assert m.batch_size == 3 and len({p.prompt_tokens for p in m.pages}) > 1
    assert m.peak_memory_bytes and m.peak_memory_bytes > 0
    assert m.aggregate_decode_tokens_per_s and m.aggregate_decode_tokens_per_s > 0
    for page in m.pages:
        assert len(page.token_ids) == 6
        assert page.output_check is not None
        assert page.output_check.prefill_logits_max_abs_diff < 1e-2  # fp32: the same sums in another order

"""GPU tests of the memory and energy passes on the tiny model (`pytest -m gpu`); they skip without CUDA, and the
energy test skips without nvidia-ml-py's pynvml."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.config_schema import EnergySchema, MemorySchema
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.instruments.energy import EnergyMeter
from llm_perf_opt.instruments.memory import memory_pass
from llm_perf_opt.instruments.timing import NullRecorder
from llm_perf_opt.measure.memory_figures import breakdown, fit_prediction, resident_other
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import IDLE_SLEEP, MemoryBreakdown, MemoryPass
from llm_perf_opt.report.memory_energy import vision_peak_caveat
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

MIB = 2**20

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PAGE = bundled_samples_dir() / "slide_square.png"


@pytest.fixture(scope="module")
def tiny() -> InferenceSession:
    cfg = compose_config("stage1", "model=deepseek_ocr2_tiny")
    session = InferenceSession.load(cfg.model, torch.device("cuda", 0))
    session.run_image(PAGE, 4, nvtx=False)  # warm
    return session


def test_the_memory_breakdown_sums_to_the_measured_peak(tiny: InferenceSession) -> None:
    outcome = memory_pass(tiny, (PAGE,), "slide_square.png", 4, MemorySchema(snapshot_max_mib=512))
    measured = outcome.measured
    assert outcome.snapshot is not None and measured.snapshot == "memory/snapshot.pickle"
    peaks = {p.stage: p for p in measured.peaks}
    assert {vocab.E2E, vocab.PREFILL, vocab.DECODE, vocab.DECODE_STEP} <= set(peaks)
    whole = peaks[vocab.E2E]
    assert whole.peak_allocated_bytes >= max(p.peak_allocated_bytes for p in measured.peaks)
    # the whole pass peaks in prefill, before the cache holds much; the decode's peak holds the cache
    assert peaks[vocab.DECODE].kv_bytes > 0 and measured.weights_bytes > 0
    assert measured.total_memory_bytes == torch.cuda.get_device_properties(0).total_memory
    other = resident_other(measured)
    parts = [breakdown(p, measured.weights_bytes, other, measured.preexisting_kv_bytes) for p in measured.peaks]
    for part in parts:
        assert abs(part.parts_sum - part.peak_allocated_bytes) <= 0.02 * part.peak_allocated_bytes
        assert part.activations_bytes >= 0, part
    top = next(b for b in parts if b.stage == vocab.E2E)
    fit = fit_prediction(
        measured.total_memory_bytes, measured.outside_allocator_bytes, top, 1, measured.kv_bytes_per_token
    )
    assert fit.max_batch is not None and fit.max_batch >= 1
    assert fit.max_context_tokens is not None and fit.max_context_tokens > measured.context_tokens


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="needs nvidia-ml-py (pynvml)")
def test_energy_figures_are_positive(tiny: InferenceSession) -> None:
    meter = EnergyMeter.open(tiny.device, EnergySchema(loop_seconds=1.0, idle_seconds=1.0))
    try:
        meter.loops(tiny, (PAGE,), 4)
        measured = meter.finish("slide_square.png", 1, 4)  # idle power over a sleep
    finally:
        meter.close()
    assert measured.idle_source == IDLE_SLEEP and measured.whole is None  # both stages looped alone
    assert measured.idle.millijoules > 0
    assert measured.prefill is not None and measured.prefill.millijoules > 0
    assert measured.decode is not None and measured.decode.millijoules > 0
    assert measured.decode.seconds >= 1.0 and measured.decode.iterations >= 1


def test_decode_repeated_under_cuda_graphs_gives_the_same_tokens(tiny: InferenceSession) -> None:
    """The decode-only loop's repeats replay the captured decode step with the static cache rewound in place."""
    graphs = tiny.with_runtime(RuntimeSettings(kv_cache="static", compile="decode", compile_mode="reduce-overhead"))
    try:
        prepared = [graphs.prepare(PAGE)]
        plain = graphs.generate_batch(prepared, 6, NullRecorder(graphs.device))
        repeats: list[int] = []

        def repeater(again: Callable[[], None]) -> None:
            for _ in range(3):
                again()
                repeats.append(1)

        with graphs.repeat_decode(repeater):
            repeated = graphs.generate_batch(prepared, 6, NullRecorder(graphs.device))
        events = graphs.compile_summary().events
    finally:
        graphs.close()
    assert len(repeats) == 3 and repeated == plain
    assert not any(e.recompile for e in events)  # the repeats replay the step the pass compiled


def test_a_gpu_stage1_run_writes_both_sections(tmp_path: Path) -> None:
    cfg = compose_config(
        "stage1", "model=deepseek_ocr2_tiny", "run.repeats=2", "run.warmup=1", "infer.max_new_tokens=4",
        "dataset.max_images=1", "pipeline.torch_profiler.enable=false",
    )  # fmt: skip
    Stage1Run(command_config(cfg), tmp_path / "run", run_id="gpu").execute()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["memory"]["available"] is True, metrics["memory"]["reason"]
    assert (tmp_path / "run" / "memory" / "memory_timeline.png").is_file()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Memory by stage" in report and "## Energy" in report
    if importlib.util.find_spec("pynvml") is not None and metrics["energy"]["available"]:
        assert metrics["energy"]["joules_per_page"] > 0


def _e2e(session: InferenceSession, pages: int) -> tuple[MemoryBreakdown, MemoryPass]:
    """The whole pass's breakdown of a memory pass over `pages` copies of PAGE, and the pass's record."""
    measured = memory_pass(session, (PAGE,) * pages, f"x{pages}", 4, MemorySchema(snapshot_max_mib=0)).measured
    other = resident_other(measured)
    peak = next(p for p in measured.peaks if p.stage == vocab.E2E)
    return breakdown(peak, measured.weights_bytes, other, measured.preexisting_kv_bytes), measured


def test_the_fit_prediction_holds_when_the_batch_is_run(tiny: InferenceSession) -> None:
    """The prediction's model — fixed memory plus a per-page part that grows with the batch — is checked by running a
    batch of 4: its measured peak stays within the batch-1 prediction (an upper bound: where the peak is in a vision
    stage, which encodes one image at a time, the real growth per page is smaller, and the report says so), and
    above the fixed part plus the decoder's own growth."""
    one, measured = _e2e(tiny, 1)
    fit = fit_prediction(
        measured.total_memory_bytes, measured.outside_allocator_bytes, one, 1, measured.kv_bytes_per_token
    )
    assert fit.per_page_bytes > 0 and fit.max_batch is not None
    four, _ = _e2e(tiny, 4)
    fixed = one.weights_bytes + one.resident_other_bytes
    predicted = fixed + 4 * fit.per_page_bytes
    assert fixed < four.peak_allocated_bytes <= predicted + MIB, (four, predicted)
    at_peak = [p.stage for p in measured.peaks if p.peak_allocated_bytes == one.peak_allocated_bytes]
    assert bool(vision_peak_caveat(measured)) == any(vocab.is_vision(stage) for stage in at_peak), at_peak

"""Stage1Analysis: Stage 1's figures from a run's measurements, one method per question."""

from __future__ import annotations

import types
from pathlib import Path

import attrs
import pytest

from llm_perf_opt.measure.aggregate import stage_stats
from llm_perf_opt.measure.stage1_analysis import Stage1Analysis, Stage1Measurements, Stage1Setup
from llm_perf_opt.measure.stage_flops import StageFlops
from llm_perf_opt.measure.throughput import throughput
from llm_perf_opt.measure.variation import HOST_SIDE, stage_variation
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.stage1 import DecodeActivity, SkippedInput, Stage1Metrics, StepActivity

METRICS = Path(__file__).resolve().parent / "fixtures" / "metrics"


def _flops(prompt_tokens: int) -> StageFlops:
    return StageFlops(
        prefill=2e9,
        vision={},
        decode_step_base=1e8,
        decode_step_per_ctx=1e3,
        prompt_tokens=prompt_tokens,
        by_operator={},
    )


def _analysis(m: Stage1Metrics, **setup: object) -> Stage1Analysis:
    described = {"inputs": len(m.images), **setup}
    measured = Stage1Measurements(
        records=list(m.records),
        flops={r.image: _flops(r.prompt_tokens) for r in m.records},
        batches=list(m.batches),
        batch_flops={b.cost_key: _flops(100) for b in m.batches},
    )
    return Stage1Analysis(
        measured,
        Stage1Setup(
            run_id=m.run_id,
            model=m.model,
            model_class=m.model.class_name,
            device=m.device,
            settings=m.settings,
            vision_stages=m.vision_stages,
            config_digest=m.config_digest,
            **described,  # type: ignore[arg-type]
        ),
    )


def test_the_record_figures_are_those_of_the_records() -> None:
    m = load_stage1_metrics(METRICS / "cpu_tiny_stage1.json")
    out = _analysis(m).metrics()
    assert out.records == m.records
    assert out.stages == stage_stats(m.records, m.vision_stages)
    assert out.throughput == throughput(m.records)
    assert tuple(attrs.evolve(v, noise_side=None) for v in out.variation) == stage_variation(m.records, m.vision_stages)
    assert {v.stage: v.noise_side for v in out.variation}[vocab.PREPROCESS] == HOST_SIDE  # no profiled pass: only it
    assert set(out.per_image) == set(m.images)


def test_mfu_is_the_forwards_flops_over_their_time_and_the_peak() -> None:
    m = load_stage1_metrics(METRICS / "cpu_tiny_stage1.json")
    analysis = _analysis(m, peak_tflops=10.0)
    prefill = next(r for r in analysis.metrics().mfu if r.stage == vocab.PREFILL)
    seconds = sum(r.prefill_ms for r in m.records) / 1e3
    assert prefill.flops_total == pytest.approx(2e9 * len(m.records))
    assert prefill.mfu == pytest.approx(2e9 * len(m.records) / seconds / 10e12)
    assert analysis.measured_peaks() is None  # not asked


def test_a_batched_run_is_priced_per_batch() -> None:
    m = load_stage1_metrics(METRICS / "cpu_tiny_batch2_stage1.json")
    assert m.batches
    forwards = _analysis(m).forwards()
    assert list(forwards.passes) == list(m.batches)
    assert set(forwards.flops) == {b.cost_key for b in m.batches}


def test_warnings_say_what_the_figures_lack() -> None:
    m = load_stage1_metrics(METRICS / "cpu_tiny_stage1.json")
    partial = attrs.evolve(
        m, settings=attrs.evolve(m.settings, partial=True, runtime=attrs.evolve(m.settings.runtime, batch_size=2))
    )
    skipped = (SkippedInput(path="/data/x.png", reason="unreadable"),)
    warnings = _analysis(partial, inputs=3, skipped=skipped).warnings((), no_peak=True)
    assert warnings[0].startswith("The run did not finish")
    assert any(w.startswith("No analytic model for") for w in warnings)
    assert "Skipped input x.png: unreadable." in warnings
    assert any(w.startswith("MFU is n/a") for w in warnings)
    assert any(w.startswith("The last batch holds 1 input(s)") for w in warnings)


def test_variation_and_its_warnings_name_the_side_of_the_noise() -> None:
    """With a profiled pass whose decode step keeps the GPU busy a tiny share of the timed step, the decode step's
    variation is host-side in the record and in its warning; preprocessing is host-side always."""
    m = load_stage1_metrics(METRICS / "cpu_tiny_stage1.json")
    analysis = _analysis(m, cv_warn=0.0)
    step = StepActivity(kernels=10, kernel_ms=1e-4, busy_ms=1e-4, wall_ms=1.0)
    activity = DecodeActivity(
        steps=2, kernels_mean=10, kernels_min=10, kernels_max=10, kernel_ms_mean=1e-4, busy_ms_mean=1e-4,
        wall_ms_mean=1.0, busy_fraction=1e-4, prefill=step, unattributed_kernels=0, method="test",
    )  # fmt: skip
    analysis.measured.operators = types.SimpleNamespace(activity=activity)  # type: ignore[assignment]
    sides = {v.stage: v.noise_side for v in analysis.variation()}
    assert sides[vocab.DECODE_STEP] == HOST_SIDE and sides[vocab.PREPROCESS] == HOST_SIDE
    assert sides.get(vocab.TTFT) is None
    warned = [w for w in analysis.warnings(analysis.variation(), no_peak=False) if vocab.DECODE_STEP in w]
    assert all("host-side: the GPU is busy 0% of a decode step" in w for w in warned)

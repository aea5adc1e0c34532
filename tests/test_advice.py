"""What to try, as data (`measure.advice`, `records.advice`): no lever the run already had, kernels judged by kind,
predictions from the H100 example rungs' records, the calibration and its update, and the table the reports show."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import pytest

from llm_perf_opt.kernel_names import ATTENTION, COPY, ELEMENTWISE, GEMM, OTHER, kernel_kind
from llm_perf_opt.measure.advice import ModuleFact, advise, in_force, module_facts
from llm_perf_opt.measure.throughput import run_pages
from llm_perf_opt.pipeline.stage1_render import render
from llm_perf_opt.records.advice import (
    BASIS_FLOOR,
    BASIS_IDLE,
    PAGE_LATENCY,
    THROUGHPUT,
    UNCALIBRATED,
    Calibration,
    LeverCalibration,
    calibrated,
    dump_calibration,
    load_calibration,
    shipped_calibration,
)
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.records.modules import ModuleAttribution, ModuleFloorRow, StageModules
from llm_perf_opt.records.stage1 import (
    PAGE_DECODE,
    PAGE_LM_PREFILL,
    PAGE_PREPROCESS,
    PAGE_VISION,
    PagePart,
    PageThroughput,
    Stage1Metrics,
)

pytestmark = pytest.mark.usefixtures("frozen_calibration")  # predictions worked out with a fixed calibration

RUNGS = Path(__file__).resolve().parents[1] / "examples" / "whatif-h100-decode" / "rungs"


def _rung(name: str) -> Stage1Metrics:
    return load_stage1(RUNGS / name).metrics


def _summary(value: float, unit: str = "ms") -> Summary:
    return Summary(1, value, 0.0, value, value, value, value, None, None, None, unit)


def _batched(m: Stage1Metrics, parts: dict[str, tuple[float, float | None]], **runtime: object) -> Stage1Metrics:
    """`m` as a batch-32 run with the given runtime settings, GPU preprocessing and time per page."""
    settings = attrs.evolve(m.settings, runtime=attrs.evolve(m.settings.runtime, batch_size=32, **runtime))
    pages = PageThroughput(
        batch_size=32,
        pages_per_s=_summary(10.0, "pages/s"),
        tokens_per_s=_summary(320.0, "tokens/s"),
        ttft_ms=_summary(1000.0),
        ttlt_ms=_summary(3000.0),
        parts=tuple(PagePart(name, ms, floor) for name, (ms, floor) in parts.items()),
    )
    model = attrs.evolve(m.model, preprocess={**m.model.preprocess, "device": "cuda"})
    return attrs.evolve(m, settings=settings, pages=pages, model=model)


# What the H100 run at batch 32 had in force: static cache, CUDA-graph decode, compiled vision, GPU preprocessing.
IN_FORCE = dict(kv_cache="static", compile="decode", compile_mode="reduce-overhead", compile_vision="reduce-overhead")


# ---- nothing already in force --------------------------------------------------------------------------------


def test_a_run_with_cuda_graphs_is_not_advised_them() -> None:
    assert not [a for a in advise(_rung("02-cuda_graphs")) if a.kind == "cuda_graphs"]
    # compiled decode without graphs: only the mode is left to change
    (graphs,) = [a for a in advise(_rung("03-compiled_decode")) if a.kind == "cuda_graphs"]
    assert graphs.overrides == ("runtime.compile_mode=reduce-overhead",)


def test_a_batch_bound_by_vision_gets_batched_vision_and_nothing_it_had() -> None:
    parts = {
        PAGE_PREPROCESS: (5.0, None),
        PAGE_VISION: (40.0, 5.0),
        PAGE_LM_PREFILL: (10.0, 8.0),
        PAGE_DECODE: (8.0, 1.0),
    }
    m = _batched(_rung("02-cuda_graphs"), parts, **IN_FORCE)
    advice = advise(m)
    assert advice[0].lever == "runtime.batch_vision=true"
    assert advice[0].objective == THROUGHPUT and advice[0].objective_ms == pytest.approx(63.0)
    assert advice[0].bound_ms == pytest.approx(35.0) and advice[0].basis == BASIS_FLOOR
    kinds = {a.kind for a in advice}
    assert not kinds & {"cuda_graphs", "compile_vision", "gpu_preprocess", "batch"}
    assert "run.batch_size=32" in advice[0].command and "model.preprocess.device=cuda" in advice[0].command
    # the page files are decoded on the host whatever device preprocesses: decoding them ahead is advised, unless on
    (ahead,) = [a for a in advice if a.kind == "overlap_preprocess"]
    assert ahead.overrides == ("runtime.prefetch_pages=true",) and ahead.bound_ms == pytest.approx(5.0)
    assert ahead.objective == THROUGHPUT and "model.preprocess.device=cuda" in ahead.command
    on = advise(_batched(_rung("02-cuda_graphs"), parts, **IN_FORCE, prefetch_pages=True, preprocess_workers=8))
    assert "overlap_preprocess" not in {a.kind for a in on}
    assert "runtime.preprocess_workers=8 runtime.prefetch_pages=true" in on[0].command  # kept by its verifying run


def test_a_batch_bound_by_the_language_model_prefill_gets_it_compiled() -> None:
    parts = {
        PAGE_PREPROCESS: (5.0, None),
        PAGE_VISION: (10.0, 9.0),
        PAGE_LM_PREFILL: (40.0, 2.0),
        PAGE_DECODE: (8.0, 1.0),
    }
    advice = advise(_batched(_rung("02-cuda_graphs"), parts, **IN_FORCE, prefetch_pages=True))
    assert [a.lever for a in advice] == ["runtime.compile=prefill_decode"]  # static cache and mode already in force


def test_in_force_reads_the_runs_settings() -> None:
    m = _rung("00-baseline")  # dynamic cache, eager, experts grouped_mm, attention sdpa
    assert in_force(m, "model.experts_implementation=grouped_mm")
    assert in_force(m, "runtime.kv_cache=dynamic") and not in_force(m, "runtime.kv_cache=static")
    assert not in_force(m, "runtime.compile_mode=reduce-overhead")  # a mode compiles nothing without runtime.compile
    assert not in_force(m, "model.preprocess.device=cuda")  # not recorded: never taken as in force


# ---- kernels by kind -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN (aten::addmm)", GEMM),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", GEMM),
        ("cutlass::device_kernel (grouped GEMM) (aten::_grouped_mm)", GEMM),
        ("triton_tem_fused_mm_3", GEMM),
        ("cutlass::device_kernel (attention) (aten::_flash_attention_forward)", ATTENTION),
        ("flash_fwd_kernel", ATTENTION),
        ("at::native::elementwise_kernel [direct_copy_kernel_cuda] (aten::copy_)", COPY),
        ("at::native::CatArrayBatchedCopy (aten::cat)", COPY),
        ("Memcpy DtoD (Device -> Device)", COPY),
        ("at::native::vectorized_elementwise_kernel [CUDAFunctor_add] (aten::add)", ELEMENTWISE),
        ("at::native::reduce_kernel (aten::sum)", ELEMENTWISE),
        ("triton_poi_fused_add_convolution_0", ELEMENTWISE),  # names the ops it fuses: still pointwise
        ("some_kernel (aten::mm)", GEMM),  # the kernel's name says nothing: its operator decides
        ("some_kernel (aten::index_select)", OTHER),
    ],
)
def test_kernels_are_classified_by_kind(label: str, kind: str) -> None:
    assert kernel_kind(label) == kind


def _row(module: str, ms: float, floor: float | None, top: str, module_type: str = "Linear") -> ModuleFloorRow:
    return ModuleFloorRow(module, module_type, 12, 12, 40, ms, 0.0, 1e9, 1e8, floor, top)


def _with_modules(m: Stage1Metrics, stage: str, total: float, *rows: ModuleFloorRow) -> Stage1Metrics:
    stages = (StageModules(stage, 1, total, 1.0, rows, 0.0, None, ("module ranges",)),)
    return attrs.evolve(m, modules=ModuleAttribution("GPU kernel time", stages, "H100 datasheet peaks"))


PROJECTOR_GEMM = _row("model.projector", 2.0, 0.2, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN (aten::addmm)")
NORMS = _row("model.sam_model.neck", 30.0, 3.0, "at::native::vectorized_layer_norm_kernel (aten::native_layer_norm)")


def test_a_gemm_is_not_advised_as_elementwise_fusion() -> None:
    """The H100 run that advised "many small elementwise kernels" for the projector's nvjet GEMM: a GEMM far above
    its floor is a GEMM, and gets no fusion advice; elementwise kernels of a compiled stage get a named code change."""
    m = attrs.evolve(
        _rung("02-cuda_graphs"),
        settings=attrs.evolve(
            _rung("02-cuda_graphs").settings,
            runtime=attrs.evolve(_rung("02-cuda_graphs").settings.runtime, compile_vision="reduce-overhead"),
        ),
    )
    (projector,) = module_facts(_with_modules(m, "vision/projector", 2.5, PROJECTOR_GEMM).modules)
    assert projector.kernel_kind == GEMM and projector.role == GEMM
    assert not [a for a in advise(_with_modules(m, "vision/projector", 2.5, PROJECTOR_GEMM)) if "fuse" in a.kind]
    (fuse,) = [a for a in advise(_with_modules(m, "vision/sam", 100.0, NORMS)) if a.kind == "fuse_elementwise"]
    assert fuse.code_change and "`model.sam_model.neck`" in fuse.lever and fuse.bound_ms == pytest.approx(27.0)


def test_experts_and_attention_backends_are_advised_only_when_not_in_force_then_a_fused_kernel() -> None:
    experts = _row("model.layers.*.mlp.experts", 0.6, 0.1, "cutlass::device_kernel (grouped GEMM) (aten::_grouped_mm)")
    attn = _row("model.sam_model.blocks.*.attn", 60.0, 5.0, "at::native::elementwise_kernel [add] (aten::add)", "Attn")
    grouped = _with_modules(_rung("02-cuda_graphs"), "decode/step", 1.4, experts)  # ran grouped_mm
    assert not [a for a in advise(grouped) if a.kind == "experts_backend"]
    (fused,) = [a for a in advise(grouped) if a.kind == "fused_experts"]  # what holds the rest: no setting runs it
    assert fused.code_change and not fused.overrides and not fused.command
    assert "`model.layers.*.mlp.experts`" in fused.lever and fused.bound_ms == pytest.approx(0.5 * 31)
    eager = attrs.evolve(grouped, model=attrs.evolve(grouped.model, experts_implementation="eager"))
    (advised,) = [a for a in advise(eager) if a.kind == "experts_backend"]
    assert advised.lever == "model.experts_implementation=grouped_mm"
    assert advised.bound_ms == pytest.approx(0.5 * 31)  # 0.5 ms above the floor per step, 31 steps per page
    sdpa = _with_modules(_rung("02-cuda_graphs"), "vision/sam", 140.0, attn)
    assert not [a for a in advise(sdpa) if a.kind == "attention_backend"]
    eager_attn = attrs.evolve(sdpa, model=attrs.evolve(sdpa.model, attn_implementation="eager"))
    assert [a.lever for a in advise(eager_attn) if a.kind == "attention_backend"] == ["model.attn_implementation=sdpa"]
    assert isinstance(module_facts(sdpa.modules)[0], ModuleFact)


# ---- predictions ---------------------------------------------------------------------------------------------


def test_cuda_graphs_are_predicted_from_the_profiled_idle_time_of_a_fixture_folder(
    frozen_calibration: Calibration,
) -> None:
    """The H100 baseline rung: decode 710.6 ms per page with the GPU busy 7% of each step; CUDA graphs remove up to
    the idle 93%, times the calibration's share. The rung that then ran those overrides saved within the interval."""
    m = _rung("00-baseline")
    (graphs,) = [a for a in advise(m) if a.kind == "cuda_graphs"]
    parts = {p.part: p.ms_per_page for p in run_pages(m).parts}
    assert m.profiler is not None and m.profiler.activity is not None
    bound = parts[PAGE_DECODE] * (1 - m.profiler.activity.busy_fraction)
    calibration = frozen_calibration.of("cuda_graphs")
    assert graphs.basis == BASIS_IDLE and graphs.bound_ms == pytest.approx(bound)
    assert graphs.saving_ms == pytest.approx(calibration.factor * bound)
    assert (graphs.saving_low_ms, graphs.saving_high_ms) == pytest.approx((calibration.low * bound, bound))
    assert graphs.objective == PAGE_LATENCY and graphs.objective_ms == pytest.approx(sum(parts.values()))
    assert graphs.speedup == pytest.approx(graphs.objective_ms / (graphs.objective_ms - graphs.saving_ms))
    assert graphs.command == (
        "stage1-run model=deepseek_ocr infer.max_new_tokens=32 runtime.kv_cache=static runtime.compile=decode "
        "runtime.compile_mode=reduce-overhead"
    )
    measured = (
        parts[PAGE_DECODE]
        - next(p for p in run_pages(_rung("02-cuda_graphs")).parts if p.part == PAGE_DECODE).ms_per_page
    )
    assert graphs.saving_low_ms <= measured <= graphs.saving_high_ms + 1e-6


def test_advice_is_ranked_by_predicted_speedup_and_leaves_out_what_a_whatif_run_measured() -> None:
    from llm_perf_opt.records.folders import load_whatif

    m = _rung("00-baseline")
    advice = advise(m)
    speedups = [a.speedup or 0.0 for a in advice]
    assert speedups == sorted(speedups, reverse=True)
    measured = advise(m, load_whatif(RUNGS.parent))  # the decode preset measured the cache and compile levers
    assert "cuda_graphs" in {a.kind for a in advice} and "cuda_graphs" not in {a.kind for a in measured}


# ---- calibration ---------------------------------------------------------------------------------------------


def test_calibration_update_from_measured_against_predicted() -> None:
    prior = Calibration({"batch": LeverCalibration(factor=0.6, low=0.3, high=0.9, samples=0, note="prior")})
    first = calibrated(prior, "batch", bound_ms=100.0, measured_saving_ms=20.0)
    said = "a what-if run: 20.0 of a 100.0 ms/page bound saved"
    assert first.of("batch") == LeverCalibration(0.2, 0.2, 0.9, samples=1, note=said)  # the prior gives way
    second = calibrated(first, "batch", bound_ms=50.0, measured_saving_ms=40.0)
    assert second.of("batch").factor == pytest.approx(0.5) and second.of("batch").samples == 2
    assert second.of("batch").note == f"{said}; a what-if run: 40.0 of a 50.0 ms/page bound saved"
    lost = calibrated(prior, "batch", bound_ms=100.0, measured_saving_ms=-7.0, source="adv (GPU, 2026-11-28)")
    assert lost.of("batch").factor == 0.0 and lost.of("batch").note.endswith("bound saved (it cost 7.0 ms/page)")
    assert (second.of("batch").low, second.of("batch").high) == (0.2, 0.9)
    assert calibrated(second, "batch", bound_ms=0.0, measured_saving_ms=5.0) == second  # nothing to learn from
    new = calibrated(prior, "unknown_kind", bound_ms=10.0, measured_saving_ms=12.0).of("unknown_kind")
    assert (new.factor, new.low, new.high, new.samples) == (pytest.approx(1.2), 0.0, pytest.approx(1.2), 1)
    assert prior.of("never_seen") is UNCALIBRATED
    assert load_calibration(dump_calibration(second)) == second


def test_the_shipped_calibration_loads_and_a_bad_one_is_refused() -> None:
    shipped = shipped_calibration()
    assert {"cuda_graphs", "batch_vision", "compile_prefill", "gpu_preprocess", "batch"} <= set(shipped.kinds)
    assert all(0 <= c.low <= c.factor <= c.high for c in shipped.kinds.values())
    with pytest.raises(ValueError, match="low <= factor <= high"):
        load_calibration("kinds: {batch: {factor: 0.9, low: 0.3, high: 0.5}}")
    with pytest.raises(ValueError, match="'kinds'"):
        load_calibration("- 1")


# ---- the table the reports show ------------------------------------------------------------------------------


def test_report_and_summary_show_the_ranked_table(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(RUNGS / "00-baseline", folder)
    render(folder, images=False)
    for name in ("report.md", "stakeholder_summary.md"):
        section = (folder / name).read_text(encoding="utf-8").split("## What to try", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("|") and line[1:2].isdigit()]
        assert 1 <= len(rows) <= 5, name
        assert "|#|lever|acts on|saves per page (interval); ×|objective now|basis|verify with|" in section
        assert (
            rows[0].startswith("|1|`runtime.kv_cache=static runtime.compile=decode") and "launch-bound idle" in rows[0]
        )
        assert "data-loader" not in section


def test_stage2_summary_does_not_advise_cuda_graphs_to_a_workload_that_ran_them() -> None:
    from llm_perf_opt.records.folders import load
    from llm_perf_opt.records.stage1 import RunSettings, RuntimeRecord
    from llm_perf_opt.records.stage2 import Stage2Metrics
    from llm_perf_opt.report.stage2_reports import stakeholder_md

    m = load(Path(__file__).resolve().parents[1] / "examples" / "stage2-h100-tiny").metrics
    assert isinstance(m, Stage2Metrics)
    assert "capture the decode step in a CUDA graph" in stakeholder_md(m)  # 2% busy, eager workload
    graphs = RuntimeRecord(kv_cache="static", compile="decode", compile_mode="reduce-overhead")
    settings = RunSettings(repeats=1, warmup=2, max_new_tokens=32, max_images=None, sources={}, runtime=graphs)
    assert "capture the decode step" not in stakeholder_md(attrs.evolve(m, workload_settings=settings))


def test_past_the_launch_floor_the_report_names_what_holds_the_decode_step_and_the_missing_kernels() -> None:
    """A real batch-1 run with the decode step in CUDA graphs (H200, 2026-11-28): 1.339 ms of kernels per step against
    a 0.252 ms floor, held by the MoE block's routing, the grouped-GEMM experts and SDPA attention, each needing a
    kernel no setting runs. An eager run has no such line (its launches come first: the CUDA-graph advice)."""
    from helpers import FIXTURES
    from llm_perf_opt.measure.advice import decode_remainder
    from llm_perf_opt.records.folders import load_stage1_metrics
    from llm_perf_opt.report.recommendations import decode_remainder_line

    m = load_stage1_metrics(FIXTURES / "metrics" / "h200_graphs_b1.json")
    held = decode_remainder(m)
    assert held is not None
    assert (held.step_ms, held.floor_ms) == pytest.approx((1.339, 0.252), abs=5e-4)
    needs = {r.module.rsplit(".", 1)[-1]: r.needs for r in held.modules}
    assert "fused routed-experts kernel" in needs["experts"] and "routing" in needs["mlp"]
    assert "decode attention kernel" in needs["self_attn"]
    line = decode_remainder_line(held)
    assert line.startswith("Past the launch floor") and "(5.3×)" in line and "0.210 ms above its floor" in line
    eager = attrs.evolve(m.model, experts_implementation="eager", attn_implementation="eager")
    backends = {r.needs for r in decode_remainder(attrs.evolve(m, model=eager)).modules}  # type: ignore[union-attr]
    assert {"`model.experts_implementation=grouped_mm`", "`model.attn_implementation=sdpa`"} <= backends
    assert decode_remainder(_rung("00-baseline")) is None  # eager decode: no graphs, no such line

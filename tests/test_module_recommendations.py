"""Recommendations built on module attribution: the modules furthest above their floor, each with the lever that
fits (experts, attention, copies, elementwise fusion), from hand-made `ModuleAttribution` records."""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.modules import ModuleAttribution, ModuleFloorRow, StageModules
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report.recommendations import RULES, Facts, ModuleFact, module_facts, recommendations

FIXTURE = Path(__file__).parent / "fixtures" / "metrics" / "h100_full_stage1.json"


def _row(module: str, ms: float, floor: float | None, top: str, module_type: str = "Linear") -> ModuleFloorRow:
    return ModuleFloorRow(module, module_type, 12, 12, 40, ms, 0.0, 1e9, 1e8, floor, top)


def _stage(stage: str, total: float, *rows: ModuleFloorRow) -> StageModules:
    return StageModules(stage, 1, total, 1.0, rows, 0.0, None, ("module ranges",))


def _metrics(*stages: StageModules) -> Stage1Metrics:
    m = load_stage1_metrics(FIXTURE)
    return attrs.evolve(m, modules=ModuleAttribution("GPU kernel time", stages, "H100 datasheet peaks"))


SAM_ATTN = _row(
    "model.sam_model.blocks.*.attn", 6.0, 0.5, "at::native::elementwise_kernel [CUDAFunctor_add] (aten::add)", "Attn"
)
EXPERTS = _row("model.layers.*.mlp.experts", 0.6, 0.1, "cutlass::device_kernel (grouped GEMM) (aten::_grouped_mm)")
COPIES = _row("model.projector", 2.0, 0.2, "at::native::elementwise_kernel [direct_copy_kernel_cuda] (aten::copy_)")
NORMS = _row("model.sam_model.neck", 3.0, 0.3, "at::native::vectorized_layer_norm_kernel (aten::native_layer_norm)")


def _lines(m: Stage1Metrics, start: str) -> list[str]:
    return [r for r in recommendations(m) if r.startswith(start)]


def test_module_facts_keep_the_far_and_large_distances_to_the_floor() -> None:
    a = ModuleAttribution(
        "GPU kernel time",
        (
            _stage(
                "vision/sam",
                14.0,
                SAM_ATTN,
                _row("near", 2.0, 1.5, "x"),  # 1.3× its floor: not far
                _row("tiny", 0.3, 0.01, "x"),  # 30× but 2% of the stage: not notable
                _row("unpriced", 5.0, None, "x"),  # no floor: nothing to compare with
            ),
        ),
        None,
    )
    (fact,) = module_facts(a)
    assert fact.module == SAM_ATTN.module and fact.ratio == 12.0 and fact.above_ms == 5.5 and fact.kind == "attention"
    assert module_facts(None) == ()


def test_each_module_gets_the_kind_of_lever_that_fits() -> None:
    def kind(row: ModuleFloorRow) -> str:
        return ModuleFact("prefill", row.module, row.module_type, row.ms, 0.1, 10.0, row.top_kernel).kind

    assert [kind(r) for r in (EXPERTS, SAM_ATTN, COPIES, NORMS)] == ["experts", "attention", "copies", "elementwise"]
    assert kind(_row("model.head", 1.0, 0.1, "nvjet_tst_64x8 (aten::mm)")) == "other"


def test_attention_far_above_its_floor_points_to_a_fused_backend_and_the_bias() -> None:
    (line,) = _lines(_metrics(_stage("vision/sam", 14.0, SAM_ATTN)), "Attention far above its floor")
    assert "`model.sam_model.blocks.*.attn` (vision/sam) takes 6.000 ms per pass, 12.0× its floor of 0.500 ms" in line
    assert "(5.500 ms above it, 39% of the stage)" in line and "mostly `at::native::elementwise_kernel" in line
    assert "model.attn_implementation=sdpa" in line and "relative-position bias" in line


def test_moe_experts_far_above_their_floor_point_to_grouped_gemm_and_batching() -> None:
    (line,) = _lines(_metrics(_stage("decode/step", 1.5, EXPERTS)), "MoE experts far above their byte floor at batch")
    assert "0.600 ms per step, 6.0× its floor of 0.100 ms" in line
    assert "model.experts_implementation=grouped_mm" in line and "run.batch_size" in line


def test_copies_point_to_layout_and_name_a_second_module() -> None:
    other = _row("model.layers.*.mlp.down_proj", 1.0, 0.1, "at::native::CatArrayBatchedCopy (aten::cat)")
    (line,) = _lines(_metrics(_stage("prefill", 10.0, COPIES, other)), "Copies far above the floor")
    assert "`model.projector` (prefill) takes 2.000 ms per pass, 10.0× its floor" in line
    assert "also `model.layers.*.mlp.down_proj` (prefill, 10.0× its floor, 0.900 ms above it)" in line
    assert "contiguous" in line and "layout" in line


def test_small_elementwise_kernels_point_to_fusion() -> None:
    (line,) = _lines(_metrics(_stage("vision/sam", 10.0, NORMS)), "Many small elementwise kernels")
    assert "`model.sam_model.neck` (vision/sam) takes 3.000 ms per pass, 10.0× its floor" in line
    assert "torch.compile" in line


def test_module_rules_cite_the_what_if_levers_they_advise() -> None:
    rules = {r.name: r for r in RULES}
    vision = Facts.of(_metrics(_stage("vision/sam", 10.0, NORMS, COPIES)))
    decoder = Facts.of(_metrics(_stage("decode/step", 1.5, EXPERTS, SAM_ATTN)))
    assert rules["module: elementwise kernels far above floor"].levers(vision) == frozenset()  # vision stays eager
    assert rules["module: copies far above floor"].levers(vision) == frozenset()
    assert rules["module: MoE experts far above floor"].levers(decoder) == {
        "model.experts_implementation",
        "run.batch_size",
    }
    assert rules["module: attention far above floor"].levers(decoder) == {"model.attn_implementation"}
    decode_copies = Facts.of(_metrics(_stage("decode/step", 3.0, COPIES)))
    assert rules["module: copies far above floor"].levers(decode_copies) == {"runtime.compile"}


def test_no_module_attribution_adds_no_module_advice() -> None:
    m = load_stage1_metrics(FIXTURE)
    assert Facts.of(m).modules == ()
    assert not [r for r in RULES if r.name.startswith("module:") and r.when(Facts.of(m))]

"""Module attribution: innermost ranges, folding across layers, analytic names placed on modules, kernels given to
modules (eager ranges and a compiled-code resolver), the unattributed share, the record's round trip and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from torch.autograd import DeviceType

from llm_perf_opt.instruments import torch_profiler as tp
from llm_perf_opt.instruments.module_attribution import (
    MODULE_RANGES,
    Interval,
    attribute,
    cpu_launches,
    innermost,
)
from llm_perf_opt.instruments.module_ranges import module_ranges
from llm_perf_opt.measure.module_changes import held_by, module_changes
from llm_perf_opt.measure.module_floors import ModuleResolver, fold, module_attribution
from llm_perf_opt.records.io import converter, to_plain
from llm_perf_opt.records.modules import (
    PROVENANCE_METHOD_NAME,
    ModuleAttribution,
    ModuleFloorRow,
    ModuleTimes,
    StageModules,
)
from llm_perf_opt.report.modules_report import changes_waterfall, modules_md, modules_plot


@attrs.frozen
class _Range:
    start: float
    end: float


@attrs.frozen
class _Event:
    """The parts of a torch.profiler FunctionEvent the attribution reads."""

    name: str
    start: float
    end: float
    self_ms: float = 0.0
    device_type: Any = DeviceType.CPU
    thread: int = 1
    id: int = 0

    @property
    def time_range(self) -> _Range:
        return _Range(self.start, self.end)

    @property
    def self_cpu_time_total(self) -> float:
        return self.self_ms * 1e3


def test_innermost_picks_the_deepest_enclosing_range() -> None:
    outer, inner, later = Interval(0, 100, "a"), Interval(10, 20, "a.b"), Interval(50, 60, "a.c")
    found = innermost([later, outer, inner], [15, 5, 55, 120, 20])
    assert [f.label if f else None for f in found] == ["a.b", "a", "a.c", None, "a.b"]


def test_fold_replaces_every_layer_index() -> None:
    assert fold("model.layers.3.mlp.experts") == "model.layers.*.mlp.experts"
    assert fold("vision.blocks.11.attn.qkv2") == "vision.blocks.*.attn.qkv2"
    assert fold("0.weight") == "*.weight"


def _host() -> list[_Event]:
    return [
        _Event("stage:prefill", 0, 100),
        _Event("module:", 1, 99),
        _Event("module:layers.0", 10, 50),
        _Event("module:layers.0.mlp", 20, 30),
        _Event("aten::mm", 22, 24, self_ms=5.0),
        _Event("aten::add", 40, 41, self_ms=3.0),
        _Event("module:layers.1", 52, 90),
        _Event("aten::mm", 53, 54, self_ms=4.0),
        _Event("aten::cat", 99.5, 99.8, self_ms=2.0),  # the loop's own op: outside every module
    ]


def test_cpu_operators_go_to_the_innermost_module_and_the_rest_is_unattributed() -> None:
    host = _host()
    (stage,) = attribute(cpu_launches(host), host)
    rows = {r.module: r for r in stage.rows}
    assert rows["layers.0.mlp"].ms == 5.0 and rows["layers.0"].ms == 3.0 and rows["layers.1"].ms == 4.0
    assert stage.unattributed_ms == 2.0 and stage.unattributed_kernels == 1
    assert stage.unattributed_reason is not None and "no module" in stage.unattributed_reason
    assert stage.total_ms == pytest.approx(sum(r.ms for r in stage.rows) + stage.unattributed_ms)
    assert stage.methods == (MODULE_RANGES,)
    assert rows["layers.0"].calls == 1 and rows["layers.0"].top[0].kernel == "aten::add"


def test_launches_of_compiled_code_outside_module_ranges_go_to_the_resolver_in_launch_order() -> None:
    host = [*_host()[:-1], _Event("## Call CompiledFxGraph g ##", 99.4, 99.9), _host()[-1]]
    seen: list[list[str]] = []

    def resolver(names: Any) -> list[str | None]:
        seen.append(list(names))
        return [None, "layers.1"]

    (stage,) = attribute(cpu_launches(host), host, compiled=resolver, compiled_method=PROVENANCE_METHOD_NAME)
    assert seen == [["## Call CompiledFxGraph g ##", "aten::cat"]]
    assert stage.unattributed_ms == 0.0  # only the (CPU-side, 0 ms) call itself stays unplaced
    assert set(stage.methods) == {MODULE_RANGES, PROVENANCE_METHOD_NAME}
    assert {r.module: r.ms for r in stage.rows}["layers.1"] == 6.0


def test_eager_launches_outside_module_ranges_never_go_to_the_resolver() -> None:
    """The decode loop's own operations are not compiled code: unattributed, not aligned with a compiled graph."""
    host = _host()

    def resolver(names: Any) -> list[str | None]:
        raise AssertionError(f"no compiled code here, yet the resolver got {names}")

    (stage,) = attribute(cpu_launches(host), host, compiled=resolver, compiled_method=PROVENANCE_METHOD_NAME)
    assert stage.unattributed_ms == 2.0 and stage.methods == (MODULE_RANGES,)


def test_launches_of_compiled_code_inside_a_module_range_go_to_the_resolver_too() -> None:
    """torch.compile without CUDA graphs: the whole model's range is open around the compiled call (hooks do not
    run inside it), so its launches go to the resolver; one it cannot place keeps the enclosing module."""
    host = [
        _Event("stage:decode/step", 0, 100),
        _Event("module:", 1, 99),
        _Event("## Call CompiledFxGraph abc ##", 5, 60),
        _Event("triton_poi_fused_add_0", 10, 11, self_ms=2.0),
        _Event("triton_red_fused_mean_1", 20, 21, self_ms=1.0),
        _Event("aten::cat", 70, 71, self_ms=0.5),  # eager, after the compiled call: stays with the range
    ]
    seen: list[list[str]] = []

    def resolver(names: Any) -> list[str | None]:
        seen.append(list(names))
        return [None, "layers.0.mlp", None]

    (stage,) = attribute(cpu_launches(host), host, compiled=resolver, compiled_method=PROVENANCE_METHOD_NAME)
    assert seen == [["## Call CompiledFxGraph abc ##", "triton_poi_fused_add_0", "triton_red_fused_mean_1"]]
    rows = {r.module: r.ms for r in stage.rows}
    assert rows["layers.0.mlp"] == 2.0  # placed by provenance, below the open range
    assert rows[""] == pytest.approx(0.5)  # the eager op keeps the whole model's range
    assert stage.unattributed_ms == pytest.approx(1.0)  # an unplaced compiled launch is not given to the root


def test_analytic_names_are_placed_on_the_innermost_real_module() -> None:
    modules = [
        "",
        "model",
        "model.sam_model",
        "model.sam_model.layers.0",
        "model.sam_model.layers.0.attn",
        "model.sam_model.proj.conv1",
        "model.vision_model.encoder.layers.0.mlp.fc1",
        "model.vision_model.embeddings",
        "model.language_model.layers.0.mlp.experts",
        "model.language_model.layers.0.self_attn",
        "lm_head",
    ]
    roots = {
        "sam": "model.sam_model",
        "sam.net_2": "model.sam_model.proj.conv1",
        "clip": "model.vision_model",
        "decoder": "model.language_model",
        "lm_head": "lm_head",
    }
    resolve = ModuleResolver(modules, roots).resolve
    assert resolve("global/sam.layers.0.attn.rel_pos_bias") == "model.sam_model.layers.0.attn"
    assert resolve("tiles/sam.layers.0.residual1") == "model.sam_model.layers.0"
    assert resolve("global/sam.net_2") == "model.sam_model.proj.conv1"
    assert resolve("global/sam.pos_embed") == "model.sam_model"
    assert resolve("global/clip.layers.0.mlp.fc1") == "model.vision_model.encoder.layers.0.mlp.fc1"
    assert resolve("global/clip.embeddings.class_token") == "model.vision_model.embeddings"
    assert resolve("decoder.layers.0.mlp.experts.gate_up_proj") == "model.language_model.layers.0.mlp.experts"
    assert resolve("decoder.layers.0.self_attn.kv_write") == "model.language_model.layers.0.self_attn"
    assert resolve("lm_head") == "lm_head"
    assert resolve("projector") is None  # no root for it: no floor rather than a wrong one


@pytest.fixture(scope="module")
def profiled_tiny(tiny_session: Any, page_images: dict[str, Path]) -> Any:
    flags = {"record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False}
    return tp.profile_image(
        tiny_session, [page_images["small"]], decode_steps=2, trace_path=None, modules=True, **flags
    )


def test_a_real_profiled_pass_gives_each_stage_time_to_real_modules(profiled_tiny: Any, tiny_session: Any) -> None:
    times = profiled_tiny.modules
    assert times is not None and times.time_kind == "CPU operator self time"
    names = {name for name, _ in tiny_session.model.named_modules()}
    stages = {s.stage: s for s in times.stages}
    assert {"prefill", "vision/sam", "decode/step"} <= set(stages)
    assert stages["decode/step"].forwards == 2
    for stage in times.stages:
        assert stage.total_ms == pytest.approx(sum(r.ms for r in stage.rows) + stage.unattributed_ms)
        assert all(r.module in names for r in stage.rows)
        assert stage.unattributed_ms <= 0.2 * stage.total_ms
    # the operator tables do not list the module ranges as operators
    assert not any(r.name.startswith("module:") for r in profiled_tiny.overall)
    assert times.analytic_roots["decoder"] == "model.language_model"


def test_floors_fold_across_layers_and_the_records_round_trip(
    profiled_tiny: Any, tiny_session: Any, page_images: dict[str, Path], tmp_path: Path
) -> None:
    prepared = tiny_session.prepare(page_images["small"])
    costs = tiny_session.adapter.analytic_costs(tiny_session.model, prepared, 3, 4)
    times: ModuleTimes = profiled_tiny.modules
    attribution = module_attribution(
        times, costs, decode_steps=2, peak_flops=1e12, bandwidth=1e11, peaks_note="test peaks"
    )
    decode = next(s for s in attribution.stages if s.stage == "decode/step")
    folded = {r.module: r for r in decode.rows}
    experts = folded["model.language_model.layers.*.mlp.experts"]
    assert experts.members == 2 and experts.floor_ms is not None and experts.floor_ms > 0
    assert decode.floor_ms is not None and decode.floor_ms >= sum(r.floor_ms or 0 for r in decode.rows) - 1e-9
    above = [r.above_floor_ms if r.above_floor_ms is not None else r.ms for r in decode.rows]
    assert above == sorted(above, reverse=True)
    assert converter.structure(to_plain(times), ModuleTimes) == times
    assert converter.structure(to_plain(attribution), ModuleAttribution) == attribution
    text = modules_md(attribution, "tiny")
    assert "model.language_model.layers.*.mlp.experts" in text and "× floor" in text
    assert "given to a module" in text
    assert modules_plot(attribution, tmp_path / "modules.png") is not None


def test_without_an_analytic_model_there_are_no_floors(profiled_tiny: Any) -> None:
    attribution = module_attribution(
        profiled_tiny.modules, None, decode_steps=2, peak_flops=None, bandwidth=None, peaks_note=None
    )
    assert attribution.floors is None
    assert all(r.floor_ms is None and r.flops is None for s in attribution.stages for r in s.rows)
    assert "No floors" in modules_md(attribution, "tiny")


def test_a_model_with_no_submodules_gives_everything_to_the_root() -> None:
    model = torch.nn.Linear(4, 4)

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with (
        torch.profiler.profile(activities=cpu) as prof,
        torch.profiler.record_function("stage:prefill"),
        module_ranges(model) as ranges,
    ):
        model(torch.ones(2, 4))
    assert ranges.hooked == 1 and not ranges.refused
    host = [ev for ev in prof.events() if ev.device_type == DeviceType.CPU]
    (stage,) = attribute(cpu_launches(host), host)
    assert [r.module for r in stage.rows] == [""]  # the root, shown as "(model)"


def _stage(stage: str, total: float, rows: dict[str, float]) -> StageModules:
    return StageModules(
        stage=stage,
        forwards=1,
        total_ms=total,
        floor_ms=None,
        rows=tuple(
            ModuleFloorRow(
                module=m,
                module_type="Linear",
                members=1,
                calls=1,
                kernels=1,
                ms=ms,
                share=ms / total,
                flops=None,
                bytes=None,
                floor_ms=None,
                top_kernel=None,
            )
            for m, ms in rows.items()
        ),
        unattributed_ms=total - sum(rows.values()),
        unattributed_reason=None,
        methods=(MODULE_RANGES,),
    )


def test_module_changes_add_up_to_the_stage_change_and_draw_a_waterfall(tmp_path: Path) -> None:
    base = ModuleAttribution("GPU kernel time", (_stage("decode/step", 2.5, {"a": 1.0, "b": 0.8, "c": 0.4}),), None)
    rung = ModuleAttribution("GPU kernel time", (_stage("decode/step", 1.4, {"a": 0.3, "b": 0.9, "d": 0.1}),), None)
    (change,) = module_changes(base, rung, top=2)
    assert [c.module for c in change.changes] == ["a", "c"]  # the largest moves: −0.7, −0.4
    assert change.changes[1].other_ms == 0.0  # gone from the rung: 0 ms there
    assert change.base_ms + sum(c.delta_ms for c in change.changes) + change.rest_delta_ms == pytest.approx(1.4)
    assert changes_waterfall(change, "decode step", tmp_path / "w.png") is not None


def test_whatif_report_shows_which_modules_each_lever_moved(tmp_path: Path) -> None:
    import attrs as _attrs

    from llm_perf_opt.report.whatif_plots import module_waterfall
    from llm_perf_opt.report.whatif_report import whatif_md
    from whatif_fixtures import realistic

    record = realistic()
    base = ModuleAttribution(
        "GPU kernel time",
        (
            _stage("decode/step", 2.5, {"experts": 1.0, "attn": 0.8}),
            _stage("vision/sam", 28.6, {"sam.blocks": 28.6}),
            _stage("vision/clip", 3.35, {"clip.layers": 3.35}),
        ),
        None,
    )
    best = ModuleAttribution(
        "GPU kernel time",
        (
            _stage("decode/step", 1.4, {"experts": 0.3, "attn": 0.9}),
            _stage("vision/sam", 20.8, {"sam.blocks": 20.8}),  # moved 27%: listed
            _stage("vision/clip", 3.30, {"clip.layers": 3.30}),  # moved 1.5%: not listed
        ),
        None,
    )
    moved = module_changes(base, best)
    rungs = tuple(_attrs.evolve(r, modules=moved) if r.name == record.best else r for r in record.rungs)
    record = _attrs.evolve(record, rungs=rungs)
    text = whatif_md(record, {"module_waterfall": "plots/module_waterfall.png"})
    assert "## Which modules each lever moved" in text and "`experts`|1.000|0.300|-0.700" in text
    assert "`sam.blocks`|28.600|20.800|-7.800" in text and "`clip.layers`" not in text
    assert "plots/module_waterfall.png" in text
    assert module_waterfall(record, tmp_path / "w.png") is not None


def test_a_generic_hf_model_places_the_dense_analytic_names_on_its_modules(compose_model: Any) -> None:
    from llm_perf_opt.session.session import InferenceSession

    session = InferenceSession.load(compose_model("model=hf", "model.config=qwen2_tiny"), torch.device("cpu"))
    roots = session.adapter.analytic_module_roots(session.model)
    assert roots == {"": "model", "lm_head": "lm_head"}
    resolve = ModuleResolver([name for name, _ in session.model.named_modules()], roots).resolve
    assert resolve("layers.0.self_attn.q_proj") == "model.layers.0.self_attn.q_proj"
    assert resolve("layers.1.self_attn.kv_write") == "model.layers.1.self_attn"
    assert resolve("embed_tokens") == "model.embed_tokens" and resolve("lm_head") == "lm_head"


def test_module_ranges_leave_no_hook_behind_even_on_an_error() -> None:
    """The timed passes never run with the ranges: every hook is removed when the profiled pass ends, however."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with pytest.raises(RuntimeError), module_ranges(model) as ranges:
        assert ranges.hooked == 3
        model(torch.ones(1, 3))  # wrong width: raises inside the first Linear's forward
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_what_holds_the_best_rung_keeps_every_stages_modules_furthest_above_the_floor() -> None:
    import attrs as _attrs

    from llm_perf_opt.records.whatif import WhatIfRecord
    from llm_perf_opt.report.whatif_report import whatif_md
    from whatif_fixtures import realistic

    stages = (
        _stage("decode/step", 1.4, {"experts": 0.3, "attn": 0.2, "gate": 0.1}),
        _stage("prefill", 40.0, {"sam": 14.0, "clip": 9.0}),
        _stage("vision/sam", 14.0, {"sam": 14.0}),
    )
    held = held_by(ModuleAttribution("GPU kernel time", stages, "H100 bf16 dense peaks", ("a note",)), rows=2)
    assert held is not None
    # every stage, vision included: what holds a first token is mostly SAM and CLIP, apart from the prefill's decoder
    assert [s.stage for s in held.stages] == ["decode/step", "prefill", "vision/sam"]
    assert [r.module for r in held.stages[0].rows] == ["experts", "attn"]  # the rows' own order, cut to 2
    assert held.stages[0].total_ms == 1.4 and held.method_notes == ()  # totals kept, notes dropped
    assert held_by(None) is None
    assert held_by(ModuleAttribution("GPU kernel time", (), None)) is None

    record: WhatIfRecord = realistic()
    rungs = tuple(_attrs.evolve(r, held=held) if r.name == record.best else r for r in record.rungs)
    text = whatif_md(_attrs.evolve(record, rungs=rungs))
    assert f"## What holds the rest: {record.best}, by module" in text
    assert "(H100 bf16 dense peaks)" in text and "|`experts`|Linear|" in text and "### prefill" in text
    assert "|`gate`|" not in text  # beyond the kept rows
    plain = whatif_md(record)  # no attribution recorded: no section
    assert "What holds the rest" not in plain


def test_a_kernel_is_placed_at_its_launch_call_by_the_rule_the_step_activity_uses() -> None:
    """`gpu_launches` ties a kernel to the host call that launched it with `profiler_labels.is_launch`, the rule the
    decode-step activity uses. Events without an activity type (torch 2.11's) are judged by name: a driver or runtime
    launch counts, another CUDA call carrying the kernel's id (here a `cudaStreamSynchronize`) does not."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from llm_perf_opt.instruments.module_attribution import gpu_launches

    def event(name: str, device: DeviceType, id: int, start: float, end: float) -> Any:
        return SimpleNamespace(
            name=name, device_type=device, id=id, time_range=SimpleNamespace(start=start, end=end), cpu_children=[]
        )

    host = [
        event("aten::mm", DeviceType.CPU, 1, 0, 10),
        event("cuLaunchKernel", DeviceType.CPU, 2, 2, 3),
        event("aten::add", DeviceType.CPU, 3, 20, 30),
        event("cudaStreamSynchronize", DeviceType.CPU, 4, 22, 23),  # not a launch, whatever its id
    ]
    kernels = [
        event("nvjet_sm90_tst_128x72", DeviceType.CUDA, 2, 40, 50),
        event("elementwise", DeviceType.CUDA, 4, 60, 61),
    ]
    launches = gpu_launches(kernels, host, lambda ev: True)
    assert [(k.at, k.operator) for k in launches] == [(2, "aten::mm")]  # the second has no launch call: left out

"""Kernels of torch.compile'd code mapped to their nn.Module: Dynamo's module paths, inductor's generated wrapper
code (a real CPU compile and a CUDA-layout sample), the alignment of profiled kernels, and one real CPU compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from llm_perf_opt.instruments import compiled_modules as cm
from llm_perf_opt.instruments.compiled_modules import (
    InductorProvenance,
    KernelLaunch,
    ModuleNames,
    common_module,
    kernel_of,
    match_best,
    match_kernels,
    normalise_module_path,
    parse_wrapper,
)

FIXTURES = Path(__file__).parent / "fixtures" / "inductor"
NODES = {
    "linear": "layers.0.fc",
    "layer_norm": "layers.0.norm",
    "gelu": "layers.0.act",
    "x": "layers.0",
    "linear_1": "layers.1.fc",
    "layer_norm_1": "layers.1.norm",
    "gelu_1": "layers.1.act",
    "x_1": "layers.1",
    "linear_2": "head",
    "head": "head",
    "softmax": "head",
}


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("L['self'].model.layers[0].mlp", "model.layers.0.mlp"),
        ("L['self'].model.model.language_model.layers.1.mlp", "model.model.language_model.layers.1.mlp"),
        ("L['self']._modules['model']._modules['layers']._modules['0'].mlp", "model.layers.0.mlp"),
        ("self.layers.0", "layers.0"),
        ("getattr(L['model'], 'x')", "x"),
        ("getattr(getattr(L['self'].model.layers, '0'), 'mlp')", "model.layers.0.mlp"),
        ('L["fn"].__self__.model.layers[1]', "model.layers.1"),
        ("L['self']", ""),
    ],
)
def test_dynamo_module_paths_are_normalised(path: str, normal: str) -> None:
    assert normalise_module_path(path) == normal


def test_paths_resolve_to_the_roots_module_names_by_suffix() -> None:
    names = ModuleNames(["", "model", "model.layers", "model.layers.0", "model.layers.0.mlp", "lm_head"])
    # a bound method of an object holding the root (DecodeLoop.self.model = root): a longer path
    assert names.resolve("L['self'].model.model.layers.0.mlp") == "model.layers.0.mlp"
    # a method of an inner module: a shorter path, completed from the root's names
    assert names.resolve("L['self'].layers[0].mlp") == "model.layers.0.mlp"
    assert names.resolve("L['self'].lm_head") == "lm_head"
    assert names.resolve("L['self']") == ""
    assert names.resolve("L['self'].elsewhere.block") == "elsewhere.block"  # unknown: the normalised path


def test_common_module() -> None:
    assert common_module(["layers.0.norm", "layers.0.act", "layers.0"]) == "layers.0"
    assert common_module(["layers.0.fc", "layers.1.fc"]) == "layers"
    assert common_module(["layers.0.fc", "head"]) == ""
    assert common_module(["head"]) == "head"


def test_a_real_cpu_wrapper_is_parsed_in_launch_order() -> None:
    """torch 2.13 CPU: one C++ kernel reused by both blocks (no source comment on CPU), three addmm externs."""
    launches = parse_wrapper((FIXTURES / "cpu_two_blocks_wrapper.py.txt").read_text(), NODES)
    assert not isinstance(launches, str)
    assert [(la.kernel, la.op, la.module) for la in launches] == [
        (None, "aten.addmm", "layers.0.fc"),
        ("cpp_fused_add_gelu_native_layer_norm_0", "cpp_fused_add_gelu_native_layer_norm_0", None),
        (None, "aten.addmm", "layers.1.fc"),  # its source nodes begin with the previous block's (its input)
        ("cpp_fused_add_gelu_native_layer_norm_0", "cpp_fused_add_gelu_native_layer_norm_0", None),
        (None, "aten.addmm", "head"),
    ]
    assert launches[2].source_nodes == ("gelu", "x", "linear_1") and launches[2].spans_modules


def test_a_partitioned_cuda_wrapper_is_parsed_across_partitions() -> None:
    launches = parse_wrapper((FIXTURES / "cuda_partitioned_wrapper.py.txt").read_text(), NODES)
    assert not isinstance(launches, str)
    layer_norm = "triton_per_fused_add_gelu_native_layer_norm_0"
    assert [(la.kernel, la.op, la.module) for la in launches] == [
        (None, "aten.addmm", "layers.0.fc"),
        (layer_norm, "aten.native_layer_norm, aten.gelu, aten.add", "layers.0"),  # fused: the common module
        (None, "aten.mm", "layers.1.fc"),
        (layer_norm, "aten.native_layer_norm, aten.gelu, aten.add", "layers.1"),  # the launch's own comment
        (None, "aten._weight_int8pack_mm", "head"),  # between partitions; the view before it launches nothing
        ("triton_per_fused__softmax_1", "aten._softmax", "head"),  # no launch comment: the definition's
    ]


def test_code_without_call_gives_a_reason() -> None:
    assert parse_wrapper("x = 1\n", NODES) == "inductor's generated code has no call() function"


def _launches() -> list[KernelLaunch]:
    return [
        KernelLaunch(kernel=None, op="aten.mm", module="layers.0.attn.q"),
        KernelLaunch(kernel=None, op="aten.mm", module="layers.0.attn.k"),
        KernelLaunch(kernel="triton_poi_fused_add_1", op="aten.add", module="layers.0.attn"),
        KernelLaunch(kernel=None, op="aten.mm", module="layers.0.mlp.up"),
        KernelLaunch(kernel="triton_poi_fused_add_10", op="aten.add", module="layers.0.mlp"),
        KernelLaunch(kernel=None, op="aten.bmm", module="layers.0.mlp.experts"),
        KernelLaunch(kernel=None, op="aten.bmm", module="layers.0.mlp.experts"),
        KernelLaunch(kernel="triton_poi_fused_add_1", op="aten.add", module="layers.1.attn"),
    ]


def test_kernel_names_match_on_word_boundaries() -> None:
    names = ["triton_poi_fused_add_1", "triton_poi_fused_add_10", "cpp_fused_add_0"]
    assert kernel_of("triton_poi_fused_add_10", names) == "triton_poi_fused_add_10"
    assert kernel_of("triton_poi_fused_add_1_0d1d2de", names) == "triton_poi_fused_add_1"
    assert kernel_of("graph_0_cpp_fused_add_0", names) == "cpp_fused_add_0"
    assert kernel_of("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", names) is None


def test_extern_runs_of_equal_length_match_one_to_one() -> None:
    observed = [
        "nvjet_tst_q",
        "nvjet_tst_k",
        "triton_poi_fused_add_1",
        "gemv2T_kernel",
        "triton_poi_fused_add_10",
        "sm90_xmma_a",
        "sm90_xmma_b",
        "triton_poi_fused_add_1",
    ]
    match = match_kernels(_launches(), observed)
    assert match.modules == (
        "layers.0.attn.q",
        "layers.0.attn.k",
        "layers.0.attn",
        "layers.0.mlp.up",
        "layers.0.mlp",
        "layers.0.mlp.experts",
        "layers.0.mlp.experts",
        "layers.1.attn",  # the second launch of a reused kernel
    )
    assert (match.matched, match.anchors) == (8, 3)
    assert match.launch == (0, 1, 2, 3, 4, 5, 6, 7)


def test_extern_runs_of_other_lengths_go_to_the_externs_common_module() -> None:
    # two kernels for one extern call (a split-K GEMM and its reduction); three for the two q/k calls
    observed = ["nvjet_a", "nvjet_b", "splitk_reduce", "triton_poi_fused_add_1", "gemm_main", "gemm_reduce"]
    match = match_kernels(_launches(), [*observed, "triton_poi_fused_add_10"])
    assert match.modules[:3] == ("layers.0.attn",) * 3  # q and k's common module
    assert match.modules[4:6] == ("layers.0.mlp.up",) * 2
    assert match.launch[:3] == (None, None, None) and match.launch[3] == 2


def test_unmatched_kernels_get_no_module() -> None:
    launches = _launches()[2:5]  # add_1, mm (mlp.up), add_10
    # a kernel before the first anchor with no extern there; an inductor kernel out of order; an extra kernel
    observed = ["memset_kernel", "triton_poi_fused_add_1", "triton_poi_fused_add_10", "triton_poi_fused_add_1"]
    match = match_kernels(launches, observed)
    assert match.modules == (None, "layers.0.attn", "layers.0.mlp", None)
    assert (match.matched, match.anchors) == (2, 2)
    empty = match_kernels([], ["x"])
    assert empty.matched == 0 and empty.note == "no launches were parsed for this graph"


def test_the_best_fitting_graph_is_chosen() -> None:
    other = cm.CompiledGraph(index=0, node_modules={}, launches=(KernelLaunch(kernel="triton_red_x_0", op=""),))
    this = cm.CompiledGraph(index=1, node_modules={}, launches=tuple(_launches()))
    index, match = match_best([other, this], ["nvjet_q", "nvjet_k", "triton_poi_fused_add_1"])
    assert index == 1 and match.matched == 3
    none, empty = match_best([cm.CompiledGraph(index=0, node_modules={}, note="why")], ["k"])
    assert none is None and empty.note == "no compiled graph with parsed launches was recorded"


def test_a_missing_inductor_gives_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cm, "_inductor_entry", lambda: "torch 9 has no torch._inductor.compile_fx.compile_fx")
    recorder = InductorProvenance(nn.Linear(2, 2))
    assert recorder.install() == "torch 9 has no torch._inductor.compile_fx.compile_fx"
    assert recorder.notes == ["torch 9 has no torch._inductor.compile_fx.compile_fx"]
    recorder.uninstall()
    assert "loaded no new wrapper module" in str(cm._wrapper_source([]))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.fc(x))) + x


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.slow
def test_a_cpu_compile_maps_its_profiled_kernels_to_modules() -> None:
    """inductor on the CPU (a few seconds): the recorder sees the graph, the profiler's ops inside the compiled
    graph's call (C++ kernels as `graph_0_cpp_…` with cpp.enable_kernel_profile) align to its launches."""
    torch._dynamo.reset()
    model = _Tiny().eval()
    import torch._inductor.compile_fx as inductor_entry

    entry = inductor_entry.compile_fx
    try:
        with (
            InductorProvenance(model) as recorder,
            torch._inductor.config.patch({"cpp.enable_kernel_profile": True}),
            torch.no_grad(),
        ):
            compiled = torch.compile(model)
            compiled(torch.randn(4, 16))
            with torch.profiler.profile() as prof:
                compiled(torch.randn(4, 16))
        assert inductor_entry.compile_fx is entry  # uninstalled on leaving
    finally:
        torch._dynamo.reset()
    assert len(recorder.graphs) == 1, recorder.notes
    graph = recorder.graphs[0]
    assert {k: graph.node_modules[k] for k in ("linear", "layer_norm", "gelu", "x", "linear_2")} == {
        "linear": "layers.0.fc",
        "layer_norm": "layers.0.norm",
        "gelu": "layers.0.act",
        "x": "layers.0",
        "linear_2": "head",
    }
    call = [e for e in prof.events() if e.name.startswith("## Call CompiledFxGraph")]
    inside = sorted(
        (e for e in prof.events() if e.cpu_parent is not None and e.cpu_parent.name.startswith("## Call")),
        key=lambda e: e.time_range.start,
    )
    assert len(call) == 1 and inside
    match = match_kernels(graph.launches, [e.name for e in inside])
    externs = [m for e, m in zip(inside, match.modules, strict=True) if e.name == "aten::addmm"]
    assert externs == ["layers.0.fc", "layers.1.fc", "head"]
    assert match.anchors == sum(la.kernel is not None for la in graph.launches) >= 1


def test_an_execution_no_inductor_kernel_ties_to_the_graph_is_left_unplaced() -> None:
    """Without one anchor the externs' common module (often the whole model) would be a guess: nothing is placed."""
    launches = (
        KernelLaunch(kernel="triton_poi_fused_add_0", op="add", module="model.layers.0.mlp"),
        KernelLaunch(kernel=None, op="extern_kernels.mm", module="model.layers.0.self_attn.q_proj"),
        KernelLaunch(kernel=None, op="extern_kernels.mm", module="model.lm_head"),
    )
    match = match_kernels(launches, ["nvjet_tst_64x8", "some_other_kernel", "nvjet_tst_64x8"])
    assert match.modules == (None, None, None) and match.anchors == 0 and "no anchor" in match.note

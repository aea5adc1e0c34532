"""Kernels named by what launched them: readable cutlass names, each kernel's largest (operator, module) launchers
from the profiled pass, operators.md's "launched by" column, and Stage 2's kernels joined to a Stage 1 pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest

from helpers import run_main
from llm_perf_opt.instruments.module_attribution import Interval, Launch, Placement, kernel_sources
from llm_perf_opt.kernel_names import short_kernel_name
from llm_perf_opt.nsight.kernel_modules import kernel_modules, sources_for
from llm_perf_opt.records.folders import load_stage1_metrics, load_stage2_metrics
from llm_perf_opt.records.io import RecordError, converter, save
from llm_perf_opt.records.modules import (
    NOT_KNOWN,
    UNATTRIBUTED,
    KernelSources,
    Launcher,
    ModuleTimes,
)
from llm_perf_opt.records.stage1 import OperatorRow, OperatorTable
from llm_perf_opt.report.modules_report import launched_by
from llm_perf_opt.report.stage1_reports import operators_md

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = Path(__file__).parents[1] / "examples" / "stage2-h100-tiny"
GROUPED = (
    "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_23GroupProblemShapeIN4cute5tupleIJiiiEEEEENS1_"
    "10collective13CollectiveMmaINS1_21MainloopSm90GroupedGemmEEEEEEvNT_6ParamsE"
)
ADD = "void at::native::elementwise_kernel<128, 4, at::native::CUDAFunctor_add<c10::BFloat16>>(int, T)"
COPY = "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)>(int)"


def test_cutlass_names_are_read_back_and_say_what_work_they_do() -> None:
    assert short_kernel_name(GROUPED) == "cutlass::device_kernel (grouped GEMM)"
    assert short_kernel_name("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalEEEvNT_6ParamsE") == (
        "cutlass::device_kernel (GEMM)"
    )
    # nsys and ncu demangle: the same kernel gets the same short name
    assert short_kernel_name("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(T1::Params)") == (
        "cutlass::device_kernel (GEMM)"
    )
    assert short_kernel_name("_ZN2at6native18elementwise_kernelILi128ELi4EEEviT1_") == "at::native::elementwise_kernel"
    assert short_kernel_name("_Z10foo_kernelPf") == "foo_kernel"
    assert short_kernel_name("nvjet_tst_128x64_64x4") == "nvjet_tst_128x64_64x4"  # not mangled: unchanged


def _placement() -> Placement:
    stage = Interval(0, 100, "prefill")
    launches = [
        (
            Launch("at::native::elementwise_kernel", 1, 6.0, "aten::copy_", "elementwise_kernel [copy]"),
            "m.layers.0.attn",
        ),
        (
            Launch("at::native::elementwise_kernel", 2, 4.0, "aten::copy_", "elementwise_kernel [copy]"),
            "m.layers.1.attn",
        ),
        (Launch("at::native::elementwise_kernel", 3, 2.0, "aten::add", "elementwise_kernel [add]"), "m.layers.1"),
        (Launch("at::native::elementwise_kernel", 4, 1.0, "aten::copy_", "elementwise_kernel [copy]"), None),
        (Launch("nvjet_x", 5, 3.0, "", ""), ""),
    ]
    placed = [(launch, module, "module ranges") for launch, module in launches]
    return Placement({stage: placed}, [stage], [], False)


def test_each_kernel_label_keeps_its_largest_launchers_folded_across_layers() -> None:
    sources = kernel_sources(_placement())
    copy = sources["elementwise_kernel [copy]"]
    assert copy.kernel == "at::native::elementwise_kernel" and copy.calls == 3 and copy.ms == 11.0
    assert copy.launchers[0] == Launcher("aten::copy_", "m.layers.*.attn", 2, 10.0)
    assert copy.launchers[1] == Launcher("aten::copy_", UNATTRIBUTED, 1, 1.0)
    assert sources["nvjet_x"].launchers == (Launcher("", "(model)", 1, 3.0),)  # the root module; no operator
    text = launched_by(copy)
    assert text == "aten::copy_ in `m.layers.*.attn` (91%), aten::copy_ in outside every module (9%)"
    times = ModuleTimes("GPU kernel time", (), {}, {}, kernel_sources=sources)
    merged = times.sources_of_kernel("at::native::elementwise_kernel")
    assert merged is not None and merged.ms == 13.0 and len(merged.launchers) == 3
    assert launched_by(merged, shown=1) == "aten::copy_ in `m.layers.*.attn` (77%), others 23%"


def test_an_operators_json_written_before_kernel_sources_loads_with_none() -> None:
    plain = {"time_kind": "GPU kernel time", "stages": [], "module_types": {}, "analytic_roots": {}}
    assert converter.structure(plain, ModuleTimes).kernel_sources == {}


def _row(name: str, ms: float) -> OperatorRow:
    return OperatorRow(name, 3, ms, ms, 0.0, 0.0, 0.0)


def _operators(times: ModuleTimes | None) -> OperatorTable:
    kernels = (_row("at::native::elementwise_kernel", 13.0), _row("nvjet_x", 3.0), _row("other", 1.0))
    return OperatorTable("self_device_ms", (), kernels, {}, 10, 1, 0.1, None, modules=times)


def test_operators_md_names_each_kernel_by_what_launched_it() -> None:
    m = load_stage1_metrics(FIXTURES / "metrics" / "h100_full_stage1.json")
    times = ModuleTimes("GPU kernel time", (), {}, {}, kernel_sources=kernel_sources(_placement()))
    text = operators_md(m, _operators(times), 10)
    assert "launched by (operator in module, share)" in text
    assert "|`at::native::elementwise_kernel`|3|13.000|76.5%|aten::copy_ in `m.layers.*.attn` (77%)" in text
    assert "no operator (graph replay or compiled code) in `(model)` (100%)" in text
    assert "|`other`|3|1.000|5.9%|not in the profiled pass's stages|" in text
    assert "Launched by: not recorded" in operators_md(m, _operators(None), 10)


def _stage1_folder(path: Path, sources: dict[str, KernelSources]) -> Path:
    path.mkdir()
    save(_operators(ModuleTimes("GPU kernel time", (), {}, {}, kernel_sources=sources)), path / "operators.json")
    return path


def test_stage2_names_find_their_stage1_launchers_by_label_then_by_name() -> None:
    add = KernelSources("at::native::elementwise_kernel", 2, 2.0, (Launcher("aten::add", "m.layers.*", 2, 2.0),))
    copy = KernelSources("at::native::elementwise_kernel", 1, 6.0, (Launcher("aten::copy_", "m.attn", 1, 6.0),))
    times = ModuleTimes(
        "GPU kernel time",
        (),
        {},
        {},
        kernel_sources={
            "at::native::elementwise_kernel [CUDAFunctor_add]": add,
            "at::native::elementwise_kernel [direct_copy_kernel_cuda]": copy,
        },
    )
    assert sources_for(times, ADD) == add
    ncu_name = "void elementwise_kernel<128, 4, direct_copy_kernel_cuda(TensorIteratorBase &)>(int)"  # no namespace
    assert sources_for(times, ncu_name) == attrs.evolve(copy, kernel="elementwise_kernel")
    # another functor of a function whose functors Stage 1 tells apart: not known, never another functor's modules
    assert sources_for(times, "void at::native::elementwise_kernel<128, 4, MulFunctor<float>>(int)") is None
    plain = attrs.evolve(times, kernel_sources={"at::native::elementwise_kernel": add})  # Stage 1 kept no functor
    assert sources_for(plain, ADD) == attrs.evolve(add, kernel="at::native::elementwise_kernel")
    assert sources_for(times, "void some_other_kernel<1>(int)") is None


def test_stage2_without_a_stage1_pass_says_the_module_is_not_known(tmp_path: Path) -> None:
    m = load_stage2_metrics(EXAMPLE / "metrics.json")
    none = kernel_modules(m, tmp_path)
    assert none.stage1 is None and none.note.startswith(NOT_KNOWN) and not none.kernels
    cpu = tmp_path / "cpu"
    shutil.copytree(FIXTURES / "runs" / "cpu_tiny_v1_stage1", cpu)
    refused = kernel_modules(m, tmp_path, cpu)
    assert refused.note.startswith(NOT_KNOWN) and not refused.kernels
    assert "without module attribution" in refused.note or "CPU operators" in refused.note


def test_stage2_report_names_the_example_kernels_by_a_stage1_pass(tmp_path: Path) -> None:
    demangled = {k.name: k.demangled for k in load_stage2_metrics(EXAMPLE / "metrics.json").top_kernels}
    add = next(
        d for d in [k.demangled for k in load_stage2_metrics(EXAMPLE / "metrics.json").top_kernels] if "add" in d
    )
    assert demangled  # the example lists kernels
    label = "at::native::elementwise_kernel [CUDAFunctor_add]"
    launcher = Launcher("aten::add", "model.sam_model.blocks.*.attn", 32, 0.8)
    stage1 = _stage1_folder(tmp_path / "stage1", {label: KernelSources(short_kernel_name(add), 40, 1.0, (launcher,))})
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    # In this process: test_stage2_pipeline runs the real stage2-report process.
    done = run_main("llm_perf_opt.cli.stage2_report", str(copy), "--stage1", str(stage1))
    assert done.returncode == 0, done.stderr
    kernels = (copy / "kernels.md").read_text()
    assert "launched by (operator in module, share; Stage 1)" in kernels
    assert "|`elementwise_kernel [CUDAFunctor_add]`|prefill|62|" in kernels
    assert "aten::add in `model.sam_model.blocks.*.attn` (80%), others 20%|" in kernels
    assert "not in the Stage 1 profiled pass" in kernels
    record = json.loads((copy / "metrics.json").read_text())["kernel_modules"]
    assert record["stage1"] == str(stage1) and "elementwise_kernel [CUDAFunctor_add]" in record["kernels"]


def test_stage2_report_refuses_a_stage1_folder_that_is_not_there(tmp_path: Path) -> None:
    m = load_stage2_metrics(EXAMPLE / "metrics.json")
    with pytest.raises(RecordError, match="not a Stage 1 run folder"):
        kernel_modules(m, tmp_path, tmp_path / "nowhere")

"""Stage 2's kernels named by the operator and module that launched them, from a Stage 1 profiled pass.

Nsight Systems and Nsight Compute see kernels, not the Python that launched them, and Stage 2's own workload runs
without the torch profiler (both use CUPTI). Stage 1's profiled pass with module attribution records, per kernel label,
its largest launchers (operator, module folded across layers: `ModuleTimes.kernel_sources`). Stage 2 joins its kernels
to those by name: the label Stage 1 gives the same demangled name (function name plus the functor a generic kernel
applies), with or without namespaces (ncu drops some), else the function name alone where that cannot mix functors. The
Stage 1 pass is the one named (`stage2-report --stage1`, `report.stage1_dir`), else the workload's own when it ran the
profiler; without one the kernels' modules are "not known", never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llm_perf_opt.kernel_names import kernel_label, short_kernel_name
from llm_perf_opt.records import folders
from llm_perf_opt.records.io import RecordError, load_file
from llm_perf_opt.records.modules import NOT_KNOWN, KernelSources, ModuleTimes, merged_sources
from llm_perf_opt.records.stage1 import OperatorTable, Stage1Metrics
from llm_perf_opt.records.stage2 import KernelModules, Stage2Metrics

WORKLOAD_DIR = "workload/nsys"
HOW_TO_NAME = (
    "the workload ran without the torch profiler (it and Nsight both use CUPTI); name a Stage 1 folder of the same "
    "workload with `stage2-report <folder> --stage1 <stage1 folder>` or `report.stage1_dir=<stage1 folder>`"
)


def _bare(label: str) -> str:
    """`at::native::elementwise_kernel [add]` -> `elementwise_kernel [add]` (nsys and ncu may drop namespaces)."""
    name, _, functor = label.partition(" [")
    return name.rsplit("::", 1)[-1] + (f" [{functor}" if functor else "")


def sources_for(times: ModuleTimes, full_name: str) -> KernelSources | None:
    """The Stage 1 launchers of the kernel whose demangled name is `full_name`: by label, by label without
    namespaces, else by function name where that cannot mix functors (the name has none, or Stage 1's labels of it
    have none); None when nothing matches."""
    short = short_kernel_name(full_name)
    label = kernel_label(short, full_name)
    if (exact := times.kernel_sources.get(label)) is not None:
        return exact
    entries = times.kernel_sources.items()
    found = merged_sources((e for key, e in entries if _bare(key) == _bare(label)), short)
    if found is not None:
        return found
    same_name = [(key, e) for key, e in entries if _bare(e.kernel) == _bare(short)]
    if label != short and any(" [" in key for key, _ in same_name):
        return None  # Stage 1 tells this function's functors apart, and none is this one
    return merged_sources((e for _, e in same_name), short)


def _kernels(m: Stage2Metrics) -> Iterable[tuple[str, str]]:
    """(name as kernels.md shows it, demangled name) of every kernel Stage 2 lists."""
    for k in (*m.top_kernels, *(k for ks in m.top_kernels_by_stage.values() for k in ks)):
        yield kernel_label(k.name, k.demangled), k.demangled
    for r in m.ncu_kernels:
        yield kernel_label(r.name, r.full_name), r.full_name


def _stage1_of(path: Path) -> tuple[Stage1Metrics | None, ModuleTimes | None]:
    """A Stage 1 folder's metrics (None when it has none) and its profiled pass's module times."""
    operators = path / folders.OPERATORS_FILE
    table = load_file(operators, OperatorTable, versioned=False) if operators.is_file() else None
    metrics_file = path / folders.METRICS_FILE
    metrics = folders.load_stage1_metrics(metrics_file) if metrics_file.is_file() else None
    return metrics, table.modules if table is not None else None


def _refusal(m: Stage2Metrics, metrics: Stage1Metrics | None, times: ModuleTimes | None) -> str | None:
    """Why a Stage 1 folder cannot name this run's kernels; None when it can."""
    if times is None or not times.kernel_sources:
        return "its profiled pass ran without module attribution (or before it kept kernel sources)"
    if metrics is not None and metrics.device.type != "cuda":
        return f"it ran on {metrics.device.name}, whose profiled 'kernels' are CPU operators"
    if metrics is not None and m.model is not None and metrics.model.name != m.model.name:
        return f"it profiled model {metrics.model.name}, not this run's {m.model.name}"
    return None


def kernel_modules(m: Stage2Metrics, run_dir: Path, stage1: Path | str | None = None) -> KernelModules:
    """`m`'s kernels joined with the Stage 1 profiled pass of `stage1` (a Stage 1 folder; a RecordError when it
    cannot be read), else of the workload's own folder when it ran the profiler, else none (see the docstring)."""
    if stage1 is not None and str(stage1).strip():
        chosen = Path(str(stage1)).expanduser()
        if not chosen.is_dir():
            raise RecordError(
                f"{chosen} is not a Stage 1 run folder",
                "Pass a folder written by stage1-run (it holds metrics.json and operators.json)",
            )
        where, (metrics, times) = str(chosen), _stage1_of(chosen)
    elif (Path(run_dir) / WORKLOAD_DIR / folders.OPERATORS_FILE).is_file():
        where, (metrics, times) = WORKLOAD_DIR, _stage1_of(Path(run_dir) / WORKLOAD_DIR)
    else:
        return KernelModules(stage1=None, note=f"{NOT_KNOWN}: {HOW_TO_NAME}")
    refusal = _refusal(m, metrics, times)
    if refusal is not None or times is None:
        return KernelModules(
            stage1=where, note=f"{NOT_KNOWN}: the Stage 1 folder `{where}` cannot name them: {refusal}"
        )
    joined = {label: found for label, full in _kernels(m) if (found := sources_for(times, full)) is not None}
    device = f" on {metrics.device.name}" if metrics is not None else ""
    same = "" if metrics is None or metrics.device.name == m.device.name else " (another GPU than this run's)"
    note = (
        f"Launched by: the Stage 1 profiled pass of `{where}`{device}{same}, joined by kernel name (Stage 1's "
        "module ranges and operators around each launch; shares of the kernel's time in that pass)"
    )
    return KernelModules(stage1=where, note=note, kernels=joined)

"""Kernel time by module: each kernel of the profiled pass given to the module whose forward launched it.

A kernel's launch (its CUDA runtime call, found by correlation id) happened on the host inside nested ranges: the
stage (`stage:…`), the modules (`module:…`, from `instruments.module_ranges`) and the operator that launched it. The
kernel goes to the innermost of each. Its GPU time is never compared with the host ranges (launches are
asynchronous). Module hooks do not run inside compiled code, so the kernels launched inside inductor's
`## Call CompiledFxGraph` range (CUDA-graph replays included) are handed, in launch order, to a resolver for compiled
code when there is one (`instruments.compiled_modules`). Kernels launched where no module range is open and no compiled
code ran (the decode loop's own operations), and compiled kernels nothing could place, are reported as
unattributed, with the reason, never spread over modules or given to the whole model.

On the CPU the "kernels" are the operators themselves, each with its self time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from llm_perf_opt.instruments.profiler_labels import (
    LABEL_PREFIXES,
    MODULE_LABEL_PREFIX,
    STAGE_LABEL_PREFIX,
    is_launch,
)
from llm_perf_opt.kernel_names import kernel_label, short_kernel_name
from llm_perf_opt.measure.module_floors import display_name, fold
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import (
    UNATTRIBUTED,
    KernelSource,
    KernelSources,
    Launcher,
    ModuleTime,
    ModuleTimes,
    StageModuleTimes,
)

TOP_KERNELS = 3  # kernels kept per module row
TOP_LAUNCHERS = 4  # (operator, module) pairs kept per kernel label
MODULE_RANGES = "module ranges"  # the method: forward hooks open a profiler range per module call
GPU_TIME = "GPU kernel time"
CPU_TIME = "CPU operator self time"
OUTSIDE = (
    "launched where no module's forward was running (the decode loop's own operations, a CUDA-graph replay or "
    "compiled code no provenance could place)"
)

COMPILED_CALL_PREFIX = "## Call CompiledFxGraph"  # the host range inductor's compiled code runs in (torch >= 2.5)
#: Resolves the kernels compiled code launched (one stage forward's, in launch order) to module paths.
CompiledResolver = Callable[[Sequence[str]], Sequence[str | None]]


@attrs.frozen
class Interval:
    start: float
    end: float
    label: str


@attrs.frozen
class Launch:
    """One kernel (or, on the CPU, one operator) and where it was launched from."""

    kernel: str  # short name (`kernel_names.short_kernel_name`)
    at: float  # host time of the launch, µs
    ms: float
    operator: str = ""
    label: str = ""  # the short name plus the functor a generic kernel applies (`kernel_names.kernel_label`)


def innermost(intervals: Sequence[Interval], points: Sequence[float]) -> list[Interval | None]:
    """For each point, the innermost of `intervals` (properly nested, as ranges of one thread are) containing it."""
    order = sorted(intervals, key=lambda iv: (iv.start, -iv.end))
    found: list[Interval | None] = [None] * len(points)
    stack: list[Interval] = []
    i = 0
    for index in sorted(range(len(points)), key=points.__getitem__):
        t = points[index]
        while i < len(order) and order[i].start <= t:
            while stack and stack[-1].end < order[i].start:
                stack.pop()
            stack.append(order[i])
            i += 1
        while stack and stack[-1].end < t:
            stack.pop()
        found[index] = stack[-1] if stack else None
    return found


def _labelled(host: Sequence[FunctionEvent], prefix: str) -> list[Interval]:
    return [
        Interval(ev.time_range.start, ev.time_range.end, ev.name[len(prefix) :])
        for ev in host
        if ev.name.startswith(prefix)
    ]


def _is_operator(ev: FunctionEvent) -> bool:
    return (
        not ev.name.startswith(LABEL_PREFIXES)
        and not getattr(ev, "is_python_function", False)
        and getattr(ev, "activity_type", "cpu_op") == "cpu_op"
        and not ev.name.startswith(("cuda", "cu"))
    )


def gpu_launches(
    events: Sequence[FunctionEvent], host: Sequence[FunctionEvent], is_kernel: Callable[[FunctionEvent], bool]
) -> list[Launch]:
    """GPU kernels with the host time of their launch (correlation id) and the operator around it."""
    launch_at = {ev.id: ev.time_range.start for ev in host if is_launch(ev)}
    op_at = {ev.id: ev.time_range.start for ev in host if _is_operator(ev)}
    kernels = []
    for k in events:
        if k.device_type != DeviceType.CUDA or not is_kernel(k):
            continue
        at = launch_at.get(k.id, op_at.get(getattr(k, "linked_correlation_id", 0) or -1))
        if at is not None:
            ms = (k.time_range.end - k.time_range.start) / 1e3
            short = short_kernel_name(k.name)
            kernels.append(Launch(short, at, ms, label=kernel_label(short, k.name)))
    ops = [Interval(ev.time_range.start, ev.time_range.end, ev.name) for ev in host if _is_operator(ev)]
    around = innermost(ops, [k.at for k in kernels])
    return [attrs.evolve(k, operator=op.label if op else "") for k, op in zip(kernels, around, strict=True)]


def cpu_launches(host: Sequence[FunctionEvent]) -> list[Launch]:
    """On the CPU, every operator with its self time."""
    return [
        Launch(ev.name, ev.time_range.start, float(ev.self_cpu_time_total) / 1e3, ev.name)
        for ev in host
        if _is_operator(ev)
    ]


@attrs.define
class _Acc:
    kernels: int = 0
    ms: float = 0.0
    sources: dict[tuple[str, str], list[float]] = attrs.Factory(dict)

    def add(self, launch: Launch) -> None:
        self.kernels += 1
        self.ms += launch.ms
        source = self.sources.setdefault((launch.kernel, launch.operator), [0, 0.0])
        source[0] += 1
        source[1] += launch.ms

    def top(self) -> tuple[KernelSource, ...]:
        ranked = sorted(self.sources.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
        return tuple(KernelSource(kernel=k, operator=op, calls=int(v[0]), ms=v[1]) for (k, op), v in ranked)


Placed = tuple[Launch, str | None, str]  # a launch, its module path (None: unattributed) and the method that placed it


def _stage_table(
    stage: str, forwards: int, placed: Sequence[Placed], calls: Mapping[str, int], compiled_used: bool
) -> StageModuleTimes:
    rows: dict[str, _Acc] = {}
    rest = _Acc()
    for launch, module, _method in placed:
        (rows.setdefault(module, _Acc()) if module is not None else rest).add(launch)
    methods = tuple(sorted({method for _, module, method in placed if module is not None}))
    table = tuple(
        ModuleTime(module=m, calls=calls.get(m, 0), kernels=a.kernels, ms=a.ms, top=a.top())
        for m, a in sorted(rows.items(), key=lambda kv: -kv[1].ms)
    )
    reason = OUTSIDE + ("; inductor's provenance matched none of these" if compiled_used else "")
    return StageModuleTimes(
        stage=stage,
        forwards=forwards,
        total_ms=sum(a.ms for a in rows.values()) + rest.ms,
        rows=table,
        unattributed_ms=rest.ms,
        unattributed_kernels=rest.kernels,
        unattributed_reason=reason if rest.kernels else None,
        methods=methods,
    )


@attrs.frozen
class Placement:
    """Every staged launch of the profiled pass with its module, per stage forward (one stage range)."""

    forwards: Mapping[Interval, list[Placed]]
    stages: Sequence[Interval]
    modules: Sequence[Interval]
    compiled_used: bool


def place(
    launches: Sequence[Launch],
    host: Sequence[FunctionEvent],
    *,
    compiled: CompiledResolver | None = None,
    compiled_method: str = "",
) -> Placement:
    """Each launch inside a stage range given the innermost module range around it; the launches compiled code made
    in one stage forward go to `compiled` (in launch order) when given (`_resolve_compiled`)."""
    stages = _labelled(host, STAGE_LABEL_PREFIX)
    modules = _labelled(host, MODULE_LABEL_PREFIX)
    launches = sorted(launches, key=lambda k: k.at)
    at = [k.at for k in launches]
    in_compiled = innermost(_labelled(host, COMPILED_CALL_PREFIX), at)
    placed: dict[Interval, list[Placed]] = {}
    compiled_code: dict[Interval, list[bool]] = {}
    for launch, stage, module, call in zip(
        launches, innermost(stages, at), innermost(modules, at), in_compiled, strict=True
    ):
        if stage is not None:
            placed.setdefault(stage, []).append((launch, module.label if module else None, MODULE_RANGES))
            compiled_code.setdefault(stage, []).append(call is not None)
    if compiled is not None:
        for stage, items in placed.items():
            _resolve_compiled(items, compiled_code[stage], compiled, compiled_method)
    return Placement(placed, stages, modules, compiled is not None)


def stage_tables(placement: Placement) -> list[StageModuleTimes]:
    """Per stage (innermost stage range around each launch), the launches by module, in the order stages ran."""
    stages, modules, placed = placement.stages, placement.modules, placement.forwards
    module_stage = innermost(stages, [m.start for m in modules])
    by_name: dict[str, list[Interval]] = {}
    for forward in placed:
        by_name.setdefault(forward.label, []).append(forward)
    out = []
    for name in sorted(by_name, key=lambda n: min(f.start for f in by_name[n])):
        calls: dict[str, int] = {}
        for module, stage in zip(modules, module_stage, strict=True):
            if stage is not None and stage.label == name:
                calls[module.label] = calls.get(module.label, 0) + 1
        items = [item for forward in by_name[name] for item in placed[forward]]
        # per decode step; any other stage once per profiled pass (a vision stage may run once per view)
        forwards = len([s for s in stages if s.label == name]) if name == vocab.DECODE_STEP else 1
        out.append(_stage_table(name, forwards, items, calls, placement.compiled_used))
    return out


def attribute(
    launches: Sequence[Launch],
    host: Sequence[FunctionEvent],
    *,
    compiled: CompiledResolver | None = None,
    compiled_method: str = "",
) -> list[StageModuleTimes]:
    """Per stage, the launches by innermost module range (`place`, then `stage_tables`)."""
    return stage_tables(place(launches, host, compiled=compiled, compiled_method=compiled_method))


def kernel_sources(placement: Placement) -> dict[str, KernelSources]:
    """Per kernel label, its largest launchers: (operator, module folded across layers), over every stage."""
    acc: dict[str, dict[tuple[str, str], list[float]]] = {}
    short: dict[str, str] = {}
    for items in placement.forwards.values():
        for launch, module, _method in items:
            label = launch.label or launch.kernel
            short.setdefault(label, launch.kernel)
            where = display_name(fold(module)) if module is not None else UNATTRIBUTED
            total = acc.setdefault(label, {}).setdefault((launch.operator, where), [0, 0.0])
            total[0] += 1
            total[1] += launch.ms
    out = {}
    for label, by_source in acc.items():
        ranked = sorted(by_source.items(), key=lambda kv: -kv[1][1])
        out[label] = KernelSources(
            kernel=short[label],
            calls=int(sum(v[0] for v in by_source.values())),
            ms=sum(v[1] for v in by_source.values()),
            launchers=tuple(
                Launcher(operator=op, module=m, calls=int(v[0]), ms=v[1]) for (op, m), v in ranked[:TOP_LAUNCHERS]
            ),
        )
    return out


def _resolve_compiled(
    items: list[Placed], in_compiled_code: Sequence[bool], compiled: CompiledResolver, method: str
) -> None:
    """Give `compiled`, in launch order, the launches of one stage forward that compiled code made (inside
    inductor's `## Call CompiledFxGraph` range, CUDA-graph replays included). Module hooks do not run inside
    compiled code, so the range around such a launch is only an ancestor: a launch the resolver cannot place keeps
    it, unless that is the whole model's (then it is unattributed, never a silent 100% to the root)."""
    code = [i for i, inside in enumerate(in_compiled_code) if inside]
    if not code:
        return
    resolved = compiled([items[i][0].kernel for i in code])
    for i, module in zip(code, resolved, strict=True):
        launch, around, _method = items[i]
        if module is not None:
            items[i] = (launch, module, method)
        elif around == "":
            items[i] = (launch, None, MODULE_RANGES)


def module_times(
    events: Sequence[FunctionEvent],
    *,
    on_cuda: bool,
    is_kernel: Callable[[FunctionEvent], bool],
    types: Mapping[str, str],
    roots: Mapping[str, str],
    compiled: CompiledResolver | None = None,
    compiled_method: str = "",
    notes: Sequence[str] = (),
) -> ModuleTimes:
    """The profiled pass's kernel time by stage and module (see the module docstring)."""
    cpu = [ev for ev in events if ev.device_type == DeviceType.CPU]
    labelled_threads = {ev.thread for ev in cpu if ev.name.startswith(STAGE_LABEL_PREFIX)}
    host = [ev for ev in cpu if ev.thread in labelled_threads] if labelled_threads else cpu
    launches = gpu_launches(events, host, is_kernel) if on_cuda else cpu_launches(host)
    placement = place(launches, host, compiled=compiled, compiled_method=compiled_method)
    return ModuleTimes(
        time_kind=GPU_TIME if on_cuda else CPU_TIME,
        stages=tuple(stage_tables(placement)),
        module_types=dict(types),
        analytic_roots=dict(roots),
        method_notes=tuple(notes),
        kernel_sources=kernel_sources(placement),
    )

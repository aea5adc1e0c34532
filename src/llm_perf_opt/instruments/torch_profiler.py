"""The profiled pass: one image (or a batch) under `torch.profiler`, bounded to prefill + the first N decode steps
(and, for a batch, to the vision of its first few inputs).

It is never one of the timed passes (the profiler slows the model down). Operators are aggregated from the
profiler's events without double counting: self times add up to the total; inclusive times do not.
Each operator is attributed to the innermost stage span (`record_function` labels) that encloses it.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import logging
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.compiled_modules import InductorProvenance, compiled_resolver
from llm_perf_opt.instruments.module_attribution import module_times
from llm_perf_opt.instruments.module_ranges import ModuleRanges, module_ranges, module_types
from llm_perf_opt.instruments.profiler_labels import LABEL_PREFIXES, STAGE_LABEL_PREFIX, is_launch
from llm_perf_opt.instruments.timing import NullRecorder, StageRecorder
from llm_perf_opt.kernel_names import short_kernel_name
from llm_perf_opt.measure.kernel_activity import PREFILL_STEP, KernelSpan, decode_activity
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import PROVENANCE_METHOD_NAME, ModuleTimes
from llm_perf_opt.records.stage1 import CallSite, DecodeActivity, OperatorRow, OperatorTable, ShapeGroup

log = logging.getLogger(__name__)

PROFILE_ATTEMPTS = 3  # profiled passes tried when torch cannot read back its own events
SHAPE_GROUPS = 3  # input-shape groups kept per operator
CALL_SITES = 2  # call sites kept per operator
SITE_FRAMES = 3  # user-code frames per call site
# Frames of the framework rather than the model: torch itself, module plumbing and transformers' wrappers.
_FRAMEWORK_FRAMES = (
    "torch/",
    "<built-in",
    "nn.Module:",
    "transformers/utils/",
    "transformers/modeling_layers.py",
    "contextlib.py",
    "functools.py",
)


class _ProfilerLabels(StageRecorder):
    """A recorder that also opens a `record_function` label per span, so operators map to stages."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, nvtx=True)
        self._labels: dict[str, list[record_function]] = {}

    def begin(self, name: str) -> None:
        label = record_function(STAGE_LABEL_PREFIX + name)
        label.__enter__()
        self._labels.setdefault(name, []).append(label)
        super().begin(name)

    def end(self, name: str) -> None:
        super().end(name)
        self._labels[name].pop().__exit__(None, None, None)


def _device_time(event: FunctionEvent, attr: str) -> float:
    value = getattr(event, attr, None)  # torch >= 2.4 names it "device"; older builds "cuda"
    if value is None:
        value = getattr(event, attr.replace("device", "cuda"), 0.0)
    return float(value or 0.0)


class DeviceTimes:
    """Each event's device time, total and self, as torch's `FunctionEvent` defines them, but computed once per
    event: torch's properties re-sum an operator's whole subtree on every read, and the pass's tables read every
    operator more than once (O(depth x events) calls; cProfile on the H100, 2026-11-26, counted 460k of them in one
    profiled pass). Events torch treats otherwise (legacy, async, device-side, older builds) read torch's own."""

    def __init__(self) -> None:
        self._total: dict[int, float] = {}  # by id(): the events outlive this object

    @staticmethod
    def _summed(ev: FunctionEvent) -> bool:
        """A host event whose device time torch sums from its kernels and its children's."""
        return (
            ev.device_type == DeviceType.CPU
            and getattr(ev, "is_legacy", None) is False
            and getattr(ev, "is_async", None) is False
            and bool(getattr(ev, "use_device", None))
            and hasattr(ev, "kernels")
        )

    def total(self, ev: FunctionEvent) -> float:
        """`device_time_total` (µs): the event's kernels and its children's, computed once."""
        cached = self._total.get(id(ev))
        if cached is not None:
            return cached
        if self._summed(ev):
            value = float(sum(k.duration for k in ev.kernels) + sum(self.total(ch) for ch in ev.cpu_children))
        else:
            value = _device_time(ev, "device_time_total")
        self._total[id(ev)] = value
        return value

    def own(self, ev: FunctionEvent) -> float:
        """`self_device_time_total` (µs): the total less its children's."""
        if self._summed(ev):
            return self.total(ev) - sum(self.total(ch) for ch in ev.cpu_children)
        return _device_time(ev, "self_device_time_total")


def _stage_of(event: FunctionEvent, known: dict[int, str | None]) -> str | None:
    """The stage label innermost around `event` (decode steps count as `decode`); `known`: the answers so far, by
    event id, so that each ancestor is looked at once over a whole pass."""
    parent = event.cpu_parent
    if parent is None:
        return None
    key = id(parent)
    if key not in known:
        if parent.name.startswith(STAGE_LABEL_PREFIX):
            stage = parent.name[len(STAGE_LABEL_PREFIX) :]
            known[key] = vocab.DECODE if stage == vocab.DECODE_STEP else stage
        else:
            known[key] = _stage_of(parent, known)
    return known[key]


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


def operator_name(name: str) -> str:
    """A profiler event name without object addresses (`<built-in method x of Y object at 0x7f…>` -> `… of Y>`), so
    the same operator aggregates to one row across runs."""
    return _ADDRESS.sub("", name)


def _user_frame(frame: str) -> str | None:
    """`pkg/models/x/modeling_x.py(594): forward` -> `modeling_x.py(594): forward`; None for a framework frame."""
    if not frame or any(frame.startswith(p) or f"/{p}" in frame.split("(", 1)[0] for p in _FRAMEWORK_FRAMES):
        return None
    path, sep, rest = frame.partition("(")
    return path.rsplit("/", 1)[-1] + sep + rest


def call_site(event: FunctionEvent) -> tuple[str, ...]:
    """The innermost user-code frames an operator was called from: its Python-function ancestors in the profiler's
    tree (`with_stack` in recent torch), or the event's own `stack` strings (older builds)."""
    frames: list[str] = []
    parent = event.cpu_parent
    while parent is not None and len(frames) < SITE_FRAMES:
        if getattr(parent, "is_python_function", False) and (frame := _user_frame(parent.name)):
            frames.append(frame)
        parent = parent.cpu_parent
    if not frames:
        for entry in getattr(event, "stack", None) or ():
            if (frame := _user_frame(str(entry))) is not None:
                frames.append(frame)
                if len(frames) == SITE_FRAMES:
                    break
    return tuple(frames)


class _Details:
    """Per-operator details the profiled pass recorded: input-shape groups, memory, call sites."""

    def __init__(self, *, shapes: bool, memory: bool, device: bool, stacks: bool) -> None:
        self.shapes, self.memory, self.device, self.stacks = shapes, memory, device, stacks
        self._shape_acc: dict[str, dict[str, list[float]]] = {}
        self._memory: dict[str, list[int]] = {}
        self._sites: dict[str, Counter[tuple[str, ...]]] = {}

    def add(self, name: str, ev: FunctionEvent, own_device: float, self_cpu: float) -> None:
        """One event of operator `name`, with its own device time and self host time (µs) already read."""
        if self.shapes:
            group = self._shape_acc.setdefault(name, {}).setdefault(str(ev.input_shapes or []), [0, 0.0, 0.0])
            group[0] += 1
            group[1] += own_device
            group[2] += self_cpu
        if self.memory:
            mem = self._memory.setdefault(name, [0, 0])
            mem[0] += int(ev.self_cpu_memory_usage or 0)
            mem[1] += int(getattr(ev, "self_device_memory_usage", 0) or 0)
        if self.stacks and (site := call_site(ev)):
            self._sites.setdefault(name, Counter())[site] += 1

    def fields(self, name: str) -> dict[str, Any]:
        """The OperatorRow fields for `name` (only those recorded)."""
        out: dict[str, Any] = {}
        if self.shapes:
            groups = sorted(self._shape_acc.get(name, {}).items(), key=lambda kv: (-kv[1][0], -kv[1][1] - kv[1][2]))
            out["shapes"] = tuple(
                ShapeGroup(shapes=k, calls=int(v[0]), self_device_ms=v[1] / 1e3, self_cpu_ms=v[2] / 1e3)
                for k, v in groups[:SHAPE_GROUPS]
            )
        if self.memory:
            cpu, dev = self._memory.get(name, [0, 0])
            out["self_cpu_memory_bytes"] = cpu
            out["self_device_memory_bytes"] = dev if self.device else None
        if self.stacks:
            sites = self._sites.get(name, Counter())
            out["call_sites"] = tuple(CallSite(frames=f, calls=c) for f, c in sites.most_common(CALL_SITES))
            out["call_site_count"] = len(sites)
        return out


# An event's figures, read once per pass: own and total device time, self and total host time (µs), FLOPs.
Figures = tuple[float, float, float, float, float]
Measured = tuple[FunctionEvent, str, Figures]  # an event, the name its table row takes, its figures


def _measured(events: Iterable[FunctionEvent], times: DeviceTimes, name_of: Callable[[str], str]) -> list[Measured]:
    """Each event with its row name and figures, read once (torch's time properties re-walk the event's children on
    every read, and an operator appears in the overall table and in its stage's)."""
    out: list[Measured] = []
    for ev in events:
        flops = float(getattr(ev, "flops", 0) or 0)
        figures = (times.own(ev), times.total(ev), float(ev.self_cpu_time_total), float(ev.cpu_time_total), flops)
        out.append((ev, name_of(ev.name), figures))
    return out


def _aggregate(measured: Iterable[Measured], sort_key: str, details: _Details | None = None) -> tuple[OperatorRow, ...]:
    acc: dict[str, list[float]] = {}
    for ev, name, figures in measured:
        row = acc.get(name)
        if row is None:
            row = acc[name] = [0, 0.0, 0.0, 0.0, 0.0, 0.0]
        row[0] += 1
        for k, value in enumerate(figures, 1):  # own and total device, self and total host time, FLOPs
            row[k] += value
        if details is not None:
            details.add(name, ev, figures[0], figures[2])
    rows = [
        OperatorRow(
            name=name,
            calls=int(v[0]),
            self_device_ms=v[1] / 1e3,
            total_device_ms=v[2] / 1e3,
            self_cpu_ms=v[3] / 1e3,
            total_cpu_ms=v[4] / 1e3,
            flops=v[5],
            **(details.fields(name) if details is not None else {}),
        )
        for name, v in acc.items()
    ]
    return tuple(sorted(rows, key=lambda r: getattr(r, sort_key), reverse=True))


ACTIVITY_METHOD = (
    "torch.profiler (CUPTI via Kineto), the profiled pass: each GPU kernel is tied to the host call that launched it "
    "by its correlation id (kernels replayed from a CUDA graph carry their cudaGraphLaunch's), and that call to the "
    "prefill or decode-step span enclosing it on the host thread; a kernel's own GPU time is never compared with the "
    "host spans (launches are asynchronous). Busy = union of a step's kernel intervals; wall = from the step's host "
    "start (or the previous step's last kernel end, if later) to its last kernel end (or host end, if later). "
    "Memory copies and sets are not counted as kernels."
)


_NOT_KERNEL = re.compile(r"^(Memcpy|Memset|\[memory\])")


def _is_kernel(ev: FunctionEvent) -> bool:
    kind = getattr(ev, "activity_type", None)
    if kind:
        return bool(kind == "kernel")
    on_gpu = ev.device_type == DeviceType.CUDA
    return on_gpu and not ev.name.startswith(LABEL_PREFIXES) and not _NOT_KERNEL.match(ev.name)


def kernel_filter(everything: Sequence[FunctionEvent]) -> Callable[[FunctionEvent], bool]:
    """`_is_kernel`, less the device-side copies of host annotations: torch builds without
    `FunctionEvent.activity_type` list a `record_function` range (e.g. inductor's "## Call CompiledFxGraph … ##") on
    the GPU too, under the host range's name, spanning the kernels launched inside it. A GPU event under a host event's
    name is still a kernel when a launch call (correlation id) launched it and it spans no kernel of another name:
    inductor wraps each triton kernel's launch in a host range of the kernel's own name, so compiled code without CUDA
    graphs would otherwise lose every triton kernel. The span test is needed because a host range's id and a launch's
    correlation id are counted apart and can be equal (on the H100 a compiled SAM graph's copy, 12.4 ms, was counted
    as a kernel beside its own kernels)."""
    host = [ev for ev in everything if ev.device_type == DeviceType.CPU]
    host_names = {ev.name for ev in host}
    launched = {ev.id for ev in host if is_launch(ev)}
    on_gpu = sorted((ev for ev in everything if _is_kernel(ev)), key=lambda ev: ev.time_range.start)
    copies = {id(ev) for ev in on_gpu if ev.name in host_names and _spans_another(ev, on_gpu)}
    return lambda ev: _is_kernel(ev) and (ev.name not in host_names or (ev.id in launched and id(ev) not in copies))


def _spans_another(ev: FunctionEvent, by_start: Sequence[FunctionEvent]) -> bool:
    """Whether a GPU event of another name runs inside `ev`'s interval, and not over exactly the same one (`by_start`:
    GPU events by start)."""
    start, end = ev.time_range.start, ev.time_range.end
    first = bisect.bisect_left(by_start, start, key=lambda e: e.time_range.start)
    for other in by_start[first:]:
        if other.time_range.start >= end:
            return False
        inside = other.time_range.end <= end and (other.time_range.start, other.time_range.end) != (start, end)
        if inside and other.name != ev.name:
            return True
    return False


def _step_spans(events: Sequence[FunctionEvent]) -> dict[int, tuple[float, float]]:
    """Host spans of the profiled forward passes: 0 = prefill, 1… = decode steps in order."""
    host = [ev for ev in events if ev.device_type == DeviceType.CPU]
    spans: dict[int, tuple[float, float]] = {}
    prefill = [ev for ev in host if ev.name == STAGE_LABEL_PREFIX + vocab.PREFILL]
    if prefill:
        spans[PREFILL_STEP] = (prefill[0].time_range.start, prefill[0].time_range.end)
    steps = sorted(
        (ev for ev in host if ev.name == STAGE_LABEL_PREFIX + vocab.DECODE_STEP), key=lambda e: e.time_range.start
    )
    for i, ev in enumerate(steps, 1):
        spans[i] = (ev.time_range.start, ev.time_range.end)
    return spans


def kernel_activity(
    events: Sequence[FunctionEvent], is_kernel: Callable[[FunctionEvent], bool] | None = None
) -> DecodeActivity | None:
    """Kernels per decode step and per prefill, with busy and wall time, from the profiler's events (CUDA runs);
    `is_kernel`: the pass's :func:`kernel_filter`, when the caller has built it already."""
    is_kernel = is_kernel or kernel_filter(events)
    kernels = [ev for ev in events if ev.device_type == DeviceType.CUDA and is_kernel(ev)]
    spans = _step_spans(events)
    if not kernels or not spans:
        return None
    launch_at = {ev.id: ev.time_range.start for ev in events if ev.device_type == DeviceType.CPU and is_launch(ev)}
    op_at = {
        ev.id: ev.time_range.start
        for ev in events
        if ev.device_type == DeviceType.CPU and getattr(ev, "activity_type", "cpu_op") == "cpu_op"
    }
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    starts = [span[0] for _, span in order]
    tied: list[KernelSpan] = []
    for k in kernels:
        at = launch_at.get(k.id, op_at.get(getattr(k, "linked_correlation_id", 0) or -1))
        i = bisect.bisect_right(starts, at) - 1 if at is not None else -1
        if i >= 0 and at is not None and at <= order[i][1][1]:
            tied.append((order[i][0], k.time_range.start, k.time_range.end))
    if not tied:  # no kernel could be tied to a step: say nothing rather than 0 kernels per step
        log.warning("profiled pass: none of its %d GPU kernels could be tied to a prefill or decode step", len(kernels))
        return None
    return decode_activity(tied, spans, unattributed=len(kernels) - len(tied), method=ACTIVITY_METHOD)


def profile_image(
    session: Any,
    paths: Sequence[Path],
    *,
    decode_steps: int,
    record_shapes: bool,
    profile_memory: bool,
    with_stack: bool,
    with_flops: bool,
    trace_path: Path | None,
    modules: bool = False,
    gpu_idle: AbstractContextManager[None] | None = None,
    cache_tokens: int = 0,
    max_vision_inputs: int = 0,
) -> OperatorTable:
    """Run one input (or, for a batched run, its first batch: `paths`) under the profiler (prefill + `decode_steps`
    decode steps) and build its operator table; with `modules`, the kernel time by module too (module ranges
    around every forward; compiled code's kernels, CUDA-graph replays included, by inductor's provenance).
    `gpu_idle` is entered around the post-processing, which runs on the host only (the energy pass's idle
    window). `cache_tokens`: the new tokens the timed passes' static caches hold, so this shorter pass reuses their
    cache and compiled graphs instead of compiling its own. `max_vision_inputs` (0: all): a batch's inputs whose
    vision runs under the profiler; the others' is run before (their input embeddings kept), so a large batch adds
    no events of its own beyond the prefill and decode steps, which stay the whole batch's; with compiled vision all
    of them (the timed passes' view shapes, compiled already)."""
    batch = [session.prepare(path) for path in paths]
    bounded = len(batch) > 1 and 0 < max_vision_inputs < len(batch)
    if bounded and session.runtime.compile_vision != "none":
        # Fewer inputs' views are other shapes, which compiled vision would compile (and capture) again, for longer
        # than the whole batch's vision takes: its compiled forwards launch few events, so all of it is profiled.
        log.info("profiled pass: the vision of all %d inputs (compiled vision: no bound)", len(batch))
        bounded = False
    if bounded:
        log.info(
            "profiled pass: the vision of %d of the batch's %d inputs under the profiler, the other %d embedded first",
            max_vision_inputs,
            len(batch),
            len(batch) - max_vision_inputs,
        )
    kept = session.embeddings_kept(batch, max_vision_inputs) if bounded else contextlib.nullcontext()

    def forward(recorder: StageRecorder) -> None:
        if len(batch) == 1:
            session.generate(batch[0], decode_steps + 1, recorder)
        else:  # a batched run profiles its first batch
            session.generate_batch(batch, decode_steps + 1, recorder)

    with kept, _attribution(session, modules) as attribution, session.caches_sized_for(cache_tokens):
        if session.runtime.compiles:
            # One pass untimed and unprofiled first, so the profile shows steady state: with the timed passes' cache
            # length and inductor's provenance recorded since their compile (`compiled_provenance`), nothing compiles
            # here (module hooks added after a compile are not guarded on); otherwise its compilation happens here.
            forward(NullRecorder(session.device))
        prof, everything, started = _profiled_pass(
            session.device,
            forward,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
        )
    with gpu_idle or contextlib.nullcontext():
        flags = (record_shapes, profile_memory, with_stack)
        table = _operator_table(session, prof, everything, started, attribution, decode_steps, trace_path, flags)
    return attrs.evolve(table, inputs=len(batch), vision_inputs=max_vision_inputs if bounded else None)


def _operator_table(
    session: Any,
    prof: profile,
    everything: Sequence[FunctionEvent],
    started: float,
    attribution: _Attribution | None,
    decode_steps: int,
    trace_path: Path | None,
    flags: tuple[bool, bool, bool],
) -> OperatorTable:
    """The profiled pass's tables, kernel activity and module times (host-side work only)."""
    record_shapes, profile_memory, with_stack = flags
    events = _operator_events(everything)
    on_cuda = session.device.type == "cuda"
    sort_key = "self_device_ms" if on_cuda else "self_cpu_ms"
    times = DeviceTimes()  # shared by every table: each event's device times computed once
    measured = _measured(events, times, operator_name)
    by_stage_events: dict[str, list[Measured]] = {}
    stages: dict[int, str | None] = {}
    for item in measured:
        by_stage_events.setdefault(_stage_of(item[0], stages) or "other", []).append(item)

    def details() -> _Details | None:  # a fresh accumulator per table
        if not (record_shapes or profile_memory or with_stack):
            return None
        return _Details(shapes=record_shapes, memory=profile_memory, device=on_cuda, stacks=with_stack)

    is_kernel = kernel_filter(everything)  # built once: it reads every event of the pass
    overall = _aggregate(measured, sort_key, details())
    by_stage = {stage: _aggregate(items, sort_key, details()) for stage, items in by_stage_events.items()}
    kernels = _measured(_kernel_events(everything, is_kernel), times, short_kernel_name)
    written = _write_trace(prof, trace_path) if trace_path is not None else None
    return OperatorTable(
        sort_key=sort_key,
        overall=overall,
        kernels=_aggregate(kernels, "self_device_ms"),
        by_stage=by_stage,
        events=len(events),
        decode_steps=decode_steps,
        postprocess_s=time.perf_counter() - started,
        trace_path=written,
        activity=kernel_activity(everything, is_kernel) if on_cuda else None,
        modules=attribution.times(everything, on_cuda, is_kernel) if attribution is not None else None,
        torch_parse_s=torch_parse_s(prof),
    )


def torch_parse_s(prof: profile) -> float | None:
    """How long torch took to parse the pass into its events and their tree (the first `events()` call), from the
    profiler's own statistics; None where this torch does not keep them."""
    stats = getattr(getattr(prof, "profiler", None), "_stats", None)
    parse = getattr(stats, "parse_kineto_call_duration_us", None)
    tree = getattr(stats, "function_events_build_tree_call_duration_us", None)
    if not isinstance(parse, int) or not isinstance(tree, int) or parse + tree <= 0:
        return None
    return (parse + tree) / 1e6


class _Attribution:
    """Module attribution of the profiled pass: the module ranges, and inductor's provenance for compiled code."""

    def __init__(self, session: Any, ranges: ModuleRanges, provenance: InductorProvenance | None, why: str | None):
        self.session, self.ranges, self.provenance = session, ranges, provenance
        self.notes = [why] if why else []

    def times(
        self, everything: Sequence[FunctionEvent], on_cuda: bool, is_kernel: Callable[[FunctionEvent], bool]
    ) -> ModuleTimes:
        notes = list(self.notes)
        if refused := self.ranges.refused:
            notes.append(f"{len(refused)} modules took no hooks (their kernels go to their parent): {refused[0]}")
        if kept := self.ranges.kept:
            notes.append(
                f"{len(kept)} modules with hooks of their own (e.g. {kept[0]}) got no range, so the compiled graphs "
                "that traced those hooks are not compiled again: their eager kernels go to their parent module"
            )
        if self.provenance is not None:
            notes += self.provenance.notes
        return module_times(
            everything,
            on_cuda=on_cuda,
            is_kernel=is_kernel,
            types=module_types(self.session.model),
            roots=self.session.adapter.analytic_module_roots(self.session.model),
            compiled=compiled_resolver(self.provenance) if self.provenance is not None else None,
            compiled_method=PROVENANCE_METHOD_NAME,
            notes=notes,
        )


@contextlib.contextmanager
def _attribution(session: Any, modules: bool) -> Iterator[_Attribution | None]:
    """Module ranges around every forward (and, for a compiled runtime, inductor's provenance: the session's, recorded
    since before its first compile, else a recorder installed here for the graphs compiled while inside) while
    inside; None when module attribution is off."""
    if not modules:
        yield None
        return
    provenance = session.compiled_provenance
    own = InductorProvenance(session.model) if provenance is None and session.runtime.compiles else None
    why = own.install() if own is not None else None
    try:
        with module_ranges(session.model, skip=session.traced_hooked_modules()) as ranges:
            yield _Attribution(session, ranges, provenance or own, why)
    finally:
        if own is not None:
            own.uninstall()


def _profiled_pass(
    device: torch.device,
    forward: Callable[[StageRecorder], None],
    *,
    record_shapes: bool,
    profile_memory: bool,
    with_stack: bool,
    with_flops: bool,
) -> tuple[profile, Sequence[FunctionEvent], float]:
    """Profile one `forward` pass: the profiler, its events and when reading them started (the post-processing
    clock). torch's Python tracer (with_stack) now and then garbles one frame name, mostly on a process's first
    profile; the events cannot be read then, so the pass is profiled again, up to PROFILE_ATTEMPTS times."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for attempt in range(1, PROFILE_ATTEMPTS + 1):
        with profile(
            activities=activities,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
        ) as prof:
            forward(_ProfilerLabels(device))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        started = time.perf_counter()
        try:
            return prof, prof.events(), started
        except UnicodeDecodeError as err:
            if attempt == PROFILE_ATTEMPTS:
                raise UserError(
                    f"torch.profiler returned an unreadable event name in {PROFILE_ATTEMPTS} profiled passes ({err})",
                    "set pipeline.torch_profiler.with_stack=false (the Python frame names are what it garbles)",
                ) from err
            log.warning("profiled pass %d: torch.profiler garbled an event name (%s); profiling it again", attempt, err)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _operator_events(everything: Sequence[FunctionEvent]) -> list[FunctionEvent]:
    """Host-side operators only: a kernel also appears as its own device event, and counting both would add its
    time twice (the kernels get their own table); stage labels and Python frames (with_stack) are no operators."""
    return [
        ev
        for ev in everything
        if ev.device_type == DeviceType.CPU
        and not ev.name.startswith(LABEL_PREFIXES)
        and not getattr(ev, "is_python_function", False)
    ]


def _kernel_events(
    everything: Sequence[FunctionEvent], is_kernel: Callable[[FunctionEvent], bool]
) -> list[FunctionEvent]:
    """Device-side events, less the device copies of host annotations (the stage and module labels, inductor's);
    `is_kernel`: the pass's :func:`kernel_filter`."""
    return [
        ev
        for ev in everything
        if ev.device_type == DeviceType.CUDA
        and not ev.name.startswith(LABEL_PREFIXES)
        and (is_kernel(ev) or _NOT_KERNEL.match(ev.name))
    ]


def _write_trace(prof: profile, trace_path: Path) -> str:
    """The profiled pass as a gzipped Chrome trace at `trace_path` (foo.json.gz)."""
    raw = trace_path.with_suffix("")  # foo.json.gz -> foo.json
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(trace_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return str(trace_path)

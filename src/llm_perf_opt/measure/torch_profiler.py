"""The profiled pass: one image under `torch.profiler`, bounded to prefill + the first N decode steps.

It is never one of the timed passes (the profiler slows the model down). Operators are aggregated from the
profiler's events without double counting: self times add up to the total; inclusive times do not.
Each operator is attributed to the innermost stage span (`record_function` labels) that encloses it.
"""

from __future__ import annotations

import gzip
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from llm_perf_opt.kernel_names import short_kernel_name
from llm_perf_opt.measure.timing import StageRecorder
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import OperatorRow, OperatorTable

STAGE_LABEL_PREFIX = "stage:"


class _ProfilerLabels(StageRecorder):
    """A recorder that also opens a `record_function` label per span, so operators map to stages."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, nvtx=True)
        self._labels: dict[str, list[Any]] = {}

    def begin(self, name: str) -> None:
        label = record_function(STAGE_LABEL_PREFIX + name)
        label.__enter__()
        self._labels.setdefault(name, []).append(label)
        super().begin(name)

    def end(self, name: str) -> None:
        super().end(name)
        self._labels[name].pop().__exit__(None, None, None)


def _device_time(event: Any, attr: str) -> float:
    value = getattr(event, attr, None)  # torch >= 2.4 names it "device"; older builds "cuda"
    if value is None:
        value = getattr(event, attr.replace("device", "cuda"), 0.0)
    return float(value or 0.0)


def _stage_of(event: Any) -> str | None:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(STAGE_LABEL_PREFIX):
            stage = parent.name[len(STAGE_LABEL_PREFIX) :]
            # Attribute decode steps to `decode` for the per-stage table.
            return vocab.DECODE if stage == vocab.DECODE_STEP else stage
        parent = parent.cpu_parent
    return None


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


def operator_name(name: str) -> str:
    """A profiler event name without object addresses (`<built-in method x of Y object at 0x7f…>` -> `… of Y>`), so
    the same operator aggregates to one row across runs."""
    return _ADDRESS.sub("", name)


def _aggregate(
    events: Iterable[Any], sort_key: str, name_of: Callable[[str], str] = operator_name
) -> tuple[OperatorRow, ...]:
    acc: dict[str, list[float]] = {}
    for ev in events:
        row = acc.setdefault(name_of(ev.name), [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += _device_time(ev, "self_device_time_total")
        row[2] += _device_time(ev, "device_time_total")
        row[3] += float(ev.self_cpu_time_total)
        row[4] += float(ev.cpu_time_total)
        row[5] += float(getattr(ev, "flops", 0) or 0)
    rows = [
        OperatorRow(
            name=name,
            calls=int(v[0]),
            self_device_ms=v[1] / 1e3,
            total_device_ms=v[2] / 1e3,
            self_cpu_ms=v[3] / 1e3,
            total_cpu_ms=v[4] / 1e3,
            flops=v[5],
        )
        for name, v in acc.items()
    ]
    return tuple(sorted(rows, key=lambda r: getattr(r, sort_key), reverse=True))


def profile_image(
    session: Any,
    image_path: Path,
    *,
    decode_steps: int,
    record_shapes: bool,
    profile_memory: bool,
    with_stack: bool,
    with_flops: bool,
    trace_path: Path | None,
) -> OperatorTable:
    """Run one image under the profiler (prefill + `decode_steps` decode steps) and build its operator table."""
    activities = [ProfilerActivity.CPU]
    if session.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prepared = session.prepare(image_path)
    recorder = _ProfilerLabels(session.device)
    with profile(
        activities=activities,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        with_flops=with_flops,
    ) as prof:
        session.generate(prepared, decode_steps + 1, recorder)
        if session.device.type == "cuda":
            torch.cuda.synchronize(session.device)
    started = time.perf_counter()
    everything = prof.events()
    # Host-side operators only: a kernel also appears as its own device event, and counting both would add
    # its time twice. The kernels get their own table.
    events = [
        ev for ev in everything if ev.device_type == DeviceType.CPU and not ev.name.startswith(STAGE_LABEL_PREFIX)
    ]
    # Device-side copies of the stage labels are annotations, not kernels.
    kernel_events = [
        ev for ev in everything if ev.device_type == DeviceType.CUDA and not ev.name.startswith(STAGE_LABEL_PREFIX)
    ]
    sort_key = "self_device_ms" if session.device.type == "cuda" else "self_cpu_ms"
    by_stage_events: dict[str, list[Any]] = {}
    for ev in events:
        by_stage_events.setdefault(_stage_of(ev) or "other", []).append(ev)
    table_overall = _aggregate(events, sort_key)
    by_stage = {stage: _aggregate(evs, sort_key) for stage, evs in by_stage_events.items()}
    written: str | None = None
    if trace_path is not None:
        raw = trace_path.with_suffix("")  # foo.json.gz -> foo.json
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(trace_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        written = str(trace_path)
    return OperatorTable(
        sort_key=sort_key,
        overall=table_overall,
        kernels=_aggregate(kernel_events, "self_device_ms", short_kernel_name),
        by_stage=by_stage,
        events=len(events),
        decode_steps=decode_steps,
        postprocess_s=time.perf_counter() - started,
        trace_path=written,
    )

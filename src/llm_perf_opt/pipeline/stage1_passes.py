"""Stage 1's passes on the built model before the profiled one: per input (or batch) the FLOP count (untimed),
warm-up passes without NVTX, then the timed passes; and the untimed top-two passes (`run.save_top2_logits`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.data.dataset import DatasetSelection
from llm_perf_opt.instruments.compiled_modules import InductorProvenance
from llm_perf_opt.instruments.flops import FlopCounts
from llm_perf_opt.instruments.host_usage import HostUsageMeter
from llm_perf_opt.instruments.routing import find_routers
from llm_perf_opt.instruments.torch_profiler import profile_image
from llm_perf_opt.measure.routing_summary import RoutingTrace, mean_unique_experts
from llm_perf_opt.measure.stage1_analysis import Stage1Measurements
from llm_perf_opt.pipeline.rung_handoff import GpuHandoff
from llm_perf_opt.pipeline.shard import READY
from llm_perf_opt.pipeline.stage1_records import input_key
from llm_perf_opt.pipeline.stage1_settings import ResolvedSettings, with_timed_budget
from llm_perf_opt.progress import StepHandle
from llm_perf_opt.records.shard import PassWindow
from llm_perf_opt.records.stage1 import OperatorTable, ProfilerSettings, batch_key
from llm_perf_opt.session.session import BatchMeasurement, ImageMeasurement, InferenceSession

log = logging.getLogger("llm_perf_opt.stage1")

TRACE_FILE = "torch_profiler/trace.json.gz"  # the profiled pass's Chrome trace (pipeline.torch_profiler.chrome_trace)
Grid = tuple[int, int] | None  # an input's crop grid (DeepSeek-OCR's tiles), as its records keep it
Measured = TypeVar("Measured", ImageMeasurement, BatchMeasurement)
Part = Callable[[str], AbstractContextManager[None]]  # counts a block's wall time in a named part of the time budget
COUNT_PART, WARMUP_PART = "FLOP counts", "warm-up"  # the time budget's parts inside the passes step


class TimedPasses:
    """The FLOP-counting, warm-up and timed passes of one run's inputs on `session`, into `state`; `meet`: wait for
    the other data-parallel processes before the timed passes; `part`: the time budget's part for a block (the FLOP
    counts and the warm-up passes get their own, so a run's budget shows what its timed passes alone cost)."""

    def __init__(
        self,
        state: Stage1Measurements,
        session: InferenceSession,
        selection: DatasetSelection,
        settings: ResolvedSettings,
        handoff: GpuHandoff,
        meet: Callable[[str], None],
        part: Part,
    ) -> None:
        self.state, self.session, self.selection, self.settings = state, session, selection, settings
        self.handoff, self.meet, self.part = handoff, meet, part
        self.flop_counts = FlopCounts()  # one count per distinct input (or batch) shape
        self.host_meter = HostUsageMeter()  # the host's usage over the timed passes, kept in `state.host_usage`
        self.timed_groups = 0  # the inputs (or batches) whose timed passes the progress bar counts

    def images(self, bar: StepHandle) -> None:
        """Per image: the FLOP-counting pass (untimed), warm-up passes without NVTX, then the timed passes."""
        session, tokens, vision = self.session, self.settings.max_new_tokens, self.session.vision_stages
        groups = [(entry.path,) for entry in self.selection.images]
        self.timed_groups = len(groups)
        for index, entry in enumerate(self.selection.images):
            name = input_key(self.selection, entry.path)
            grid = self._count(name, session.prepare(entry.path), bar)
            first = self._warm_up(
                partial(session.run_image, entry.path, tokens, nvtx=False, next_paths=groups[index]), bar
            )
            if first is not None:
                self.state.first_passes.append(first.record(name, 0, vision, grid))
            repeat = 0
            while repeat < self.settings.repeats:
                after = self._next_paths(groups, index, repeat)
                measured = self._timed(partial(session.run_image, entry.path, tokens, next_paths=after), 1, bar)
                self.state.records.append(measured.record(name, repeat, vision, grid))
                if measured.routing is not None:
                    self.state.routing.append(measured.routing)
                self._keep_outputs(name, measured)
                bar.advance()
                log.info(
                    "%s repeat %d/%d: prefill %.1f ms, decode %.1f ms (%d tokens)",
                    name,
                    repeat + 1,
                    self.settings.repeats,
                    measured.prefill_ms,
                    measured.decode_ms,
                    len(measured.token_ids),
                )
                repeat += 1

    def batches(self, groups: list[tuple[Path, ...]], bar: StepHandle) -> None:
        """Per batch: each input's FLOP count alone and the batch's (untimed), warm-up passes without NVTX (each
        input's share of the first one kept as its first pass), then the timed passes: one `BatchRecord` per pass and
        one `ImageRecord` per input and pass."""
        session, tokens = self.session, self.settings.max_new_tokens
        if groups[-1] and len(groups[-1]) < session.runtime.batch_size:
            log.warning(
                "the last batch holds %d input(s), fewer than run.batch_size=%d: it runs as a smaller batch",
                len(groups[-1]),
                session.runtime.batch_size,
            )
        self.timed_groups = len(groups)
        for index, paths in enumerate(groups):
            keys = tuple(input_key(self.selection, path) for path in paths)
            prepared = [session.prepare(path) for path in paths]
            grids: dict[str, Grid] = {}
            for name, one in zip(keys, prepared, strict=True):
                if name not in grids:  # a copy filling the batch (run.fill_batches) is counted once
                    grids[name] = self._count(name, one, bar, "counting FLOPs alone (untimed)")
            key = batch_key(index)
            if len(prepared) == 1:  # a last batch of one input: its count alone
                self.state.batch_flops[key] = self.state.flops[keys[0]]
            else:
                named = f"{key} ({', '.join(dict.fromkeys(keys))})"
                doing = "counting FLOPs of the batch (untimed)"
                with self.part(COUNT_PART):
                    self.state.batch_flops[key] = self.flop_counts.count(session, prepared, named, doing)
            bar.advance()
            first = self._warm_up(partial(session.run_batch, paths, tokens, nvtx=False, next_paths=paths), bar)
            for name, page in _each_input_once(keys, first) if first is not None else ():
                self.state.first_passes.append(page.record(name, 0, session.vision_stages, grids[name]))
            traces: list[RoutingTrace] = []
            try:
                self._timed_batches(index, groups, keys, grids, traces, bar)
            finally:  # priced once from every timed pass's routing (also when stopped part-way)
                self._price_batch(key, prepared, traces)

    def _timed_batches(
        self,
        index: int,
        groups: Sequence[tuple[Path, ...]],
        keys: tuple[str, ...],
        grids: Mapping[str, Grid],
        traces: list[RoutingTrace],
        bar: StepHandle,
    ) -> None:
        """The timed passes of batch `index`: one `BatchRecord` per pass, one `ImageRecord` per input and pass,
        the routing of each in `traces`; nothing else runs between two passes."""
        session, paths = self.session, groups[index]
        tokens, vision = self.settings.max_new_tokens, session.vision_stages
        repeat = 0
        while repeat < self.settings.repeats:
            after = self._next_paths(groups, index, repeat)
            measured = self._timed(partial(session.run_batch, paths, tokens, next_paths=after), len(paths), bar)
            for name, page in _each_input_once(keys, measured):
                self.state.records.append(page.record(name, repeat, vision, grids[name]))
                self._keep_outputs(name, page)
            if measured.routing is not None:
                self.state.routing.append(measured.routing)
                traces.append(measured.routing)
            self.state.batches.append(measured.record(index, repeat, keys))
            bar.advance()
            log.info(
                "%s repeat %d/%d: prefill %.1f ms, decode %.1f ms (%d tokens x %d inputs)",
                batch_key(index),
                repeat + 1,
                self.settings.repeats,
                measured.prefill_ms,
                measured.decode_ms,
                measured.new_tokens,
                measured.batch_size,
            )
            repeat += 1

    def top_two(self, bar: StepHandle) -> None:
        """`run.save_top2_logits`: one untimed eager pass per input keeping the top two logits behind each token."""
        for entry in self.selection.images:
            prepared = self.session.prepare(entry.path)
            key = input_key(self.selection, entry.path)
            self.state.top2[key] = self.session.top_two(prepared, self.settings.max_new_tokens)
            bar.advance()

    def _next_paths(self, groups: Sequence[tuple[Path, ...]], index: int, repeat: int) -> tuple[Path, ...] | None:
        """The inputs of the pass after timed pass `repeat` of group `index` (`runtime.prefetch_pages` decodes their
        files meanwhile): the same group's while passes of it follow, then the next group's; None after the last."""
        if repeat + 1 < self.settings.repeats:
            return groups[index]
        return groups[index + 1] if index + 1 < len(groups) else None

    def _count(self, name: str, prepared: Any, bar: StepHandle, doing: str = "counting FLOPs (untimed)") -> Grid:
        """An input's FLOP count and analytic costs; its crop grid."""
        session = self.session
        with self.part(COUNT_PART):
            self.state.flops[name] = self.flop_counts.count(session, prepared, name, doing)
            costs = session.adapter.analytic_costs(
                session.model, prepared, self.settings.max_new_tokens, session.dtype.itemsize
            )
        bar.advance()
        if costs is not None:
            self.state.analytic[name] = costs
        grid = prepared.model_inputs.get("crop_grid")
        return None if grid is None else (int(grid[0]), int(grid[1]))

    def _warm_up(self, run_pass: Callable[[], Measured], bar: StepHandle) -> Measured | None:
        """With the device to this rung alone, the warm-up passes (no NVTX: they stay outside every stage Nsight
        analyses, and compile what a compiled runtime compiles), then the meeting before the timed passes; the first
        warm-up pass's measurement (None without warm-up)."""
        self.handoff.wait()
        first = None
        with self.part(WARMUP_PART):
            for _ in range(self.settings.warmup):
                measured = run_pass()
                first = measured if first is None else first
                bar.advance()
        self.meet(READY)
        return first

    def _timed(self, run_pass: Callable[[], Measured], inputs: int, bar: StepHandle) -> Measured:
        """One timed pass of `inputs` inputs, with its host usage, its wall-clock window and its compiles; the
        run's first one fixes the timed passes per input within the device default's budget (`with_timed_budget`)."""
        with self.host_meter.timed_pass():
            started = time.time()
            measured = run_pass()
            window = PassWindow(started, time.time(), inputs)
            self.state.timed_windows.append(window)
        self.state.host_usage = self.host_meter.total
        self.state.timed_compiles.extend(measured.compile_events)
        if len(self.state.timed_windows) == 1:
            before = self.settings.repeats
            self.settings = with_timed_budget(self.settings, window.ended_s - window.started_s)
            if self.settings.repeats < before:
                log.info("timed passes per input: %s", self.settings.sources["run.repeats"])
                bar.grow((self.settings.repeats - before) * self.timed_groups)
        return measured

    def _keep_outputs(self, name: str, measured: ImageMeasurement) -> None:
        """An input's tokens (and prefill logits, when kept) from its first timed pass."""
        self.state.predictions.setdefault(name, measured.token_ids)
        if measured.prefill_logits is not None:
            self.state.prefill_logits.setdefault(name, measured.prefill_logits)

    def _price_batch(self, key: str, prepared: list[Any], traces: list[RoutingTrace]) -> None:
        """The batch's analytic costs; its decode reads the routed experts the routing record saw hit (mean over
        the batch's timed decode steps), or the uniform-routing expectation without a record."""
        session = self.session
        hit = mean_unique_experts(traces)
        costs = session.adapter.analytic_batch_costs(
            session.model, prepared, self.settings.max_new_tokens, session.dtype.itemsize, hit
        )
        if costs is None:
            return
        self.state.batch_analytic[key] = costs
        if hit is not None:
            self.state.decode_experts = (
                "measured: the routing record's distinct experts per decode step and MoE layer, each batch's mean "
                "over its timed passes"
            )
        elif find_routers(session.model):
            self.state.decode_experts = (
                "expected: E·(1 − (1 − k/E)^B) distinct experts per decode step and MoE layer (uniform routing; no "
                "routing record, runtime.record_routing=false)"
            )


def _each_input_once(keys: Sequence[str], measured: BatchMeasurement) -> Iterator[tuple[str, ImageMeasurement]]:
    """Each input of a batch pass (`keys`, in batch order) with its share of the pass, once: a copy filling the batch
    (run.fill_batches) repeats its input and is left out."""
    seen: set[str] = set()
    for name, page in zip(keys, measured.page_measurements(), strict=True):
        if name not in seen:
            seen.add(name)
            yield name, page


def record_provenance(session: InferenceSession, profiler: ProfilerSettings) -> InductorProvenance | None:
    """With compiled code and module attribution in the profiled pass: inductor's provenance recorded from the
    first compile on, so the profiled pass attributes the timed passes' graphs instead of compiling its own."""
    if not session.runtime.compiles or not (profiler.enable and profiler.modules):
        return None
    provenance = InductorProvenance(session.model)
    provenance.install()  # a failure is kept in its notes, which the module table shows
    session.compiled_provenance = provenance
    return provenance


def profiled_pass(
    session: InferenceSession,
    profiled: tuple[Path, ...],
    profiler: ProfilerSettings,
    art: ArtifactsManager,
    device_idle: AbstractContextManager[None],
    cache_tokens: int,
) -> OperatorTable:
    """The torch-profiler pass (`pipeline.torch_profiler`) over the first input or batch; `device_idle` around its
    CPU-only post-processing."""
    steps = profiler.decode_steps
    what = profiled[0].name if len(profiled) == 1 else f"the first batch ({len(profiled)} inputs)"
    log.info("profiled pass on %s (prefill + %d decode steps)", what, steps)
    trace = art.path(TRACE_FILE) if profiler.chrome_trace else None
    operators = profile_image(
        session,
        profiled,
        decode_steps=steps,
        record_shapes=profiler.record_shapes,
        profile_memory=profiler.profile_memory,
        with_stack=profiler.with_stack,
        with_flops=profiler.with_flops,
        trace_path=trace,
        modules=profiler.modules,
        gpu_idle=device_idle,
        cache_tokens=cache_tokens,
        max_vision_inputs=profiler.max_vision_inputs,
    )
    if trace is not None:
        art.record(TRACE_FILE)
    return operators

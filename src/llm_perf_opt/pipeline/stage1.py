"""Stage 1: time every stage of every image, count FLOPs, profile one pass, write the report set."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.analytic.workload import RunWorkload
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import plain
from llm_perf_opt.data.dataset import DatasetSelection
from llm_perf_opt.data.inputs import InputChoice, select_inputs
from llm_perf_opt.env_info import collect_env
from llm_perf_opt.errors import UserError, require_bool, require_whole
from llm_perf_opt.measure.advice import advise
from llm_perf_opt.measure.compiled_modules import InductorProvenance
from llm_perf_opt.measure.energy import EnergySettings
from llm_perf_opt.measure.flops import FlopCounts
from llm_perf_opt.measure.gpu_state import clock_state
from llm_perf_opt.measure.measured_peaks import (
    MEASURED,
    check_peaks_setting,
    measured_peak_bandwidth,
    measured_peak_compute,
)
from llm_perf_opt.measure.memory import MemorySettings
from llm_perf_opt.measure.outputs import save_prefill_logits, save_top_two
from llm_perf_opt.measure.profiler_window import ProfilerWindow
from llm_perf_opt.measure.routing import RoutingTrace, find_routers, mean_unique_experts
from llm_perf_opt.measure.stage1_analysis import Stage1Analysis, Stage1Measurements
from llm_perf_opt.measure.torch_profiler import profile_image
from llm_perf_opt.pipeline import stage1_batch_fit
from llm_perf_opt.pipeline.analytic import check_workload_model, write_analytic_report_for_run
from llm_perf_opt.pipeline.rung_handoff import GpuHandoff
from llm_perf_opt.pipeline.shard import READY, TIMED, ShardSync, data_parallel_count, shard_inputs, shard_of
from llm_perf_opt.pipeline.stage1_memory_energy import MemoryAndEnergy
from llm_perf_opt.pipeline.stage1_records import (
    analysis_setup,
    input_key,
    inputs_manifest,
    run_predictions,
)
from llm_perf_opt.pipeline.stage1_settings import (
    ResolvedSettings,
    energy_settings,
    max_vision_inputs,
    memory_settings,
    resolve_settings,
    run_settings,
    with_runtime_warmup,
)
from llm_perf_opt.progress import Feedback, StepHandle
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import (
    CONFIG_FILE,
    ENV_FILE,
    INPUTS_FILE,
    METRICS_FILE,
    OPERATORS_FILE,
    PREFILL_LOGITS_FILE,
    REPORT_FILE,
    TOP2_LOGITS_FILE,
    whatif_for,
)
from llm_perf_opt.records.io import dumps_lines
from llm_perf_opt.records.shard import PassWindow
from llm_perf_opt.records.stage1 import (
    Stage1Metrics,
    batch_key,
)
from llm_perf_opt.records.whatif import WhatIfRecord
from llm_perf_opt.report import pyplot, stage1_reports
from llm_perf_opt.report.markdown import pct
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.cpu_affinity import OFF, CpuPin, pin
from llm_perf_opt.session.model_settings import ModelSettings
from llm_perf_opt.session.process_state import start_clean
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import (
    ImageMeasurement,
    InferenceSession,
    batches,
    filled,
    resolve_device,
    resolve_dtype,
)

log = logging.getLogger("llm_perf_opt.stage1")


class Stage1Run:
    """One `stage1-run` invocation over one run folder."""

    def __init__(self, cfg: DictConfig, run_dir: Path, run_id: str, feedback: Feedback | None = None) -> None:
        self.cfg = cfg
        self.feedback = feedback or Feedback()
        self.run_id = run_id
        self.art = ArtifactsManager(run_dir, stage="stage1")
        self.state = Stage1Measurements()
        self.session: InferenceSession | None = None
        self.selection: DatasetSelection | None = None
        self.inputs: InputChoice | None = None
        self.settings: ResolvedSettings | None = None
        self.runtime = RuntimeSettings()
        self.extra_passes = (MemorySettings(), EnergySettings())  # the memory and energy passes' settings
        self.whatif: WhatIfRecord | None = None  # the what-if run the reports cite (report.whatif_dir)
        self.cpu_pin: CpuPin | None = None  # run.cpu_affinity as applied
        self.render_reports = True  # report.render: Markdown and plots beside the records
        self.handoff = GpuHandoff.from_environ()  # a what-if rung's device shared with its neighbours' ends
        self.flop_counts = FlopCounts()  # one count per distinct input (or batch) shape
        self.sync: ShardSync | None = None  # run.data_parallel > 1: the meetings with the other processes
        self.share: tuple[str, int, bool] | None = None  # its device, inputs and whether they are replicated

    # ---- driver ------------------------------------------------------------------------------------
    def execute(self) -> Path:
        """Run everything; the folder ends complete, failed or interrupted."""
        self.art.start(self.run_id)
        measuring = True
        try:
            with self.feedback.session():
                self._measure()
                measuring = False
                metrics = self._write_outputs(partial=False)
        except KeyboardInterrupt as stop:
            self._leave_sync()
            self._write_partial(interrupts.cause(stop))
            self.art.finish(artifacts.INTERRUPTED, f"{interrupts.cause(stop)}; results so far were written")
            raise
        except UserError as exc:
            # bad input found while measuring: keep what was measured (an output that cannot be written is not retried)
            self._leave_sync()
            self._fail(f"failed: {exc}", str(exc), partial=measuring)
            raise
        except Exception as exc:
            self._leave_sync()
            self._fail(f"failed: {type(exc).__name__}: {exc}", f"{type(exc).__name__}: {exc}")
            raise
        self.art.finish(artifacts.COMPLETE)
        self._print_summary(metrics)
        return self.art.run_dir

    def _print_summary(self, m: Stage1Metrics) -> None:
        p50 = {s.stage: s.summary.p50 for s in m.stages}
        mfu = {r.stage: r.mfu for r in m.mfu}
        eff = {e.stage: e for e in m.efficiency}
        decode = eff.get(vocab.DECODE)
        rows = [
            ("model", f"{m.model.name} ({m.model.weights}, {m.model.dtype})"),
            ("device", m.device.name),
            ("images x passes", f"{len(m.images)} x {m.settings.repeats}"),
            ("end to end (p50)", f"{p50.get('e2e', 0):,.1f} ms"),
            ("prefill (p50)", f"{p50.get(vocab.PREFILL, 0):,.1f} ms, MFU {pct(mfu.get(vocab.PREFILL))}"),
            (
                "decode per token (p50)",
                f"{p50.get(vocab.DECODE_STEP, 0):,.2f} ms, MBU {pct(decode.mbu if decode else None)}",
            ),
        ]
        report = str(self.art.run_dir / REPORT_FILE)
        self.feedback.summary(f"stage1-run {self.run_id}: complete", rows, report, m.time_budget)

    def _leave_sync(self) -> None:
        """A data-parallel process that will time nothing more: no other process waits for it."""
        if self.sync is not None:
            self.sync.abandon()

    def _meet(self, phase: str) -> None:
        """Wait for the other processes of a data-parallel run at `phase` (at once without any)."""
        if self.sync is not None:
            with self.feedback.step(f"waiting for the other data-parallel processes ({phase})", part="sync"):
                self.sync.meet(phase)

    def _fail(self, why: str, message: str, *, partial: bool = True) -> None:
        """Write what was measured (when `partial`), then mark the folder failed whatever that write does."""
        try:
            if partial:
                self._write_partial(why)
        finally:
            self.art.finish(artifacts.FAILED, message)

    def _write_partial(self, why: str) -> None:
        if self.state.records and self.session is not None:
            log.warning("writing what was measured so far (%d passes): %s", len(self.state.records), why)
            self._write_outputs(partial=True)

    # ---- measurement -------------------------------------------------------------------------------
    def _measure(self) -> None:
        cfg = self.cfg
        self.art.write_text(CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
        check_workload_model(cfg)
        count, shard = data_parallel_count(cfg.run), shard_of(cfg.run)
        if count > 1:
            if shard is None:
                raise UserError(
                    f"run.data_parallel={count} in a sweep job needs the job's run.shard (0 to {count - 1})",
                    f"Sweep run.shard=0,...,{count - 1} beside it, or run stage1-run run.data_parallel={count} "
                    "without -m: it starts the processes itself",
                )
            self.sync = ShardSync.for_run(self.art.run_dir, shard, count)
        self.whatif = whatif_for(self.art.run_dir, cfg.get("report", {}).get("whatif_dir"))
        self.render_reports = require_bool("report.render", cfg.get("report", {}).get("render", True))
        device = resolve_device(cfg.device)
        self.state.reused_process = start_clean(device)
        self.cpu_pin = pin(str(cfg.run.get("cpu_affinity", OFF)), device)
        profiler_window = bool(cfg.run.get("profiler_window", False))
        if profiler_window and device.type != "cuda":
            raise UserError(
                f"run.profiler_window=true opens a window for Nsight Compute and needs a CUDA device, not {device}",
                "Run on a GPU (device=cuda), or leave run.profiler_window=false",
            )
        self.runtime = RuntimeSettings.from_config(cfg)  # run.batch_size ≤ 0 is refused here, before any build
        self.runtime.check_device(device)
        self.settings = settings = with_runtime_warmup(resolve_settings(cfg, device), self.runtime)
        self.extra_passes = (memory_settings(cfg), energy_settings(cfg))
        max_vision_inputs(cfg)  # the profiled pass's bound, checked before the model is built
        model = ModelSettings.from_config(plain(cfg.model))  # the `model:` node, read once
        adapter = make_adapter(model)  # knows what the model takes (images or text) before it is built
        self.inputs = select_inputs(
            cfg.dataset,
            adapter.input_kind,
            model_name=model.name,
            max_images=settings.max_images,
            sampling=settings.sampling,
        )
        if self.inputs.note:
            log.info("%s", self.inputs.note)
        self.selection = self.inputs.selection
        if self.sync is not None:
            images, replicated = shard_inputs(self.selection.images, self.sync.shard, self.sync.count)
            self.selection = attrs.evolve(self.selection, images=images)
            self.inputs = attrs.evolve(self.inputs, selection=self.selection)
            self.share = (str(device), len(images), replicated)
            log.info(
                "data parallel: shard %d of %d on %s takes %d input(s)%s",
                self.sync.shard,
                self.sync.count,
                device,
                len(images),
                " (fewer inputs than processes: every process takes all)" if replicated else "",
            )
        for skipped in self.selection.skipped:
            log.warning("skipping %s: %s", skipped.path, skipped.reason)
        self.art.write_yaml(INPUTS_FILE, inputs_manifest(self.inputs))
        self.art.write_json(ENV_FILE, collect_env(device, clock_state(device)))

        if self.render_reports:
            pyplot.preload()  # the plots' import (and a first run's font cache) while the model builds
        self._measure_peaks(device, model.dtype)
        log.info("building %s on %s …", model.name, device)
        started = time.perf_counter()
        with self.feedback.step(f"building {model.name} on {device}", part="build"):
            self.session = session = InferenceSession.load(model, device, self.runtime)
        session.keep_prefill_logits = bool(cfg.run.get("save_prefill_logits", False))
        if profiler_window:
            session.profiler_window = ProfilerWindow(settings.max_new_tokens - 1)
        log.info("model ready in %.1f s: %s", time.perf_counter() - started, session.loaded.weights_detail)
        provenance = self._record_provenance(session)
        try:
            self._measure_session(session, settings)
        finally:
            if provenance is not None:
                provenance.uninstall()

    @property
    def _profiles_modules(self) -> bool:
        """The profiled pass runs and attributes kernel time to modules (`pipeline.torch_profiler`)."""
        prof = self.cfg.pipeline.torch_profiler
        return bool(prof.enable) and bool(prof.get("modules", False))

    def _record_provenance(self, session: InferenceSession) -> InductorProvenance | None:
        """With compiled code and module attribution in the profiled pass: inductor's provenance recorded from the
        first compile on, so the profiled pass attributes the timed passes' graphs instead of compiling its own."""
        if not session.runtime.compiles or not self._profiles_modules:
            return None
        provenance = InductorProvenance(session.model)
        provenance.install()  # a failure is kept in its notes, which the module table shows
        session.compiled_provenance = provenance
        return provenance

    def _measure_session(self, session: InferenceSession, settings: ResolvedSettings) -> None:
        """The passes on the built model: FLOP count, warm-up and timed passes, memory and energy, profiled pass."""
        assert self.selection is not None
        vision = session.vision_stages
        size = self.runtime.batch_size
        paths = [e.path for e in self.selection.images]
        enabled = require_bool(stage1_batch_fit.SETTING, self.cfg.run.get("check_batch_fit", True))
        stage1_batch_fit.check(session, paths, settings.max_new_tokens, size, enabled=enabled)  # before any pass
        profiled: tuple[Path, ...] = (self.selection.images[0].path,)  # the profiled pass: the first input or batch
        if size == 1:
            passes = len(self.selection.images) * (1 + settings.warmup + settings.repeats)
            with self.feedback.step("images: FLOP count, warm-up and timed passes", total=passes, part="passes") as bar:
                self._run_images(session, settings, vision, bar)
        else:
            groups = batches(paths, size)
            if self.fills_batches:
                groups = [filled(group, size) for group in groups]
            passes = len(self.selection.images) + len(groups) * (1 + settings.warmup + settings.repeats)
            what = f"batches of {size}: FLOP count, warm-up and timed passes"
            with self.feedback.step(what, total=passes, part="passes") as bar:
                self._run_batches(session, settings, vision, groups, bar)
            profiled = groups[0]
        self._meet(TIMED)

        if bool(self.cfg.run.get("save_top2_logits", False)):
            self._top_two_passes(session, settings)
        assert self.selection is not None
        key = input_key(self.selection, profiled[0]) if size == 1 else batch_key(0)
        work = (profiled, key, settings.max_new_tokens)
        extra = MemoryAndEnergy(self.state, session, work, self.extra_passes, self.feedback)
        try:
            extra.measure(self.art)
            self._profiled_pass(session, profiled, extra)
            extra.finish()
        finally:
            extra.close()
        self.handoff.release(session.device)  # (done already where the profiler's post-processing allowed)

    def _top_two_passes(self, session: InferenceSession, settings: ResolvedSettings) -> None:
        """`run.save_top2_logits`: one untimed eager pass per input keeping the top two logits behind each token."""
        assert self.selection is not None
        images = self.selection.images
        what = "top two logits per token (untimed eager passes)"
        with self.feedback.step(what, total=len(images), part="top-two logits") as bar:
            for entry in images:
                prepared = session.prepare(entry.path)
                self.state.top2[input_key(self.selection, entry.path)] = session.top_two(
                    prepared, settings.max_new_tokens
                )
                bar.advance()

    def _profiled_pass(self, session: InferenceSession, profiled: tuple[Path, ...], extra: MemoryAndEnergy) -> None:
        """The torch-profiler pass (`pipeline.torch_profiler`); its CPU-only post-processing is the energy pass's
        idle window."""
        prof = self.cfg.pipeline.torch_profiler
        if not prof.enable:
            return
        what = profiled[0].name if len(profiled) == 1 else f"the first batch ({len(profiled)} inputs)"
        log.info("profiled pass on %s (prefill + %d decode steps)", what, int(prof.decode_steps))
        trace = self.art.path("torch_profiler/trace.json.gz") if prof.chrome_trace else None
        title = f"profiled pass (prefill + {int(prof.decode_steps)} decode steps)"
        with self.feedback.step(title, part="profiled pass"):
            self.state.operators = profile_image(
                session,
                profiled,
                decode_steps=require_whole("pipeline.torch_profiler.decode_steps", prof.decode_steps, 0),
                record_shapes=bool(prof.record_shapes),
                profile_memory=bool(prof.profile_memory),
                with_stack=bool(prof.with_stack),
                with_flops=bool(prof.with_flops),
                trace_path=trace,
                modules=self._profiles_modules,
                gpu_idle=self._device_idle(extra, session.device),
                cache_tokens=self.settings.max_new_tokens if self.settings else 0,
                max_vision_inputs=max_vision_inputs(self.cfg),
            )
        if trace is not None:
            self.art.record("torch_profiler/trace.json.gz")

    @contextlib.contextmanager
    def _device_idle(self, extra: MemoryAndEnergy, device: torch.device) -> Iterator[None]:
        """Around the profiler's CPU-only post-processing, where the device idles: the energy pass's idle window
        where it measures one, else the device handed to the next what-if rung."""
        if extra.measures_idle:
            with extra.idle_during("the profiler's post-processing"):
                yield
            return
        self.handoff.release(device)
        yield

    def _measure_peaks(self, device: torch.device, dtype_setting: str | None) -> None:
        """hardware.peaks=measured: this GPU's achievable GEMM and copy rates (cached per device), measured before
        the model takes the memory."""
        if check_peaks_setting(self.cfg.hardware.peaks) != MEASURED:
            return
        if device.type != "cuda":
            return  # said in the run's warnings
        dtype = str(resolve_dtype(dtype_setting, device)).removeprefix("torch.")
        with self.feedback.step("measuring this GPU's achievable peaks (cached after the first run)", part="peaks"):
            self.handoff.wait()  # (the previous what-if rung's end: the calibration times the GPU)
            self.state.measured_peaks = (
                measured_peak_compute(device, dtype, tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32)),
                measured_peak_bandwidth(device),
            )

    def _run_images(
        self, session: InferenceSession, settings: ResolvedSettings, vision: tuple[str, ...], bar: StepHandle
    ) -> None:
        """Per image: the FLOP-counting pass (untimed), warm-up passes without NVTX, then the timed passes."""
        assert self.selection is not None
        for entry in self.selection.images:
            name = input_key(self.selection, entry.path)
            prepared = session.prepare(entry.path)
            grid = prepared.model_inputs.get("crop_grid")
            grid = None if grid is None else (int(grid[0]), int(grid[1]))
            self.state.flops[name] = self.flop_counts.count(session, prepared, name)
            bar.advance()
            costs = session.adapter.analytic_costs(
                session.model, prepared, settings.max_new_tokens, session.dtype.itemsize
            )
            if costs is not None:
                self.state.analytic[name] = costs
            self.handoff.wait()  # compiling, warm-up and timed passes with the device to this rung alone
            for _ in range(settings.warmup):  # no NVTX: warm-up stays outside every stage Nsight analyses
                session.run_image(entry.path, settings.max_new_tokens, nvtx=False)
                bar.advance()
            self._meet(READY)
            for repeat in range(settings.repeats):
                with self.state.host_usage.timed_pass():
                    started = time.time()
                    measured = session.run_image(entry.path, settings.max_new_tokens)
                    self.state.timed_windows.append(PassWindow(started, time.time(), 1))
                self.state.timed_compiles.extend(measured.compile_events)
                self.state.records.append(measured.record(name, repeat, vision, grid))
                if measured.routing is not None:
                    self.state.routing.append(measured.routing)
                self._keep_outputs(name, measured)
                bar.advance()
                log.info(
                    "%s repeat %d/%d: prefill %.1f ms, decode %.1f ms (%d tokens)",
                    name,
                    repeat + 1,
                    settings.repeats,
                    measured.prefill_ms,
                    measured.decode_ms,
                    len(measured.token_ids),
                )

    def _keep_outputs(self, name: str, measured: ImageMeasurement) -> None:
        """An input's tokens (and prefill logits, when kept) from its first timed pass."""
        self.state.predictions.setdefault(name, measured.token_ids)
        if measured.prefill_logits is not None:
            self.state.prefill_logits.setdefault(name, measured.prefill_logits)

    def _run_batches(
        self,
        session: InferenceSession,
        settings: ResolvedSettings,
        vision: tuple[str, ...],
        groups: list[tuple[Path, ...]],
        bar: StepHandle,
    ) -> None:
        """Per batch: each input's FLOP count alone and the batch's (untimed), warm-up passes without NVTX, then
        the timed passes: one `BatchRecord` per pass and one `ImageRecord` per input and pass."""
        assert self.selection is not None
        if groups[-1] and len(groups[-1]) < self.runtime.batch_size:
            log.warning(
                "the last batch holds %d input(s), fewer than run.batch_size=%d: it runs as a smaller batch",
                len(groups[-1]),
                self.runtime.batch_size,
            )
        for index, paths in enumerate(groups):
            keys = tuple(input_key(self.selection, path) for path in paths)
            prepared = [session.prepare(path) for path in paths]
            grids = {}
            for name, one in zip(keys, prepared, strict=True):
                if name in grids:  # a copy filling the batch (run.fill_batches): counted once
                    continue
                grid = one.model_inputs.get("crop_grid")
                grids[name] = None if grid is None else (int(grid[0]), int(grid[1]))
                self.state.flops[name] = self.flop_counts.count(session, one, name, "counting FLOPs alone (untimed)")
                costs = session.adapter.analytic_costs(
                    session.model, one, settings.max_new_tokens, session.dtype.itemsize
                )
                if costs is not None:
                    self.state.analytic[name] = costs
                bar.advance()
            key = batch_key(index)
            if len(prepared) == 1:  # a last batch of one input: its count alone
                self.state.batch_flops[key] = self.state.flops[keys[0]]
            else:
                named = f"{key} ({', '.join(dict.fromkeys(keys))})"
                doing = "counting FLOPs of the batch (untimed)"
                self.state.batch_flops[key] = self.flop_counts.count(session, prepared, named, doing)
            bar.advance()
            self.handoff.wait()  # compiling, warm-up and timed passes with the device to this rung alone
            for _ in range(settings.warmup):  # no NVTX: warm-up stays outside every stage Nsight analyses
                session.run_batch(paths, settings.max_new_tokens, nvtx=False)
                bar.advance()
            traces: list[RoutingTrace] = []
            self._meet(READY)
            for repeat in range(settings.repeats):
                with self.state.host_usage.timed_pass():
                    started = time.time()
                    measured = session.run_batch(paths, settings.max_new_tokens)
                    self.state.timed_windows.append(PassWindow(started, time.time(), len(paths)))
                self.state.timed_compiles.extend(measured.compile_events)
                recorded: set[str] = set()
                for name, page in zip(keys, measured.page_measurements(), strict=True):
                    if name in recorded:  # a copy filling the batch: one record per input and pass
                        continue
                    recorded.add(name)
                    self.state.records.append(page.record(name, repeat, vision, grids[name]))
                    self._keep_outputs(name, page)
                if measured.routing is not None:
                    self.state.routing.append(measured.routing)
                    traces.append(measured.routing)
                self.state.batches.append(measured.record(index, repeat, keys))
                self._price_batch(session, key, prepared, traces)
                bar.advance()
                log.info(
                    "%s repeat %d/%d: prefill %.1f ms, decode %.1f ms (%d tokens x %d inputs)",
                    key,
                    repeat + 1,
                    settings.repeats,
                    measured.prefill_ms,
                    measured.decode_ms,
                    measured.new_tokens,
                    measured.batch_size,
                )

    def _price_batch(
        self, session: InferenceSession, key: str, prepared: list[Any], traces: list[RoutingTrace]
    ) -> None:
        """The batch's analytic costs; its decode reads the routed experts the routing record saw hit (mean over
        the batch's timed decode steps), or the uniform-routing expectation without a record."""
        assert self.settings is not None
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

    # ---- outputs -----------------------------------------------------------------------------------
    @property
    def fills_batches(self) -> bool:
        """run.fill_batches: every batch filled to run.batch_size with copies of its own inputs."""
        return bool(self.cfg.run.get("fill_batches", False)) and self.runtime.batch_size > 1

    def _write_outputs(self, partial: bool) -> Stage1Metrics:
        """The records, then the reports; metrics.json again with the time budget, which report.md shows."""
        with self.feedback.step("writing the records and reports", part="reports"):
            return self._write_records_and_reports(partial)

    def _write_records_and_reports(self, partial: bool) -> Stage1Metrics:
        assert self.session is not None and self.selection is not None and self.settings is not None
        recorded = run_settings(
            self.cfg,
            self.settings,
            self.runtime,
            self.inputs,
            measured_passes=len(self.state.records),
            partial=partial,
            cpu_affinity=self.cpu_pin.describe() if self.cpu_pin is not None else None,
        )
        setup = analysis_setup(self.cfg, self.session, self.run_id, recorded, self.inputs)
        if self.sync is not None and self.share is not None:
            self.state.shard = self.sync.info(*self.share)
        metrics = Stage1Analysis(self.state, setup).metrics()
        self.art.write_json(METRICS_FILE, metrics)
        if self.session.adapter.has_analytic_model and metrics.records:  # priced as measured: tiles, tokens, dtype
            priced = RunWorkload.from_records(metrics.records, metrics.model.dtype)
            write_analytic_report_for_run(self.art, self.cfg, priced, self.session.adapter.settings)
        if self.state.operators is not None:
            self.art.write_json(OPERATORS_FILE, self.state.operators)
        if self.state.prefill_logits:
            save_prefill_logits(self.art.path(PREFILL_LOGITS_FILE), self.state.prefill_logits)
            self.art.record(PREFILL_LOGITS_FILE)
        if self.state.top2:
            save_top_two(self.art.path(TOP2_LOGITS_FILE), self.state.top2)
            self.art.record(TOP2_LOGITS_FILE)
        outputs = metrics.settings.outputs
        predictions = run_predictions(
            self.session, self.selection, self.state.predictions, outputs.extra.deepseek_ocr.strip_special_tokens
        )
        if outputs.prediction.enable:
            target = self.art.resolve_save_dir(outputs.prediction.save_dir) / "predictions.jsonl"
            self.art.write_anywhere(target, dumps_lines(predictions))
        inputs = inputs_manifest(self.inputs)
        plots: dict[str, str] = {}
        advice = advise(metrics, self.whatif) if self.render_reports else ()
        if self.render_reports:
            plots = stage1_reports.write_details(
                self.art,
                metrics,
                inputs=inputs,
                operators=self.state.operators,
                predictions=predictions,
                advice=advice,
                whatif=self.whatif,
            )
        metrics = attrs.evolve(metrics, time_budget=self.feedback.budget())
        self.art.write_json(METRICS_FILE, metrics)
        if self.render_reports:
            stage1_reports.write_report(
                self.art,
                metrics,
                plots,
                inputs=inputs,
                operators=self.state.operators,
                advice=advice,
                whatif=self.whatif,
            )
        return metrics

"""Stage 1: time every stage of every image, count FLOPs, profile one pass, write the report set."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import torch
from omegaconf import OmegaConf

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import CommandConfig
from llm_perf_opt.config_schema import EnergySchema, MemorySchema, Stage1Nodes
from llm_perf_opt.data.dataset import DatasetSelection
from llm_perf_opt.data.inputs import InputChoice, select_inputs
from llm_perf_opt.env_info import collect_env
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.gpu_state import clock_state
from llm_perf_opt.instruments.measured_peaks import MEASURED, measured_peak_bandwidth, measured_peak_compute
from llm_perf_opt.instruments.profiler_window import ProfilerWindow
from llm_perf_opt.measure.stage1_analysis import Stage1Measurements
from llm_perf_opt.pipeline import stage1_batch_fit
from llm_perf_opt.pipeline.analytic import check_workload_model
from llm_perf_opt.pipeline.rung_handoff import GpuHandoff
from llm_perf_opt.pipeline.shard import TIMED, ShardSync, data_parallel_count, shard_inputs, shard_of
from llm_perf_opt.pipeline.stage1_memory_energy import MemoryAndEnergy
from llm_perf_opt.pipeline.stage1_outputs import summary_rows, write_outputs
from llm_perf_opt.pipeline.stage1_passes import TimedPasses, profiled_pass, record_provenance
from llm_perf_opt.pipeline.stage1_records import input_key, inputs_manifest
from llm_perf_opt.pipeline.stage1_settings import (
    ResolvedSettings,
    RunOptions,
    profiler_settings,
    resolve_settings,
    with_runtime_warmup,
)
from llm_perf_opt.progress import Feedback
from llm_perf_opt.records.folders import CONFIG_FILE, ENV_FILE, INPUTS_FILE, REPORT_FILE, whatif_for
from llm_perf_opt.records.stage1 import ProfilerSettings, Stage1Metrics, batch_key
from llm_perf_opt.records.whatif import WhatIfRecord
from llm_perf_opt.report import pyplot
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.cpu_affinity import CpuPin, pin
from llm_perf_opt.session.process_state import start_clean
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession, batches, filled, resolve_device, resolve_dtype

log = logging.getLogger("llm_perf_opt.stage1")


class Stage1Run:
    """One `stage1-run` invocation over one run folder."""

    def __init__(self, command: CommandConfig, run_dir: Path, run_id: str, *, feedback: Feedback | None = None) -> None:
        self.command = command  # the command's settings, typed and read once in cli/
        self.nodes = command.nodes  # run, infer, outputs, runtime, report, hardware
        self.feedback = feedback or Feedback()
        self.run_id = run_id
        self.art = ArtifactsManager(run_dir, stage="stage1")
        self.state = Stage1Measurements()
        self.session: InferenceSession | None = None
        self.selection: DatasetSelection | None = None
        self.inputs: InputChoice | None = None
        self.settings: ResolvedSettings | None = None
        self.runtime = RuntimeSettings()
        self.extra_passes = (MemorySchema(), EnergySchema())  # the memory and energy passes' settings
        self.whatif: WhatIfRecord | None = None  # the what-if run the reports cite (report.whatif_dir)
        self.cpu_pin: CpuPin | None = None  # run.cpu_affinity as applied
        self.render_reports = True  # report.render: Markdown and plots beside the records
        self.handoff = GpuHandoff.from_environ()  # a what-if rung's device shared with its neighbours' ends
        self.profiler = ProfilerSettings()  # pipeline.torch_profiler
        self.options = RunOptions.from_nodes(Stage1Nodes())  # run.*, report.* and hardware.peaks switches
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
        report = str(self.art.run_dir / REPORT_FILE)
        self.feedback.summary(f"stage1-run {self.run_id}: complete", summary_rows(metrics), report, metrics.time_budget)
        return self.art.run_dir

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
        command, nodes = self.command, self.nodes
        self.art.write_text(CONFIG_FILE, OmegaConf.to_yaml(command.composed, resolve=True))
        check_workload_model(command)
        count, shard = data_parallel_count(nodes.run), shard_of(nodes.run)
        if count > 1:
            if shard is None:
                raise UserError(
                    f"run.data_parallel={count} in a sweep job needs the job's run.shard (0 to {count - 1})",
                    f"Sweep run.shard=0,...,{count - 1} beside it, or run stage1-run run.data_parallel={count} "
                    "without -m: it starts the processes itself",
                )
            self.sync = ShardSync.for_run(self.art.run_dir, shard, count)
        self.options = options = RunOptions.from_nodes(nodes)
        self.whatif = whatif_for(self.art.run_dir, options.whatif_dir)
        self.render_reports = options.render
        device = resolve_device(command.device)
        self.state.reused_process = start_clean(device)
        self.cpu_pin = pin(options.cpu_affinity, device)
        if options.profiler_window and device.type != "cuda":
            raise UserError(
                f"run.profiler_window=true opens a window for Nsight Compute and needs a CUDA device, not {device}",
                "Run on a GPU (device=cuda), or leave run.profiler_window=false",
            )
        self.runtime = RuntimeSettings.from_nodes(nodes)  # run.batch_size ≤ 0 is refused here, before any build
        self.runtime.check_device(device)
        self.settings = settings = with_runtime_warmup(resolve_settings(command, device), self.runtime)
        self.extra_passes = (command.memory, command.energy)
        self.profiler = profiler_settings(command.profiler)  # the profiled pass's, checked before the model is built
        model = command.model
        adapter = make_adapter(model)  # knows what the model takes (images or text) before it is built
        self.inputs = select_inputs(
            command.dataset,
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
        session.keep_prefill_logits = options.save_prefill_logits
        if options.profiler_window:
            session.profiler_window = ProfilerWindow(settings.max_new_tokens - 1)
        log.info("model ready in %.1f s: %s", time.perf_counter() - started, session.loaded.weights_detail)
        provenance = record_provenance(session, self.profiler)
        try:
            self._measure_session(session, settings)
        finally:
            if provenance is not None:
                provenance.uninstall()

    def _measure_session(self, session: InferenceSession, settings: ResolvedSettings) -> None:
        """The passes on the built model: FLOP count, warm-up and timed passes, memory and energy, profiled pass."""
        assert self.selection is not None
        options, size = self.options, self.runtime.batch_size
        paths = [e.path for e in self.selection.images]
        fit = options.check_batch_fit
        stage1_batch_fit.check(session, paths, settings.max_new_tokens, size, enabled=fit)  # before any pass
        part = self.feedback.ledger.part
        passes = TimedPasses(self.state, session, self.selection, settings, self.handoff, self._meet, part)
        each = 1 + settings.warmup + settings.repeats  # FLOP count, warm-up and timed passes of one input or batch
        profiled: tuple[Path, ...] = (paths[0],)  # the profiled pass: the first input or batch
        try:
            if size == 1:
                key = input_key(self.selection, paths[0])
                what = "images: FLOP count, warm-up and timed passes"
                with self.feedback.step(what, total=len(paths) * each, part="timed passes") as bar:
                    passes.images(bar)
            else:
                groups = batches(paths, size)
                if options.fill_batches:
                    groups = [filled(group, size) for group in groups]
                what = f"batches of {size}: FLOP count, warm-up and timed passes"
                with self.feedback.step(what, total=len(paths) + len(groups) * each, part="timed passes") as bar:
                    passes.batches(groups, bar)
                profiled, key = groups[0], batch_key(0)
        finally:
            self.settings = passes.settings  # the timed passes per input, once the first one fixed them
        self._meet(TIMED)
        if options.save_top2_logits:
            what = "top two logits per token (untimed eager passes)"
            with self.feedback.step(what, total=len(paths), part="top-two logits") as bar:
                passes.top_two(bar)
        work = (profiled, key, settings.max_new_tokens)
        extra = MemoryAndEnergy(self.state, session, work, self.extra_passes, self.feedback)
        try:
            extra.measure(self.art)
            if self.profiler.enable:
                title = f"profiled pass (prefill + {self.profiler.decode_steps} decode steps)"
                with self.feedback.step(title, part="profiled pass"):
                    idle = self._device_idle(extra, session.device)
                    tokens = settings.max_new_tokens
                    self.state.operators = profiled_pass(session, profiled, self.profiler, self.art, idle, tokens)
            extra.finish()
        finally:
            extra.close()
        self.handoff.release(session.device)  # (done already where the profiler's post-processing allowed)

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
        if self.options.peaks != MEASURED or device.type != "cuda":
            return  # off the GPU: said in the run's warnings
        dtype = str(resolve_dtype(dtype_setting, device)).removeprefix("torch.")
        with self.feedback.step("measuring this GPU's achievable peaks (cached after the first run)", part="peaks"):
            self.handoff.wait()  # (the previous what-if rung's end: the calibration times the GPU)
            self.state.measured_peaks = (
                measured_peak_compute(device, dtype, tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32)),
                measured_peak_bandwidth(device),
            )

    # ---- outputs -----------------------------------------------------------------------------------
    def _write_outputs(self, partial: bool) -> Stage1Metrics:
        """The records, then the reports (`stage1_outputs`)."""
        with self.feedback.step("writing the records and reports", part="reports"):
            return write_outputs(self, partial)

"""Stage 1's analysis: the timed passes, counted FLOPs, analytic costs and peaks of one `stage1-run`.

`pipeline/stage1.py` gathers a :class:`Stage1Measurements` and describes the run in a :class:`Stage1Setup`;
:class:`Stage1Analysis` answers one question per method and :meth:`Stage1Analysis.metrics` hands the answers over as
the `Stage1Metrics` record the reports render. A new figure of the run is a new method here and a new record field.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import attrs

from llm_perf_opt.hardware.table import peak_bandwidth, peak_compute
from llm_perf_opt.measure.aggregate import batch_summary, stage_stats
from llm_perf_opt.measure.efficiency import efficiency_by_stage
from llm_perf_opt.measure.energy_figures import METHOD as ENERGY_METHOD
from llm_perf_opt.measure.energy_figures import energy_report
from llm_perf_opt.measure.memory_figures import breakdown, fit_prediction, resident_other
from llm_perf_opt.measure.mfu import TimedPass, mfu_by_stage, stage_time_ms
from llm_perf_opt.measure.module_floors import module_attribution
from llm_perf_opt.measure.routing_summary import RoutingTrace, summarize_routing
from llm_perf_opt.measure.stage_flops import GROUPED_MM_FALLBACK_OP, StageFlops, run_flops_source
from llm_perf_opt.measure.throughput import page_throughput, throughput
from llm_perf_opt.measure.variation import high_variation, noise_side, stage_variation
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import SCHEMA_VERSION, PeakFigure
from llm_perf_opt.records.memory import AnalyticMemory, EnergyPass, EnergyReport, MemoryPass, MemoryReport
from llm_perf_opt.records.modules import ModuleAttribution
from llm_perf_opt.records.shard import PassWindow, ShardInfo
from llm_perf_opt.records.stage1 import (
    BatchRecord,
    CompileEvent,
    CompileSummary,
    DeviceInfo,
    HostUsage,
    ImageRecord,
    MeasuredPeaks,
    MfuRecord,
    ModelInfo,
    OperatorTable,
    ProfilerInfo,
    RoutingSummary,
    RunSettings,
    SkippedInput,
    Stage1Metrics,
    StageEfficiency,
    StageStat,
    StageVariation,
    TopTwoLogits,
    per_forward,
)

if TYPE_CHECKING:  # tensors are kept, never made, here: torch is not imported at run time
    import torch


@attrs.define
class Stage1Measurements:
    """What one run has measured so far (written out on success, on failure after measuring, or on Ctrl-C)."""

    records: list[ImageRecord] = attrs.Factory(list)
    first_passes: list[ImageRecord] = attrs.Factory(list)  # each input's first warm-up pass (a batch's: as timed)
    flops: dict[str, StageFlops] = attrs.Factory(dict)
    analytic: dict[str, Mapping[str, Any]] = attrs.Factory(dict)  # image -> stage -> analytic cost
    predictions: dict[str, tuple[int, ...]] = attrs.Factory(dict)
    operators: OperatorTable | None = None
    measured_peaks: tuple[PeakFigure | None, PeakFigure | None] | None = None  # hardware.peaks=measured
    routing: list[RoutingTrace] = attrs.Factory(list)  # MoE decoders: experts hit per decode step, timed passes
    prefill_logits: dict[str, torch.Tensor] = attrs.Factory(dict)  # run.save_prefill_logits: first timed pass
    top2: dict[str, TopTwoLogits] = attrs.Factory(dict)  # run.save_top2_logits: each input's top-two pass
    # run.batch_size > 1: the batch passes, and each batch's counted FLOPs and analytic costs (by batch key)
    batches: list[BatchRecord] = attrs.Factory(list)
    batch_flops: dict[str, StageFlops] = attrs.Factory(dict)
    batch_analytic: dict[str, Mapping[str, Any]] = attrs.Factory(dict)
    decode_experts: str | None = None  # which routed-expert count the batch decode bytes used
    reused_process: bool = False  # an earlier job ran in this process (a reused launcher worker)
    timed_compiles: list[CompileEvent] = attrs.Factory(list)  # compiling calls that fell in timed passes
    # The memory and energy passes, or why they did not run (None and None: not asked, e.g. a partial run)
    memory: MemoryPass | None = None
    memory_reason: str | None = None
    energy: EnergyPass | None = None
    energy_reason: str | None = None
    host_usage: HostUsage | None = None  # the host's usage over the timed passes (None: none measured)
    timed_windows: list[PassWindow] = attrs.Factory(list)  # every timed forward on the wall clock
    shard: ShardInfo | None = None  # run.data_parallel > 1: the share this process timed


@attrs.frozen
class Forwards:
    """The timed forwards of the decoder and what they are priced with, keyed by the passes' `cost_key`: an input's
    (batch 1) or a batch's (per-input FLOPs over the batch's time would count its time once per input)."""

    passes: Sequence[TimedPass]
    flops: Mapping[str, StageFlops]
    flops_per_stage: Mapping[str, Mapping[str, float]]
    costs: Mapping[str, Mapping[str, Any]]


@attrs.frozen
class Stage1Setup:
    """What the analysis knows of a run besides its measurements: the records that describe it, and the settings
    its figures and warnings depend on (parsed from the config by the pipeline)."""

    run_id: str
    model: ModelInfo
    model_class: str  # the built model's class name
    device: DeviceInfo
    settings: RunSettings
    vision_stages: tuple[str, ...]
    config_digest: str
    inputs: int  # inputs selected to run
    skipped: tuple[SkippedInput, ...] = ()
    peak_tflops: float | None = None  # hardware.peak_tflops
    peak_bandwidth_gbps: float | None = None  # hardware.peak_bandwidth_gbps
    tf32_matmul: bool = False
    measured_peaks_asked: bool = False  # hardware.peaks=measured
    cv_warn: float = 0.1  # run.cv_warn
    top_k: int = 0  # pipeline.torch_profiler.top_k
    compile: CompileSummary | None = None  # every compilation of the run (runtime.compile != none)
    host_peak_rss_bytes: int | None = None


class Stage1Analysis:
    """The questions Stage 1's reports ask of one run's measurements."""

    def __init__(self, measured: Stage1Measurements, setup: Stage1Setup) -> None:
        self.measured = measured
        self.setup = setup

    # ---- peaks -------------------------------------------------------------------------------------------------
    def _hardware_name(self) -> str:
        device = self.setup.device
        return device.name if device.type == "cuda" else "cpu"  # the table has no CPU rows

    def compute_peak(self) -> PeakFigure | None:
        """The dense compute peak of MFU: hardware.peak_tflops, else the datasheet's; None where none is known."""
        setup = self.setup
        return peak_compute(
            self._hardware_name(), setup.model.dtype, tf32_matmul=setup.tf32_matmul, override_tflops=setup.peak_tflops
        )

    def bandwidth_peak(self) -> PeakFigure | None:
        """The peak bandwidth of MBU: hardware.peak_bandwidth_gbps, else the datasheet's."""
        return peak_bandwidth(self._hardware_name(), override_gbps=self.setup.peak_bandwidth_gbps)

    # ---- what was timed ----------------------------------------------------------------------------------------
    def stages(self) -> tuple[str, ...]:
        """The stages MFU, MBU and the speed of light are given for: prefill, the vision sub-stages, decode."""
        return (vocab.PREFILL, *self.setup.vision_stages, vocab.DECODE)

    def flops_per_stage(self, counted: Mapping[str, StageFlops]) -> dict[str, dict[str, float]]:
        """Counted FLOPs per key (input or batch), stage and pass at the run's max_new_tokens."""
        tokens = self.setup.settings.max_new_tokens
        return {
            key: {s: v for s in self.stages() if (v := f.stage_total(s, tokens)) is not None}
            for key, f in counted.items()
        }

    def forwards(self) -> Forwards:
        """The batch passes when the run batched, else the per-input passes (`records.stage1.per_forward`, the rule
        of `Stage1Metrics.forwards`), with their FLOPs and analytic costs."""
        m = self.measured
        passes, flops, costs = per_forward(
            m.batches, (m.records, m.flops, m.analytic), (m.batches, m.batch_flops, m.batch_analytic)
        )
        return Forwards(passes, flops, self.flops_per_stage(flops), costs)

    def per_input(self) -> dict[str, tuple[StageStat, ...]]:
        """Stage statistics of each input over its own timed passes, in run order."""
        records = self.measured.records
        return {
            image: stage_stats([r for r in records if r.image == image], self.setup.vision_stages)
            for image in dict.fromkeys(r.image for r in records)
        }

    def variation(self) -> tuple[StageVariation, ...]:
        """Within-image and image-mix dispersion per stage, with the side its noise is on."""
        sides = self.noise_sides
        return tuple(
            attrs.evolve(v, noise_side=sides[v.stage][0]) if v.stage in sides else v
            for v in stage_variation(self.measured.records, self.setup.vision_stages)
        )

    @functools.cached_property
    def stage_stats(self) -> tuple[StageStat, ...]:
        """Each stage's statistics over every timed pass (for the record and the noise sides), worked out once."""
        return stage_stats(self.measured.records, self.setup.vision_stages)

    @functools.cached_property
    def noise_sides(self) -> dict[str, tuple[str, str]]:
        """Per stage, which side its run-to-run noise is on and why (`measure.variation.noise_side`)."""
        ops = self.measured.operators
        activity = ops.activity if ops is not None else None
        timed = {s.stage: s.summary.p50 for s in self.stage_stats}
        return {stage: side for stage in timed if (side := noise_side(stage, activity, timed)) is not None}

    # ---- utilization -------------------------------------------------------------------------------------------
    def mfu(self, peak: PeakFigure | None) -> tuple[MfuRecord, ...]:
        """MFU per stage over the timed forwards, against `peak`."""
        forwards = self.forwards()
        return mfu_by_stage(forwards.passes, forwards.flops, self.stages(), peak)

    def efficiency(self, compute: PeakFigure | None, bandwidth: PeakFigure | None) -> tuple[StageEfficiency, ...]:
        """MBU, the roofline and the speed of light per stage over the timed forwards, against these peaks."""
        forwards = self.forwards()
        source = run_flops_source(forwards.flops.values())
        return efficiency_by_stage(
            forwards.passes, forwards.flops_per_stage, forwards.costs, self.stages(), compute, bandwidth, source
        )

    def measured_peaks(self) -> MeasuredPeaks | None:
        """hardware.peaks=measured: MFU and efficiency against this GPU's measured achievable peaks."""
        if self.measured.measured_peaks is None:
            return None
        compute, bandwidth = self.measured.measured_peaks
        mfu, efficiency = self.mfu(compute), self.efficiency(compute, bandwidth)
        return MeasuredPeaks(compute=compute, bandwidth=bandwidth, mfu=mfu, efficiency=efficiency)

    # ---- batches and routing -----------------------------------------------------------------------------------
    def fills_batches(self) -> bool:
        """run.fill_batches: every batch filled to run.batch_size with copies of its own inputs."""
        return self.setup.settings.fill_batches and self.setup.settings.batch_size > 1

    def short_last_batch(self) -> int | None:
        """Inputs in a last batch smaller than run.batch_size, or None."""
        size = self.setup.settings.batch_size
        if size == 1 or not self.setup.inputs or self.fills_batches():
            return None
        return self.setup.inputs % size or None

    def routing(self) -> RoutingSummary | None:
        """Experts hit per decode step over the full batches' passes (a smaller last batch is not pooled)."""
        traces = self.measured.routing
        most = max((t.tokens_per_step for t in traces if t.steps), default=0)
        return summarize_routing([t for t in traces if t.tokens_per_step == most])

    def compile(self) -> CompileSummary | None:
        """Every compilation of the run and those of them in timed passes; None when nothing is compiled."""
        if self.setup.compile is None:
            return None
        return attrs.evolve(self.setup.compile, in_timed_passes=tuple(self.measured.timed_compiles))

    # ---- warnings ----------------------------------------------------------------------------------------------
    def warnings(self, variation: tuple[StageVariation, ...], no_peak: bool) -> tuple[str, ...]:
        """What the reader must know before trusting the figures, most general first."""
        out = [*self._setup_warnings(), *self._warmup_warnings()]
        if self.setup.model.weights == "random":
            out.append("Random weights: timings, FLOPs and bytes are real; the generated tokens are not text.")
        out.extend(f"Skipped input {Path(s.path).name}: {s.reason}." for s in self.setup.skipped)
        if no_peak:
            out.append(
                "MFU is n/a: no dense peak is known for this device and dtype. Set hardware.peak_tflops=<dense "
                "TFLOP/s> to get one."
            )
        out.extend(self._batch_warnings())
        out.extend(self._dispersion_warnings(variation))
        return tuple(out)

    def _setup_warnings(self) -> list[str]:
        """A partial run, no analytic model, no measured peaks, the grouped-matmul fallback, a reused process."""
        out = []
        if self.setup.settings.partial:
            out.append("The run did not finish: these figures cover only the passes measured before it stopped.")
        if not self.measured.analytic:
            out.append(
                f"No analytic model for {self.setup.model_class}: bytes, MBU, the roofline and the "
                "speed of light are absent; FLOPs and MFU are counted on the real modules."
            )
        if self.setup.measured_peaks_asked and self.measured.measured_peaks is None:
            out.append("hardware.peaks=measured needs a CUDA device: MFU and MBU use the datasheet peaks only.")
        if any(GROUPED_MM_FALLBACK_OP in f.by_operator for f in self.measured.flops.values()):
            out.append(
                "The MoE experts ran through transformers' grouped-matmul fallback (a loop over experts), not torch's "
                "grouped_mm kernel: their FLOPs are counted alike, their time is the fallback's."
            )
        if self.measured.reused_process:
            out.append(
                "This process ran another job before this one (a reused launcher worker): torch.compile's caches and "
                "the CUDA allocator's cache and peak counters were reset first; the host peak memory is left out (it "
                "would include the earlier job's), and so are the inputs' first passes (the earlier job warmed what "
                "a first pass pays for, such as cuDNN's attention plans)."
            )
        return out

    def _warmup_warnings(self) -> list[str]:
        """A warm-up raised for a compiled runtime, and compilations that still fell in timed passes."""
        settings = self.setup.settings
        out = []
        source = settings.sources["run.warmup"]
        if source.startswith("raised"):
            out.append(f"run.warmup is {settings.warmup}, {source}.")
        timed = self.measured.timed_compiles
        if timed:
            seconds = sum(e.host_ms for e in timed) / 1e3
            out.append(
                f"{len(timed)} compiling call(s) fell in the timed passes ({seconds:,.1f} s of host time, recompiles "
                "included): those passes include compilation, so their times are not steady state; raise run.warmup "
                "or fix the recompiles (see the Runtime section)."
            )
        return out

    def _batch_warnings(self) -> list[str]:
        """Batches filled with copies, and a last batch smaller than run.batch_size."""
        size = self.setup.settings.batch_size
        out = []
        if self.fills_batches():
            out.append(
                f"Every batch was filled to run.batch_size={size} with copies of its own inputs "
                f"(run.fill_batches=true; {self.setup.inputs} distinct input(s)): per-input figures count "
                "each input once per pass, batch figures count every copy."
            )
        short = self.short_last_batch()
        if short is not None and short == self.setup.inputs:
            out.append(
                f"All {short} input(s) fit in one batch, fewer than run.batch_size={size}: it ran "
                f"as a batch of {short}."
            )
        elif short is not None:
            out.append(
                f"The last batch holds {short} input(s), fewer than run.batch_size={size}: it ran "
                "as a smaller batch; the batch summary and the routing figures cover the full batches only."
            )
        return out

    def _dispersion_warnings(self, variation: tuple[StageVariation, ...]) -> list[str]:
        """Too few timed passes, and stages whose run-to-run variation passes run.cv_warn."""
        repeats = self.setup.settings.repeats
        out = []
        if repeats < 3:
            out.append(f"Only {repeats} timed pass(es) per image: dispersion figures are weak.")
        threshold = self.setup.cv_warn
        sides = self.noise_sides
        for v in high_variation(variation, threshold):
            worst = f"; worst {v.worst_image} {v.within_image_cv_max:.1%}" if v.images_judged > 1 else ""
            side = sides.get(v.stage)
            out.append(
                f"High run-to-run variation in {v.stage}: CV {v.within_image_cv_median:.1%} over one image's passes "
                f"(median over {v.images_judged} image(s){worst}; > {threshold:.0%})"
                + (f"; {side[0]}: {side[1]}." if side else ".")
            )
        return out

    # ---- memory and energy -------------------------------------------------------------------------------------
    def memory(self) -> MemoryReport | None:
        """The memory pass: each stage's peak in parts, the analytic expectation, and what fits on this GPU."""
        m = self.measured
        if m.memory is None:
            return None if m.memory_reason is None else MemoryReport(available=False, reason=m.memory_reason)
        mem = m.memory
        other = resident_other(mem)
        parts = tuple(breakdown(p, mem.weights_bytes, other, mem.preexisting_kv_bytes) for p in mem.peaks)
        whole = next((b for b in parts if b.stage == vocab.E2E), None)
        fit = None
        if whole is not None and mem.total_memory_bytes:
            fit = fit_prediction(
                mem.total_memory_bytes, mem.outside_allocator_bytes, whole, mem.batch_size, mem.kv_bytes_per_token
            )
        analytic = self.analytic_memory(mem, whole.peak_allocated_bytes if whole else 0)
        return MemoryReport(available=True, measured=mem, breakdown=parts, analytic=analytic, fit=fit)

    def analytic_memory(self, measured: MemoryPass, peak: int) -> AnalyticMemory:
        """Expected peak = weights + KV per token × context × batch + the analytic model's largest activation (the
        largest activation bytes of one module of the input's stages: its inputs and outputs, live together)."""
        kv = None
        if measured.kv_bytes_per_token is not None:
            kv = measured.kv_bytes_per_token * measured.context_tokens * measured.batch_size
        costs = self.forwards().costs.get(measured.input) or {}
        largest = max(
            (float(mod.activation_bytes) for cost in costs.values() for mod in getattr(cost, "modules", ())),
            default=None,
        )
        expected = measured.weights_bytes + (kv or 0.0) + (largest or 0.0)
        method = "weights (parameters + buffers) + KV cache (bytes per token × context × batch)" + (
            " + the analytic model's largest module activation (inputs + outputs of one module)"
            if largest is not None
            else "; no analytic model, so no activation term"
        )
        return AnalyticMemory(
            weights_bytes=measured.weights_bytes,
            kv_bytes=kv,
            largest_activation_bytes=largest,
            expected_bytes=expected,
            measured_bytes=peak,
            ratio=peak / expected if expected > 0 else None,
            method=method,
        )

    def energy(self) -> EnergyReport | None:
        """The energy pass's figures, each stage's beside its median over the timed passes of the same input."""
        m = self.measured
        if m.energy is None:
            return None if m.energy_reason is None else EnergyReport(available=False, reason=m.energy_reason)
        e = m.energy
        forwards = self.forwards()
        timed = [p for p in forwards.passes if p.cost_key == e.input]
        stages = (vocab.PREFILL, vocab.DECODE) if timed else ()
        medians = {stage: median(stage_time_ms(p, stage) for p in timed) / 1e3 for stage in stages}
        return energy_report(e, forwards.flops_per_stage.get(e.input, {}), medians, ENERGY_METHOD)

    # ---- everything --------------------------------------------------------------------------------------------
    def profiler(self) -> ProfilerInfo | None:
        """The profiled pass in brief, None when it did not run."""
        ops = self.measured.operators
        if ops is None:
            return None
        return ProfilerInfo(
            events=ops.events,
            decode_steps=ops.decode_steps,
            postprocess_s=ops.postprocess_s,
            trace=ops.trace_path,
            activity=ops.activity,
            torch_parse_s=ops.torch_parse_s,
        )

    def modules(self, compute: PeakFigure | None, bandwidth: PeakFigure | None) -> ModuleAttribution | None:
        """The profiled pass's kernel time by module, beside each module's analytic floor (priced for the profiled
        input or batch, the first run; a decode step as the mean step of its timed decode)."""
        ops = self.measured.operators
        if ops is None or ops.modules is None:
            return None
        forwards = self.forwards()
        first = forwards.passes[0] if forwards.passes else None
        costs = forwards.costs.get(first.cost_key) if first is not None else None
        note = None
        if compute is not None and bandwidth is not None:
            note = (
                f"max(FLOPs / {compute.value / 1e12:.0f} TFLOP/s, bytes / {bandwidth.value / 1e9:.0f} GB/s) per "
                f"priced op ({compute.source}; {bandwidth.source})"
            )
        return module_attribution(
            ops.modules,
            costs,
            decode_steps=max(first.new_tokens - 1, 1) if first is not None else 1,
            peak_flops=compute.value if compute else None,
            bandwidth=bandwidth.value if bandwidth else None,
            peaks_note=note,
        )

    def metrics(self) -> Stage1Metrics:
        """Everything the Stage 1 reports show (`metrics.json`)."""
        m, setup = self.measured, self.setup
        records, ops = m.records, m.operators
        peak, bandwidth = self.compute_peak(), self.bandwidth_peak()
        variation = self.variation()
        efficiency = self.efficiency(peak, bandwidth)
        timed = per_forward(m.batches, m.records, m.batches)  # what each throughput figure is over
        return Stage1Metrics(
            schema_version=SCHEMA_VERSION,
            run_id=setup.run_id,
            stage="stage1",
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            model=setup.model,
            device=setup.device,
            settings=setup.settings,
            records=tuple(records),
            first_passes=() if m.reused_process else tuple(m.first_passes),  # an earlier job warmed its caches
            stages=self.stage_stats,
            per_image=self.per_input(),
            throughput=throughput(timed),
            mfu=self.mfu(peak),
            efficiency=efficiency,
            bandwidth_peak=bandwidth,
            flops_per_image=self.flops_per_stage(m.flops),
            top_operators=ops.overall[: setup.top_k] if ops else (),
            operator_sort_key=ops.sort_key if ops else None,
            profiler=self.profiler(),
            warnings=self.warnings(variation, peak is None),
            config_digest=setup.config_digest,
            variation=variation,
            measured_peaks=self.measured_peaks(),
            routing=self.routing(),
            compile=self.compile(),
            host_peak_rss_bytes=None if m.reused_process else setup.host_peak_rss_bytes,
            host_usage=m.host_usage,
            batches=tuple(m.batches),
            batch_summary=batch_summary(m.batches, setup.settings.batch_size, m.decode_experts),
            flops_per_batch=self.flops_per_stage(m.batch_flops),
            modules=self.modules(peak, bandwidth),
            memory=self.memory(),
            energy=self.energy(),
            pages=page_throughput(timed, efficiency),
            timed_windows=tuple(m.timed_windows),
            data_parallel=m.shard,
        )

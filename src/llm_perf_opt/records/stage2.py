"""Stage 2 records: what `stage2-profile` captured (`capture.json`), which kernels it sent to Nsight Compute
(`ncu/targets.json`), and what its analysis (`nsight.stage2_analysis`) found (`metrics.json`): the Nsight parsers'
records joined with the Stage 1 workload (`StageRow`, `NcuKernelRow`, `MeasuredBytesRow`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from llm_perf_opt.records.common import PeakFigure, TimeBudget
from llm_perf_opt.records.modules import KernelSources
from llm_perf_opt.records.stage1 import ModelInfo, RunSettings

# ---- what the Nsight parsers measure --------------------------------------------------------------------------


@attrs.frozen
class StageGpuTime:
    """GPU time of one NVTX range name (a stage), summed over its instances. Times in ms."""

    stage: str  # range name without the domain, e.g. "prefill", "decode/step"
    instances: int  # range instances
    wall_ms: float  # sum of the ranges' CPU-side durations
    kernel_ms: float  # sum of the durations of the kernels launched inside the ranges
    gpu_busy_ms: float  # union of those kernels' GPU intervals (overlaps counted once), summed over instances
    span_ms: float  # per instance last kernel end - first kernel start (nsys's GPU projection), summed
    kernels: int  # kernel launches attributed
    busy_fraction: float  # gpu_busy_ms / wall_ms (0 when wall is 0); can pass 1 when the GPU runs behind the CPU


@attrs.frozen
class KernelStat:
    """One kernel (by demangled name) over a stage or over the whole trace. Times in ms."""

    name: str  # nsys shortName: the base function name Nsight Compute's -k matches by default
    demangled: str  # full demangled name
    stage: str | None  # None = over all kernels of the trace (or of the timed passes)
    calls: int
    total_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    share: float  # total_ms / kernel time of the stage (or of all kernels counted)


@attrs.frozen
class DecodeStepStats:
    """Per-step view of the decode loop."""

    steps: int
    kernels_per_step: float
    mean_kernel_us: float
    step_wall_ms: float  # mean wall time of a step
    gpu_busy_fraction: float  # GPU busy / wall over all steps


@attrs.frozen
class NcuKernel:
    """One kernel's launches in an ncu export, averaged (per launch), in base units."""

    name: str  # bare function name: no return type, namespace, template arguments or parameters
    full_name: str  # ncu's name of the longest launch
    launches: int
    duration_s: float  # mean gpu__time_duration.sum
    dram_bytes: float  # mean dram__bytes_read.sum + dram__bytes_write.sum
    flops: float | None  # mean FLOPs per launch; None when no FLOP metric was collected
    achieved_tflops: float | None
    dram_gbps: float  # GB/s (1e9 bytes/s)
    arithmetic_intensity: float | None  # FLOPs per DRAM byte
    sm_throughput_pct: float | None  # SpeedOfLight "Compute (SM) Throughput"
    dram_throughput_pct: float | None  # SpeedOfLight "Memory Throughput" (falls back to DRAM throughput)
    bound: str  # compute | memory | compute-leaning | memory-leaning | latency | unknown (nsight.ncu_report)
    nvtx_range: str | None  # innermost NVTX push/pop range of the launch
    variants: int = 1  # distinct full names (template instantiations) merged under `name`


@attrs.frozen
class KernelBytes:
    """One kernel function's DRAM traffic within a stage instance (Nsight Compute's bytes pass), summed."""

    name: str  # bare function name, with the functor it applies where it has one (`elementwise_kernel [MulFunctor]`)
    launches: int
    dram_bytes: float  # dram__bytes_read.sum + dram__bytes_write.sum over its launches


@attrs.frozen
class RangeBytes:
    """DRAM traffic and duration of every kernel launched inside one NVTX range (a stage) in the launches
    Nsight Compute's bytes pass profiled: each launch counts for every range of its NVTX stack (a vision/sam
    kernel also counts for prefill)."""

    stage: str  # range name without the domain
    kernels: int  # profiled launches
    duration_s: float  # summed gpu__time_duration.sum (kernels one after another, as ncu serialises them)
    dram_read_bytes: float
    dram_write_bytes: float
    top_kernels: tuple[KernelBytes, ...] = ()  # by DRAM bytes, largest first (a few)

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes


@attrs.frozen
class TraceGpu:
    """The GPU that ran most of the trace's kernels (nsys TARGET_INFO_GPU; all None when the export has none), with
    the driver of the machine that captured it."""

    name: str | None = None
    chip: str | None = None
    device_id: int | None = None
    bus: str | None = None
    memory_bytes: int | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    clock_hz: int | None = None
    sm_count: int | None = None
    l2_cache_bytes: int | None = None
    compute_capability: str | None = None  # "9.0"
    gpus_in_trace: int | None = None
    driver: str | None = None  # from env.json; the trace does not hold it


# ---- capture.json and ncu/targets.json ------------------------------------------------------------------------


@attrs.frozen
class ToolInfo:
    """A located Nsight tool."""

    path: str
    version: str


@attrs.frozen(kw_only=True)
class CapturedToolRun:
    """One tool invocation of the capture (its log sits next to its `cmd.txt`)."""

    argv: tuple[str, ...] = ()
    returncode: int | None
    seconds: float | None
    timed_out: bool = False


@attrs.frozen
class NsysReportChoice:
    """The `nsys stats` reports asked for: those run, those nsys does not offer, and stand-ins (wanted -> used)."""

    names: tuple[str, ...]
    missing: tuple[str, ...] = ()
    substituted: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Capture:
    """`capture.json`: the tools and the runs of one Stage 2 capture (written as it goes, so a failed capture keeps
    what it did)."""

    run_id: str
    mode: str  # the Stage 2 mode: "light" | "deep" | ...
    tools: Mapping[str, ToolInfo] = attrs.field(factory=dict)  # "nsys" / "ncu" -> the tool used
    runs: Mapping[str, CapturedToolRun] = attrs.field(factory=dict)  # "nsys_profile", "ncu_decode", ... -> the run
    ncu_clock_control: str | None = None
    forwarded_overrides: tuple[str, ...] = ()  # the user's overrides passed on to the profiled workload
    nsys_reports: NsysReportChoice | None = None


@attrs.frozen
class NcuRound:
    """One Nsight Compute run over a stage: which kernels, which launch window, where its exports are."""

    folder: str  # relative to the run folder, e.g. "ncu/decode", "ncu/decode-round2"
    kernels: tuple[str, ...]
    launch_skip: int
    launch_count: int
    regex: str
    note: str | None = None  # why the round gave nothing, when it did not
    # True: the workload's CUDA profiler window (its first prefill and middle decode step, `run.profiler_window`),
    # `launch_count` launches of each launch configuration (`--filter-mode per-launch-config`), every stage in one
    # process whose rows are told apart by their NVTX ranges; False (folders before 2026-11-26): `launch_skip` and
    # `launch_count` over the launches inside the stage's NVTX range.
    profiler_window: bool = False


@attrs.frozen
class NcuStageTarget:
    """The kernels of one stage sent to Nsight Compute, with their nsys counts (calls and stage instances)."""

    kernels: tuple[str, ...]  # the stage's top kernels by nsys GPU time (short names)
    calls: Mapping[str, int]  # short name -> launches in the stage over the nsys workload
    instances: int  # stage instances in the nsys workload (prefills, or decode steps)
    rounds: tuple[NcuRound, ...] = ()


@attrs.frozen(kw_only=True)
class NcuBytesPass:
    """Nsight Compute's duration and DRAM bytes of EVERY kernel of one stage instance: today one process over the
    workload's CUDA profiler window for every stage (`profiler_window`); in folders written before it, one run per
    stage whose launch window counted the launches inside the NVTX range `stage` of one timed pass of one image
    (prefill from its first kernel, decode skipped to its middle step)."""

    stage: str  # the NVTX range filtered on: "prefill" or "decode"
    instance: str  # e.g. "the prefill of the first image", "decode step 2 of 3"
    folder: str  # relative to the run folder: "ncu/bytes" ("ncu/bytes-prefill" and the like in older folders)
    workload: str  # the Stage 1 folder of the profiled workload: "workload/ncu-bytes" (older: one per stage)
    launch_skip: int
    launch_count: int
    expected_kernels: int  # launches of that instance, per the nsys trace
    cache_control: str  # ncu --cache-control: "none" keeps L2 contents between kernels as in the real run
    note: str | None = None  # why the pass gave nothing, when it did not
    # True: every kernel of the workload's CUDA profiler window (`run.profiler_window`), one process for every stage
    # (its export holds them all; this pass's launches are those inside `stage`); skip and count are unused (0).
    profiler_window: bool = False


@attrs.frozen
class NcuTargets:
    """`ncu/targets.json`: the targeted kernels and the ncu rounds of every analysed stage, and the bytes passes."""

    mode: str
    stages: Mapping[str, NcuStageTarget] = attrs.field(factory=dict)
    bytes_passes: tuple[NcuBytesPass, ...] = ()  # absent from folders written before the bytes pass existed


# ---- metrics.json -----------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StageRow(StageGpuTime):
    """One stage's GPU time (nsys) joined with Stage 1's time, FLOPs and bytes of the same passes."""

    stage1_cuda_event_ms: float | None = None  # Stage 1's CUDA-event time over the workload's timed passes
    flops: float | None = None  # counted FLOPs over the same passes
    achieved_tflops_on_busy_time: float | None = None
    mfu_on_busy_time: float | None = None  # fraction of the dense compute peak
    bytes: float | None = None  # analytic bytes over the same passes
    mbu_on_busy_time: float | None = None  # fraction of the peak bandwidth


@attrs.frozen(kw_only=True)
class NcuKernelRow(NcuKernel):
    """A kernel Nsight Compute profiled in a stage (the first round that reached it), with its nsys GPU time there."""

    stage: str
    round_folder: str
    tensor_ops_counted: bool  # the export has a tensor-core op counter: its FLOPs include tensor-core work
    stage_gpu_ms: float | None  # nsys, all timed passes; None when the trace has no kernel of that name
    stage_share: float | None  # of the stage's summed kernel time (nsys)
    stage_instantiations: int  # nsys kernels (demangled names) sharing this function name


@attrs.frozen(kw_only=True)
class MeasuredBytesRow:
    """One stage instance's DRAM bytes measured by Nsight Compute beside the analytic figure for it. MBU here is over
    the summed kernel durations ncu measured (kernels serialised, no launch gaps), measured and analytic alike, so the
    two differ exactly as their bytes do."""

    stage: str  # "prefill", "vision/sam", ..., "decode/step"
    instance: str  # which instance, in words
    kernels: int
    kernel_ms: float  # summed ncu gpu__time_duration
    dram_read_bytes: float
    dram_write_bytes: float
    measured_bytes: float
    analytic_bytes: float | None  # None without a Stage 1 analytic figure for the stage
    ratio: float | None  # measured / analytic
    flops: float | None  # counted FLOPs of one instance (Stage 1)
    measured_intensity: float | None  # FLOPs / measured bytes
    analytic_intensity: float | None
    measured_bound: str | None  # "compute" | "memory" against the ridge point
    analytic_bound: str | None
    measured_mbu: float | None
    analytic_mbu: float | None
    top_kernels: tuple[KernelBytes, ...] = ()
    analytic_source: str | None = None  # where the per-instance analytic bytes and FLOPs come from
    why: str | None = None  # why measured and analytic differ, where the data show a cause


@attrs.frozen(kw_only=True)
class MeasuredBytes:
    """Nsight Compute's measured DRAM bytes per stage instance, joined with the analytic bytes."""

    rows: tuple[MeasuredBytesRow, ...]
    cache_control: str  # the bytes passes' ncu --cache-control
    bandwidth_peak: PeakFigure | None = None  # MBU denominator
    ridge_point: float | None = None  # FLOP/byte where compute and bandwidth roofs meet
    l2_cache_bytes: int | None = None


@attrs.frozen(kw_only=True)
class SampledDramRow:
    """One stage's DRAM bytes per instance from Nsight Systems' sampled GPU metrics, over all timed passes."""

    stage: str
    instances: int  # the instances measured: those whose kernels lie where no sample went missing
    busy_ms: float  # per instance: the union of its kernels' GPU intervals, where the samples are integrated
    dram_read_bytes: float  # per instance (mean)
    dram_write_bytes: float
    ncu_bytes: float | None = None  # the bytes pass's measured bytes of its one instance of this stage, if any
    left_out: int = 0  # instances whose kernels touched a gap in the samples (or lay outside them): not measured

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes


@attrs.frozen(kw_only=True)
class SampledDram:
    """DRAM bytes per stage instance from `nsys profile --gpu-metrics-devices` (no per-kernel profiling)."""

    rows: tuple[SampledDramRow, ...]
    period_us: float | None  # the median time between samples
    scale: PeakFigure  # the DRAM bandwidth 100% of a sample stands for
    span_s: float | None = None  # from the first sample to the last (None: folders written before it was kept)
    dropped_s: float | None = None  # of which inside gaps where samples went missing
    gap_periods: float | None = None  # a step longer than this many median periods is a gap (None: older folders)


@attrs.frozen
class ToolRunResult:
    """How long a tool run took and how it exited."""

    seconds: float | None
    returncode: int | None


@attrs.frozen
class KernelModules:
    """Stage 2's kernels named by what launched them: a Stage 1 profiled pass's kernel sources (operator and module
    per kernel, `ModuleTimes.kernel_sources`) joined to this run's kernels by name (nsys and ncu carry neither)."""

    stage1: str | None  # the Stage 1 folder whose profiled pass named them; None when none was at hand
    note: str  # where the sources came from, or why there are none
    kernels: Mapping[str, KernelSources] = attrs.field(factory=dict)  # kernel as kernels.md names it -> launchers


@attrs.frozen(kw_only=True)
class Stage2Metrics:
    """`metrics.json` of a Stage 2 run. Fields with defaults are absent from trimmed copies (read as empty)."""

    schema_version: str
    stage: str
    run_id: str
    created: str  # when the run started (its status), kept however often stage2-report rebuilds the record
    mode: str
    device: TraceGpu
    tools: Mapping[str, ToolInfo] = attrs.field(factory=dict)
    ncu_clock_control: str | None = None
    tool_runs: Mapping[str, ToolRunResult] = attrs.field(factory=dict)
    forwarded_overrides: tuple[str, ...] = ()
    model: ModelInfo | None = None  # the workload's model (None without the workload's Stage 1 metrics)
    workload_settings: RunSettings | None = None
    peak: PeakFigure | None = None  # the workload's dense compute peak (MFU)
    compute_roofs: tuple[PeakFigure, ...] = ()  # kernel roofline compute roofs, highest first
    bandwidth_peak: PeakFigure | None = None  # kernel roofline memory roof (MBU)
    stages: tuple[StageRow, ...]
    decode_steps: DecodeStepStats | None = None
    kernel_count: int  # kernel launches in the whole trace (build and warm-up included)
    top_kernels: tuple[KernelStat, ...]  # of the timed passes, hottest first
    top_kernels_by_stage: Mapping[str, tuple[KernelStat, ...]] = attrs.field(factory=dict)
    analysed_stages: tuple[str, ...]
    ncu_kernels: tuple[NcuKernelRow, ...] = ()
    warnings: tuple[str, ...] = ()
    measured_bytes: MeasuredBytes | None = None  # None: no bytes pass (not asked for, or an older folder)
    sampled_dram: SampledDram | None = None  # None: nsys sampled no GPU metrics (pipeline.nsys.gpu_metrics_hz)
    kernel_modules: KernelModules | None = None  # None: an older folder (before kernels were named by module)
    time_budget: TimeBudget | None = None  # where stage2-profile's wall time went (None in older folders)

    def stage_row(self, name: str) -> StageRow | None:
        return next((s for s in self.stages if s.stage == name), None)

    def ncu_row(self, stage: str, name: str) -> NcuKernelRow | None:
        """Nsight Compute's figures of kernel `name` in `stage`, where it profiled it."""
        return next((r for r in self.ncu_kernels if r.stage == stage and r.name == name), None)

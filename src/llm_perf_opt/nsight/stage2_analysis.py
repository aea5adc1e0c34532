"""Stage 2's analysis: the nsys trace joined with the capture, the Nsight Compute rounds and the Stage 1 workload.

One :class:`Stage2Analysis` per Stage 2 folder, one method per question (in the manner of HolisticTraceAnalysis);
:meth:`Stage2Analysis.metrics` hands the answers over as one `Stage2Metrics` record, which the reports render.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import attrs

from llm_perf_opt.hardware import peak_bandwidth, peak_compute
from llm_perf_opt.measure.aggregate import stage_totals_ms
from llm_perf_opt.measure.mfu import utilization
from llm_perf_opt.nsight.gpu_metrics import GAP_PERIODS, merge_intervals
from llm_perf_opt.nsight.measured_bytes import (
    InstanceCost,
    WorkloadModel,
    instance_costs,
    measured_rows,
    repriced_bytes,
    reprices,
    window_warnings,
)
from llm_perf_opt.nsight.ncu_bytes import LaunchBytes, bytes_by_range, read_launch_bytes
from llm_perf_opt.nsight.ncu_report import function_name, read_ncu_raw_csv
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import SCHEMA_VERSION, PeakFigure
from llm_perf_opt.records.folders import CONFIG_FILE, METRICS_FILE, WORKLOAD_METRICS_FILE, load_stage1_metrics
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.stage2 import (
    Capture,
    KernelStat,
    MeasuredBytes,
    MeasuredBytesRow,
    NcuBytesPass,
    NcuKernelRow,
    NcuStageTarget,
    NcuTargets,
    SampledDram,
    SampledDramRow,
    Stage2Metrics,
    StageRow,
    ToolRunResult,
)

TOP_OVERALL = 20
TOP_PER_STAGE = 10
TENSOR_COUNTER = '"sm__ops_path_tensor_src_'  # the start of an ncu tensor-core op counter in a raw-CSV header


def counts_tensor_ops(raw: Path) -> bool:
    """Whether the ncu raw CSV's header has a tensor-core op counter (`sm__ops_path_tensor_src_*`): without one,
    its FLOPs cover CUDA-core work only and are too low for any kernel that ran on tensor cores."""
    with raw.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if '"Kernel Name"' in line or line.startswith('"ID"'):
                return TENSOR_COUNTER in line
    return False


def _unpriced(folder: str, why: object) -> str:
    """The warning for a workload folder the analytic model could not price again."""
    return f"{folder}/{CONFIG_FILE}: the analytic model could not price it ({why}); Stage 1's bytes kept."


@attrs.frozen
class KernelTime:
    """The nsys GPU time of one kernel function name in a stage, every instantiation summed."""

    gpu_ms: float
    share: float  # of the stage's summed kernel time
    instantiations: int  # demangled names sharing the function name


class Stage2Analysis:
    """The questions Stage 2's reports ask of one folder's exports: `trace` is the folder's nsys export; `capture`
    and `targets` its records; `workload` the Stage 1 metrics of the workload nsys profiled (None when absent: no
    Stage 1 times, FLOPs, bytes or workload peaks); `driver` the capturing machine's GPU driver."""

    def __init__(
        self,
        run_dir: Path,
        trace: NsysTrace,
        capture: Capture,
        *,
        targets: NcuTargets | None = None,
        workload: Stage1Metrics | None = None,
        driver: str | None = None,
        models: Mapping[str, WorkloadModel] | None = None,
    ) -> None:
        self.run_dir, self.trace, self.capture, self.targets = Path(run_dir), trace, capture, targets
        self.workload, self.driver, self.models = workload, driver, dict(models or {})

    # ---- the Stage 1 workload, summed over its timed passes -----------------------------------------------------
    def stage1_ms(self) -> dict[str, float]:
        """Stage 1 CUDA-event time per stage, summed over the workload's timed passes."""
        return stage_totals_ms(self.workload.forwards) if self.workload else {}

    def stage_flops(self) -> dict[str, float]:
        """Counted FLOPs per stage over the workload's timed passes."""
        if not self.workload:
            return {}
        out: dict[str, float] = {}
        for forward in self.workload.forwards:
            for stage, value in self.workload.flops_of(forward).items():
                out[stage] = out.get(stage, 0.0) + float(value)
        return out

    def stage_bytes(self) -> dict[str, float]:
        """Analytic bytes per stage over the workload's timed passes: the current analytic model's on the inputs
        the workload ran where its config is there to price them (:meth:`_repriced`), else Stage 1's efficiency
        table."""
        if not self.workload:
            return {}
        stored = {row.stage: row.bytes for row in self.workload.efficiency}
        repriced, _ = self._repriced(str(Path(WORKLOAD_METRICS_FILE).parent), self.workload)
        return stored if repriced is None else {**stored, **repriced}

    def compute_peak(self) -> PeakFigure | None:
        """The workload's dense compute peak (MFU), None without one."""
        return self.workload.compute_peak if self.workload else None

    def bandwidth_peak(self) -> PeakFigure | None:
        """The workload's peak bandwidth (MBU), None without one."""
        return self.workload.bandwidth_peak if self.workload else None

    # ---- per stage ----------------------------------------------------------------------------------------------
    def stage_rows(self) -> tuple[StageRow, ...]:
        """Every NVTX stage of the trace with Stage 1's time, FLOPs and bytes, and MFU/MBU on GPU busy time."""
        stage1, stage_flops, stage_bytes = self.stage1_ms(), self.stage_flops(), self.stage_bytes()
        peak, bandwidth = self.compute_peak(), self.bandwidth_peak()
        rows = []
        for st in self.trace.stage_times():
            busy_s, flops, moved = st.gpu_busy_ms / 1e3, stage_flops.get(st.stage), stage_bytes.get(st.stage)
            achieved = mfu = mbu = None
            if flops and busy_s > 0:
                achieved, mfu = utilization(flops, busy_s, peak)
            if moved and busy_s > 0 and bandwidth is not None:
                _, mbu = utilization(moved, busy_s, bandwidth)
            rows.append(
                StageRow(
                    **attrs.asdict(st),
                    stage1_cuda_event_ms=stage1.get(st.stage),
                    flops=flops,
                    achieved_tflops_on_busy_time=None if achieved is None else achieved / 1e12,
                    mfu_on_busy_time=mfu,
                    bytes=moved,
                    mbu_on_busy_time=mbu,
                )
            )
        return tuple(rows)

    @staticmethod
    def analysed_stages(rows: tuple[StageRow, ...]) -> tuple[str, ...]:
        """prefill and decode where the trace has them, else every stage."""
        costed = tuple(r.stage for r in rows if r.stage in (vocab.PREFILL, vocab.DECODE))
        return costed or tuple(r.stage for r in rows)

    # ---- kernels ------------------------------------------------------------------------------------------------
    def timed_pass_kernels(self) -> list[KernelStat]:
        """Every kernel launched inside the timed passes' top-level ranges (preprocess, prefill, decode), hottest
        first: the model build and warm-up passes (weight initialisation, first-call autotuning) run outside every
        range; `share` is of the timed passes' kernel time."""
        return self.trace.kernels_in(vocab.TOP_LEVEL)

    def top_kernels_by_stage(self, stages: tuple[str, ...]) -> dict[str, tuple[KernelStat, ...]]:
        """The TOP_PER_STAGE hottest kernels of each of `stages` but the decode step (decode holds its kernels)."""
        return {
            name: tuple(self.trace.top_kernels(TOP_PER_STAGE, stage=name))
            for name in stages
            if name != vocab.DECODE_STEP
        }

    def stage_kernel_time(self, stage: str) -> dict[str, KernelTime]:
        """nsys short name -> its GPU time in `stage`, every instantiation summed."""
        out: dict[str, KernelTime] = {}
        for k in self.trace.stage_kernels(stage):
            was = out.get(k.name, KernelTime(0.0, 0.0, 0))
            out[k.name] = KernelTime(was.gpu_ms + k.total_ms, was.share + k.share, was.instantiations + 1)
        return out

    # ---- Nsight Compute -----------------------------------------------------------------------------------------
    def stage_ncu_rows(self, stage: str, target: NcuStageTarget) -> tuple[list[NcuKernelRow], list[str]]:
        """One row per kernel name that ncu profiled in `stage` (first round that reached it), with its nsys GPU
        time; and the targets whose row comes from another stage's launch: a profiler-window round takes each launch
        configuration once for the whole window, so a target of decode whose every decode launch repeats a
        configuration the prefill already launched was profiled in the prefill only; that launch (same kernel, grid
        and block) stands in for it, its NVTX range saying where it ran."""
        times = self.stage_kernel_time(stage)
        found: dict[str, NcuKernelRow] = {}
        borrowed: list[str] = []
        wanted = {function_name(n) for n in target.kernels}
        for rnd in target.rounds:
            raw = self.run_dir / rnd.folder / "raw.csv"
            if not raw.is_file():
                continue
            tensor = counts_tensor_ops(raw)
            # A profiler-window round holds every stage's targets: this stage's are its rows inside its range.
            kernels = read_ncu_raw_csv(raw, within=stage if rnd.profiler_window else None)
            if rnd.profiler_window:
                elsewhere = [k for k in read_ncu_raw_csv(raw) if k.name in wanted - {x.name for x in kernels}]
                borrowed.extend(dict.fromkeys(k.name for k in elsewhere if k.name not in found))
                kernels = [*kernels, *elsewhere]
            for kernel in kernels:
                if kernel.name in found or (rnd.profiler_window and kernel.name not in wanted):
                    continue
                time = times.get(kernel.name)
                found[kernel.name] = NcuKernelRow(
                    **attrs.asdict(kernel),
                    stage=stage,
                    round_folder=rnd.folder,
                    tensor_ops_counted=tensor,
                    stage_gpu_ms=None if time is None else time.gpu_ms,
                    stage_share=None if time is None else time.share,
                    stage_instantiations=0 if time is None else time.instantiations,
                )
        return list(found.values()), borrowed

    def ncu_rows(self) -> tuple[tuple[NcuKernelRow, ...], list[str]]:
        """The ncu rows of every targeted stage, and warnings on the rounds and kernels ncu missed."""
        rows: list[NcuKernelRow] = []
        warnings: list[str] = []
        for stage, target in (self.targets.stages if self.targets else {}).items():
            found, borrowed = self.stage_ncu_rows(stage, target)
            rows.extend(found)
            if borrowed:
                where = {r.name: r.nvtx_range or "another stage" for r in found}
                warnings.append(
                    f"{stage}: {', '.join(f'{n} (profiled in {where[n]})' for n in borrowed)}: Nsight Compute "
                    f"takes each launch configuration once, and {stage}'s launches of these repeat configurations "
                    "launched earlier; those launches stand in."
                )
            warnings.extend(f"{stage}: {rnd.note}." for rnd in target.rounds if rnd.note)
            names = {r.name for r in found}
            missed = [n for n in target.kernels if n not in names]
            if target.kernels and not found:
                warnings.append(
                    f"Nsight Compute profiled no kernel in {stage} (filters matched nothing); see ncu logs."
                )
            elif missed:
                warnings.append(
                    f"Nsight Compute did not reach {len(missed)} of the {len(target.kernels)} targeted kernels in "
                    f"{stage}: {', '.join(missed[:5])}."
                )
        return tuple(rows), warnings

    def roofs(self, device_name: str) -> tuple[tuple[PeakFigure, ...], PeakFigure | None]:
        """Compute roofs (highest first) and the memory roof for the kernel roofline. Compute: the workload's peak
        (its dtype, or the user's override), else the GPU table's dense BF16 tensor-core peak; plus the table's FP32
        CUDA-core peak, the roof of kernels that do not use tensor cores. Memory: the workload's bandwidth peak, else
        the table's. Each keeps its source; unknown GPUs give none."""
        peak = self.compute_peak()
        compute = [peak] if peak else []
        for dtype in ([] if peak else ["bfloat16"]) + ["float32"]:
            figure = peak_compute(device_name, dtype)
            if figure is not None and figure.dtype_key not in {c.dtype_key for c in compute}:
                compute.append(figure)
        compute.sort(key=lambda c: -c.value)
        return tuple(compute), self.bandwidth_peak() or peak_bandwidth(device_name)

    # ---- Nsight Compute's bytes pass -----------------------------------------------------------------------------
    def bytes_pass_costs(self, bytes_pass: NcuBytesPass) -> tuple[dict[str, InstanceCost], str, str]:
        """Per-instance analytic costs for a bytes pass, where they come from, and a warning ("" when none): the
        profiled workload's own Stage 1 figures first (the very image ncu measured), else the nsys workload's,
        averaged over its passes."""
        path = self.run_dir / bytes_pass.workload / METRICS_FILE
        warning = ""
        if path.is_file():
            try:
                own = load_stage1_metrics(path)
            except RecordError as exc:
                warning = f"{bytes_pass.workload}: {exc.problem}; analytic bytes taken from the nsys workload."
            else:
                images = ", ".join(own.images) or "no image"
                passes = len(own.forwards)
                what = f"{images}, {passes} timed pass{'es' if passes != 1 else ''}"
                repriced, note = self._repriced(bytes_pass.workload, own)
                if repriced is not None:
                    source = (
                        f"the analytic model priced on the inputs of the profiled workload itself "
                        f"({bytes_pass.workload}/{CONFIG_FILE} and {METRICS_FILE}: {what}), counted FLOPs from "
                        "its Stage 1 figures"
                    )
                    return instance_costs(own, repriced), source, warning
                source = (
                    f"Stage 1's figures of the profiled workload itself ({bytes_pass.workload}/{METRICS_FILE}: {what})"
                )
                return instance_costs(own), source, note
        if self.workload is None:
            return {}, "", warning
        passes, count = len(self.workload.forwards), len(self.workload.images)
        source = (
            f"the nsys workload's Stage 1 figures averaged over its {passes} timed passes of {count} image(s) "
            "(the profiled workload left none)"
        )
        return instance_costs(self.workload), source, warning

    def _repriced(self, folder: str, own: Stage1Metrics) -> tuple[dict[str, float] | None, str]:
        """The analytic bytes per stage of `own` (the workload in `folder`) from the current analytic model (None
        where its config is missing or the model is not priced), and a warning when pricing failed."""
        found = self.models.get(folder)
        if found is None or not reprices(own):
            return None, ""
        if found.model is None:
            return None, _unpriced(folder, found.problem)
        try:
            return repriced_bytes(own, found.model), ""
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            return None, _unpriced(folder, exc)

    def measured_bytes(
        self, bandwidth: PeakFigure | None, l2_cache_bytes: int | None
    ) -> tuple[MeasuredBytes | None, list[str]]:
        """Measured DRAM bytes per stage instance beside the analytic ones (None without a bytes pass), and
        warnings on passes that gave nothing or windows that missed kernels."""
        passes = self.targets.bytes_passes if self.targets else ()
        if not passes:
            return None, []
        compute = self.compute_peak()
        ridge = compute.value / bandwidth.value if compute and bandwidth else None
        rows: list[MeasuredBytesRow] = []
        warnings: list[str] = []
        exports: dict[Path, list[LaunchBytes]] = {}  # the profiler window's one export serves every pass: read once
        for bytes_pass in passes:
            raw = self.run_dir / bytes_pass.folder / "raw.csv"
            if bytes_pass.note or not raw.is_file():
                why = bytes_pass.note or f"{bytes_pass.folder}/raw.csv is missing"
                warnings.append(f"No measured bytes for {bytes_pass.instance}: {why}.")
                continue
            if raw not in exports:
                exports[raw] = read_launch_bytes(raw)
            launches = exports[raw]
            if bytes_pass.profiler_window:  # one export for every stage: this pass's launches are inside its range
                launches = [x for x in launches if bytes_pass.stage in x.ranges]
            if not launches:
                warnings.append(f"No measured bytes for {bytes_pass.instance}: ncu profiled no kernel.")
                continue
            warnings.extend(window_warnings(bytes_pass, launches))
            costs, source, warning = self.bytes_pass_costs(bytes_pass)
            warnings.extend([warning] if warning else [])
            rows.extend(
                measured_rows(
                    bytes_pass,
                    bytes_by_range(launches),
                    launches,
                    costs,
                    source or None,
                    bandwidth=bandwidth,
                    ridge=ridge,
                    l2_cache_bytes=l2_cache_bytes,
                )
            )
        result = MeasuredBytes(
            rows=tuple(rows),
            cache_control=", ".join(dict.fromkeys(p.cache_control for p in passes)),
            bandwidth_peak=bandwidth,
            ridge_point=ridge,
            l2_cache_bytes=l2_cache_bytes,
        )
        return result, warnings

    # ---- everything ---------------------------------------------------------------------------------------------
    def metrics(self) -> Stage2Metrics:
        """Everything the Stage 2 reports show."""
        rows = self.stage_rows()
        warnings: list[str] = []
        if not rows:
            warnings.append(f"The trace holds no NVTX range of the {vocab.NVTX_DOMAIN} domain: no per-stage figures.")
        ncu_rows, ncu_warnings = self.ncu_rows()
        device = attrs.evolve(self.trace.device(), driver=self.driver)
        compute_roofs, bandwidth_roof = self.roofs(device.name or "")
        measured, bytes_warnings = self.measured_bytes(bandwidth_roof, device.l2_cache_bytes)
        sampled, sampled_warnings = self.sampled_dram(rows, device.name or "", measured)
        workload = self.workload
        return Stage2Metrics(
            schema_version=SCHEMA_VERSION,
            stage="stage2",
            run_id=self.capture.run_id,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            mode=self.capture.mode,
            device=device,
            tools=self.capture.tools,
            ncu_clock_control=self.capture.ncu_clock_control,
            tool_runs={k: ToolRunResult(v.seconds, v.returncode) for k, v in self.capture.runs.items()},
            forwarded_overrides=self.capture.forwarded_overrides,
            model=workload.model if workload else None,
            workload_settings=workload.settings if workload else None,
            peak=self.compute_peak(),
            compute_roofs=compute_roofs,
            bandwidth_peak=bandwidth_roof,
            stages=rows,
            decode_steps=self.trace.decode_steps(),
            kernel_count=self.trace.kernel_count(),
            top_kernels=tuple(self.timed_pass_kernels()[:TOP_OVERALL]),
            top_kernels_by_stage=self.top_kernels_by_stage(tuple(r.stage for r in rows)),
            analysed_stages=self.analysed_stages(rows),
            ncu_kernels=ncu_rows,
            warnings=(*warnings, *ncu_warnings, *bytes_warnings, *sampled_warnings),
            measured_bytes=measured,
            sampled_dram=sampled,
        )

    def sampled_dram(
        self, rows: Sequence[StageRow], device_name: str, measured: MeasuredBytes | None
    ) -> tuple[SampledDram | None, list[str]]:
        """DRAM bytes per instance of each stage with kernels (the whole decode aside: its steps stand for it) from
        the trace's sampled GPU metrics, beside the bytes pass's figure of the same stage; None without samples.
        Only instances with no dropped sample under their kernels count. The samples are % of the GPU's datasheet
        DRAM peak (checked against kernels of known traffic, bench/nsys_dram_scale.py), whatever MBU divides by."""
        samples = self.trace.dram_samples()
        if samples is None:
            return None, []
        bandwidth = peak_bandwidth(device_name)
        if bandwidth is None:
            return None, [
                f"nsys sampled DRAM throughput, but {device_name or 'this GPU'} has no datasheet DRAM peak "
                "to scale it by."
            ]
        read, write = samples
        ncu = {r.stage: r.measured_bytes for r in (measured.rows if measured else ())}
        out, warnings = [], []
        for row in rows:
            if row.stage == vocab.DECODE or not row.kernels:
                continue
            instances = [merge_intervals(i) for i in self.trace.instance_intervals(row.stage) if i]
            covered = [b for b in instances if read.covers(b) and write.covers(b)]
            if not covered:
                if instances:
                    warnings.append(
                        f"nsys dropped the DRAM samples under every instance of {row.stage} "
                        f"({len(instances)}): no sampled bytes for it."
                    )
                continue
            n = len(covered)
            seconds = [read.integral(b) for b in covered], [write.integral(b) for b in covered]
            busy = sum(e - s for b in covered for s, e in b) / n
            out.append(
                SampledDramRow(
                    stage=row.stage,
                    instances=n,
                    busy_ms=busy / 1e6,
                    dram_read_bytes=sum(seconds[0]) / n * bandwidth.value,
                    dram_write_bytes=sum(seconds[1]) / n * bandwidth.value,
                    ncu_bytes=ncu.get(row.stage),
                    left_out=len(instances) - n,
                )
            )
        sampled = SampledDram(
            rows=tuple(out),
            period_us=None if read.period_ns is None else read.period_ns / 1e3,
            scale=bandwidth,
            span_s=read.span_ns / 1e9,
            dropped_s=read.dropped_ns / 1e9,
            gap_periods=GAP_PERIODS,
        )
        return sampled, warnings

"""Stage 2's Markdown from its `Stage2Metrics` record: kernels.md, report.md, stakeholder_summary.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from llm_perf_opt.kernel_names import kernel_label
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import NOT_KNOWN
from llm_perf_opt.records.stage2 import KernelStat, MeasuredBytes, MeasuredBytesRow, SampledDram, Stage2Metrics
from llm_perf_opt.records.whatif import WhatIfRecord
from llm_perf_opt.report import stage2_plots
from llm_perf_opt.report.markdown import Doc, link, ms, num_bytes, number, pct, ratio_text, time_budget_text
from llm_perf_opt.report.modules_report import launched_by
from llm_perf_opt.report.recommendations import DECODE_LEVERS, measured_lever_lines, measured_override_keys

LOW_BUSY = 0.5  # GPU-busy fraction under which a stage is launch/CPU bound rather than GPU bound


def _label(kernel: KernelStat) -> str:
    return f"`{kernel_label(kernel.name, kernel.demangled)}`"


def _times(kernel: KernelStat) -> list[str]:
    """A kernel's total and mean ms and its share, as kernels.md's tables show them."""
    return [ms(kernel.total_ms, 3), ms(kernel.mean_ms, 4), pct(kernel.share)]


def _fraction(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


# The columns Nsight Compute's figures fill, after a kernel's nsys times (`_ncu_cells`).
_NCU_HEADER = ("TFLOP/s (ncu)", "DRAM GB/s (ncu)", "FLOP/byte", "SM % of peak", "memory % of peak", "bound")
_KERNEL_HEADER = ["#", "kernel", "stage", "calls", "total ms", "mean ms", "% of stage GPU time", *_NCU_HEADER]


def _ncu_cells(m: Stage2Metrics, stage: str, name: str) -> list[str]:
    row = m.ncu_row(stage, name)
    if row is None:
        return [""] * len(_NCU_HEADER)
    return [
        number(row.achieved_tflops, 2),
        f"{row.dram_gbps:,.0f}",
        number(row.arithmetic_intensity),
        pct(_fraction(row.sm_throughput_pct)),
        pct(_fraction(row.dram_throughput_pct)),
        row.bound,
    ]


def _model_name(m: Stage2Metrics) -> str:
    return m.model.name if m.model else "workload"


def _device_name(m: Stage2Metrics) -> str:
    return m.device.name or "GPU"


def _kernel_roofline_section(doc: Doc, m: Stage2Metrics, plots: Mapping[str, str]) -> None:
    """The kernel roofline chart with its caption, or why there is none; nothing when ncu did not run."""
    if not m.ncu_kernels and "kernel_roofline" not in plots:
        return
    doc.h2("Roofline of the profiled kernels")
    if "kernel_roofline" in plots:
        doc.image("Profiled kernels on the device's roofline", plots["kernel_roofline"])
        doc.para(stage2_plots.roofline_caption(m))
    else:
        doc.para(f"No kernel roofline chart: {stage2_plots.missing_reason(m)}.")


#: The column naming what launched each kernel, where a Stage 1 profiled pass was joined.
LAUNCHED_BY = "launched by (operator in module, share; Stage 1)"


def _named(m: Stage2Metrics) -> bool:
    return m.kernel_modules is not None and m.kernel_modules.stage1 is not None and bool(m.kernel_modules.kernels)


def _launched_by(m: Stage2Metrics, label: str) -> list[str]:
    """The "launched by" cell of one kernel (by its kernels.md label); no cell when no Stage 1 pass was joined."""
    if m.kernel_modules is None or not _named(m):
        return []
    found = m.kernel_modules.kernels.get(label)
    return [launched_by(found) if found is not None else "not in the Stage 1 profiled pass"]


def _ncu_launchers_section(doc: Doc, m: Stage2Metrics) -> None:
    """The kernels Nsight Compute targeted, named by what launched them."""
    if not m.ncu_kernels:
        return
    doc.h2("Kernels Nsight Compute profiled, by what launched them")
    if not _named(m):
        doc.para(f"{NOT_KNOWN}: see the note at the top.")
        return
    doc.table(
        ["stage", "kernel", "launches (ncu)", "bound", LAUNCHED_BY],
        [
            [r.stage, f"`{label}`", str(r.launches), r.bound, *_launched_by(m, label)]
            for r in m.ncu_kernels
            for label in [kernel_label(r.name, r.full_name)]
        ],
    )


def _stage_kernel_rows(m: Stage2Metrics, stage: str, kernels: Sequence[KernelStat]) -> list[list[str]]:
    """One row per kernel of `stage`; the bound of a function name that several of them share is marked †."""
    names = [k.name for k in kernels]
    rows = []
    for i, k in enumerate(kernels, 1):
        row = [str(i), _label(k), stage, str(k.calls), *_times(k), *_ncu_cells(m, stage, k.name)]
        if names.count(k.name) > 1 and row[-1]:
            row[-1] += " †"
        rows.append(row + _launched_by(m, kernel_label(k.name, k.demangled)))
    return rows


def kernels_md(m: Stage2Metrics, plots: Mapping[str, str] | None = None) -> str:
    """The kernel tables per stage (nsys times, ncu roofline figures), after the kernel roofline chart in `plots`
    (name -> path relative to the folder)."""
    doc = Doc(f"Kernels: {_model_name(m)} on {_device_name(m)}")
    km = m.kernel_modules
    launchers = f"{NOT_KNOWN}: a folder rendered before kernels were named by module" if km is None else km.note
    doc.para(
        "Time columns from Nsight Systems (all timed passes, warm-up excluded); roofline columns from Nsight "
        f"Compute on the targeted launches (clock control: {m.ncu_clock_control}; ncu flushes caches "
        "between replays, so its durations are not the run's durations). Kernel names are nsys short names; "
        "ncu selects kernels by function name, so where several instantiations share a name (marked †) its "
        f"figures cover all of them. {launchers}."
    )
    _kernel_roofline_section(doc, m, plots or {})
    extra = [LAUNCHED_BY] if _named(m) else []
    for stage, kernels in m.top_kernels_by_stage.items():
        doc.h2(stage)
        doc.table(_KERNEL_HEADER + extra, _stage_kernel_rows(m, stage, kernels))
    doc.h2("All timed passes (kernels inside preprocess, prefill and decode)")
    doc.table(
        ["#", "kernel", "calls", "total ms", "mean ms", "% of timed-pass kernel time", *extra],
        [
            [str(i), _label(k), str(k.calls), *_times(k), *_launched_by(m, kernel_label(k.name, k.demangled))]
            for i, k in enumerate(m.top_kernels, 1)
        ],
    )
    _ncu_launchers_section(doc, m)
    return doc.text()


def _stage_rows(m: Stage2Metrics) -> list[dict[str, str]]:
    return [
        {
            "stage": r.stage,
            "instances": str(r.instances),
            "NVTX range wall ms": ms(r.wall_ms),
            "Stage 1 CUDA-event ms": ms(r.stage1_cuda_event_ms),
            "GPU busy ms (nsys)": ms(r.gpu_busy_ms),
            "summed kernel ms": ms(r.kernel_ms),
            "GPU busy / wall": pct(r.busy_fraction),
            "kernels": f"{r.kernels:,}",
            "MFU on busy time": pct(r.mfu_on_busy_time, 2),
            "MBU on busy time": pct(r.mbu_on_busy_time, 2),
        }
        for r in m.stages
    ]


def _pair(measured: str, analytic: str) -> str:
    return f"{measured} / {analytic}"


def _measured_bytes_rows(rows: Sequence[MeasuredBytesRow]) -> list[dict[str, str]]:
    return [
        {
            "stage": r.stage,
            "instance": r.instance,
            "kernels": f"{r.kernels:,}",
            "kernel ms (ncu)": ms(r.kernel_ms, 2),
            "DRAM read": num_bytes(r.dram_read_bytes),
            "DRAM write": num_bytes(r.dram_write_bytes),
            "measured bytes": num_bytes(r.measured_bytes),
            "analytic bytes": num_bytes(r.analytic_bytes),
            "measured / analytic": ratio_text(r.ratio),
            "FLOP/byte (measured / analytic)": _pair(number(r.measured_intensity), number(r.analytic_intensity)),
            "bound (measured / analytic)": _pair(r.measured_bound or "n/a", r.analytic_bound or "n/a"),
            "MBU (measured / analytic)": _pair(pct(r.measured_mbu, 2), pct(r.analytic_mbu, 2)),
        }
        for r in rows
    ]


def _cache_text(cache_control: str) -> str:
    if cache_control == "none":
        return (
            "with `--cache-control none`: ncu does not flush the caches between kernels, so a kernel's DRAM bytes are "
            "those of the real kernel sequence (ncu's default, `all`, flushes L1 and L2 before each kernel, which "
            "sends every input to DRAM again and overstates the traffic of kernels whose inputs the previous kernel "
            "left in L2)"
        )
    return (
        f"with `--cache-control {cache_control}`: ncu flushes L1 and L2 before each kernel, so every kernel reads "
        "its inputs from DRAM again and the bytes overstate those of the real kernel sequence"
    )


def _measured_bytes_section(doc: Doc, mb: MeasuredBytes | None) -> None:
    doc.h2("Measured DRAM bytes per stage instance (Nsight Compute)")
    if mb is None:
        doc.para(
            "Not collected: this run had no Nsight Compute bytes pass, one more process that profiles every kernel "
            "of one prefill and one decode step (`stage2.mode=deep` runs it, light mode does not; "
            "`pipeline.ncu.bytes_pass=true` adds it to either; folders written before it existed have none). Bytes "
            "and MBU above are the analytic model's."
        )
        return
    sources = list(dict.fromkeys(r.analytic_source for r in mb.rows if r.analytic_source))
    ridge = "" if mb.ridge_point is None else f" ({mb.ridge_point:,.0f} FLOP/byte)"
    bandwidth = mb.bandwidth_peak
    peak = "" if bandwidth is None else f" MBU divides by {bandwidth.value / 1e9:,.0f} GB/s ({bandwidth.source})."
    doc.para(
        "Nsight Compute profiled every kernel of one instance of each stage (the table's instances; each "
        "kernel's NVTX ranges give its stages), collecting only "
        "`dram__bytes_read.sum`, `dram__bytes_write.sum` and `gpu__time_duration.sum`) "
        + _cache_text(mb.cache_control)
        + ". Profiling still serialises the kernels, and a dirty L2 line counts as written when it is evicted, "
        "possibly during a later kernel. Analytic bytes and counted FLOPs per instance: "
        + ("; ".join(sources) if sources else "none recorded (no Stage 1 analytic figures for this workload)")
        + ". The analytic bytes count every module's inputs and outputs once, with the layout copies the "
        "implementation makes (SAM: the reshape copy of its rel-pos bias, the q/k/v split and head merge, window "
        "padding and crop, the layer norms' input copies), and subtract nothing for what L2 keeps between kernels: "
        "measured bytes below them are L2 hits. MBU is over the summed kernel durations ncu measured (kernels back "
        "to back, no launch gaps), for the "
        "measured and the analytic bytes alike; the bound compares FLOP/byte with the ridge point" + ridge + "." + peak
    )
    if not mb.rows:
        doc.para("The bytes pass gave no figures: see Warnings.")
        return
    doc.keyed_table(_measured_bytes_rows(mb.rows))
    reasons = [f"{r.stage} ({ratio_text(r.ratio)}): {r.why}." for r in mb.rows if r.why]
    if reasons:
        doc.para("Why measured and analytic bytes differ (where they differ by more than 10%):")
        doc.bullets(reasons)
    doc.para("Largest DRAM consumers per stage instance (bytes read + written, share of the stage's measured bytes):")
    doc.bullets(
        [
            f"{r.stage}: "
            + ", ".join(
                f"`{k.name}` {num_bytes(k.dram_bytes)} ({k.dram_bytes / r.measured_bytes:.0%}, {k.launches:,} "
                f"launch{'es' if k.launches != 1 else ''})"
                for k in r.top_kernels[:3]
                if k.dram_bytes > 0
            )
            for r in mb.rows
            if r.top_kernels and r.measured_bytes > 0
        ]
    )


def _sampled_dram_section(doc: Doc, sampled: SampledDram | None) -> None:
    """DRAM bytes per stage instance from nsys's sampled GPU metrics, beside the bytes pass's where both exist."""
    if sampled is None:
        return
    doc.h2("DRAM bytes per stage instance from sampled GPU metrics (Nsight Systems)")
    period = "" if sampled.period_us is None else f" every {sampled.period_us:,.1f} µs"
    dropped = ""
    if sampled.dropped_s and sampled.span_s:
        gaps = "" if sampled.gap_periods is None else f" (gaps longer than {sampled.gap_periods:g} sample periods)"
        dropped = (
            f" nsys dropped the samples of {sampled.dropped_s:,.1f} s of its {sampled.span_s:,.1f}-s span{gaps}; an "
            "instance whose kernels touch a gap is left out, so the instances column counts those measured."
        )
    doc.para(
        f"nsys sampled the GPU's DRAM read and write throughput{period} during its run (`--gpu-metrics-devices`, "
        "`pipeline.nsys.gpu_metrics_hz`). Each sample is the traffic since the previous one, in % of the DRAM peak, "
        f"taken here as {sampled.scale.value / 1e9:,.0f} GB/s ({sampled.scale.source}); an instance's bytes are the "
        "samples integrated over its kernels' busy intervals (host gaps left out; a sample shared by a kernel and a "
        "gap still blurs by its length, so rates below 100 kHz undercount launch-bound stages), averaged over the "
        "instances of the timed passes. No kernel is profiled: the figures come with the trace, and a kernel's own "
        "bytes are the bytes pass's." + dropped
    )
    header = ["stage", "instances", "busy ms per instance", "DRAM read", "DRAM write", "bytes per instance"]
    with_ncu = any(r.ncu_bytes is not None for r in sampled.rows)
    header += ["bytes pass (ncu)", "sampled / ncu"] if with_ncu else []
    rows = []
    for r in sampled.rows:
        count = f"{r.instances} of {r.instances + r.left_out}" if r.left_out else str(r.instances)
        cells = [r.stage, count, ms(r.busy_ms, 2)]
        cells += [num_bytes(r.dram_read_bytes), num_bytes(r.dram_write_bytes), num_bytes(r.dram_bytes)]
        if with_ncu:
            ratio = f"{r.dram_bytes / r.ncu_bytes:.2f}×" if r.ncu_bytes else "n/a"
            cells += [num_bytes(r.ncu_bytes), ratio]
        rows.append(cells)
    if rows:
        doc.table(header, rows)
    else:
        doc.para("No stage instance lay where the samples were whole: see Warnings.")


def _decode_launch_bound(m: Stage2Metrics) -> bool:
    return m.decode_steps is not None and m.decode_steps.gpu_busy_fraction < LOW_BUSY


# How the findings name each ncu bound label (nsight.ncu_report documents the thresholds).
_BOUND_WORDS = {
    "compute": "compute-bound",
    "memory": "memory-bound",
    "compute-leaning": "leaning compute-bound",
    "memory-leaning": "leaning memory-bound",
    "latency": "latency-bound",
}


def findings(m: Stage2Metrics) -> list[str]:
    """Data-driven statements for the summaries."""
    out = []
    dec = m.decode_steps
    if dec:
        msg = (
            f"Decode: {dec.steps} steps at {dec.step_wall_ms:.2f} ms each, {dec.kernels_per_step:.0f} "
            f"kernels per step averaging {dec.mean_kernel_us:.1f} µs; the GPU is busy "
            f"{dec.gpu_busy_fraction:.0%} of each step."
        )
        if _decode_launch_bound(m):
            runtime = m.workload_settings.runtime if m.workload_settings is not None else None
            if runtime is not None and runtime.uses_cuda_graphs:
                msg += (
                    " The step already replays a CUDA graph, so the GPU waits on the host work around it (Python, "
                    "the next step's inputs, the graph launch): more pages per forward (`run.batch_size`) spread that "
                    "fixed cost over more tokens."
                )
            else:
                moe = m.model is not None and m.model.experts_implementation is not None
                msg += (
                    " Most of a step is launch and Python overhead, not GPU work: CUDA graphs / torch.compile "
                    f"(reduce-overhead){' or fusing the per-expert work' if moe else ''} would shorten it more than "
                    "faster kernels."
                )
        out.append(msg)
    pre = m.stage_row(vocab.PREFILL)
    if pre:
        out.append(
            f"Prefill: GPU busy {pre.busy_fraction:.0%} of its wall time"
            + (f", {pre.mfu_on_busy_time:.1%} MFU over its busy time" if pre.mfu_on_busy_time else "")
            + "."
        )
    if m.top_kernels:
        top = m.top_kernels[0]
        out.append(
            f"Hottest kernel of the timed passes: {_label(top)}, {top.share:.0%} of their kernel time "
            f"({top.calls} calls, {top.total_ms:.1f} ms)."
        )
    compared = [r for r in (m.measured_bytes.rows if m.measured_bytes else ()) if r.ratio is not None]
    if compared:
        out.append(
            "Measured DRAM bytes (Nsight Compute, one instance each) against the analytic count: "
            + ", ".join(f"{r.stage} {ratio_text(r.ratio)}" for r in compared)
            + "."
        )
    counts = Counter(r.bound for r in m.ncu_kernels if r.bound in _BOUND_WORDS)
    if counts:
        out.append(
            "Nsight Compute on the targeted kernels: "
            + ", ".join(f"{n} {_BOUND_WORDS[b]}" for b, n in counts.items())
            + "."
        )
    return out


def _mfu_peak_text(m: Stage2Metrics) -> str:
    if m.peak is None:
        return "; no peak is known for this GPU."
    return f" and the {m.peak.value / 1e12:,.1f} TFLOP/s dense peak ({m.peak.source})."


def report_md(m: Stage2Metrics, files: Sequence[str]) -> str:
    doc = Doc(f"Stage 2 report: {_model_name(m)} on {_device_name(m)}")
    nsys, ncu = m.tools.get("nsys"), m.tools.get("ncu")
    weights = m.model.weights_detail if m.model else "workload metrics not recorded"
    doc.para(
        f"Run `{m.run_id}` · mode {m.mode} · {weights} · "
        f"nsys {nsys.version if nsys else 'n/a'}, ncu {ncu.version if ncu else 'not run'} · "
        f"driver {m.device.driver}."
    )
    if (budget := time_budget_text(m.time_budget)) is not None:
        doc.para(budget)
    doc.h2("At a glance")
    doc.bullets(findings(m))
    if m.warnings:
        doc.h2("Warnings")
        doc.bullets(m.warnings)
    doc.h2("GPU time per stage (all timed passes)")
    doc.para(
        "Cross-check: the NVTX range wall time (CPU side), Stage 1's CUDA-event time of the same passes, the GPU "
        "busy time (union of the kernels launched inside the range) and the summed kernel time. Busy / wall "
        "under 100% means the GPU waited for the host. MBU on busy time divides the analytic bytes of the same "
        "passes (priced by the current analytic model where the workload's config.yaml is in the folder, else "
        "Stage 1's) by GPU busy time and the peak bandwidth. Tracing slows kernel launches, so wall times under nsys "
        "are longer than in a plain Stage 1 run: take latency from Stage 1, GPU work from here. "
        "MFU here divides the counted FLOPs by GPU busy time" + _mfu_peak_text(m)
    )
    doc.keyed_table(_stage_rows(m))
    _measured_bytes_section(doc, m.measured_bytes)
    _sampled_dram_section(doc, m.sampled_dram)
    doc.h2("Top kernels")
    doc.para(
        "Per stage with Nsight Compute's roofline figures, and the profiled kernels on the roofline chart: "
        "[kernels.md](kernels.md)."
    )
    doc.table(
        ["#", "kernel", "calls", "total ms", "% of timed-pass kernel time"],
        [
            [str(i), _label(k), str(k.calls), ms(k.total_ms, 2), pct(k.share)]
            for i, k in enumerate(m.top_kernels[:10], 1)
        ],
    )
    doc.h2("Tools")
    doc.bullets([f"{k}: {v.seconds:.1f} s (exit {v.returncode})" for k, v in m.tool_runs.items() if v.seconds])
    doc.para("Commands: each tool folder's `cmd.txt` (listed below); raw reports and exports under `nsys/` and `ncu/`.")
    doc.h2("Files")
    doc.bullets([link(f, f) for f in sorted(set(files)) if f.endswith((".md", ".json", ".yaml", ".txt", ".png"))])
    return doc.text()


def stakeholder_md(m: Stage2Metrics, whatif: WhatIfRecord | None = None) -> str:
    """The short summary; `whatif`: a what-if run whose measured levers the recommendations cite first."""
    doc = Doc(f"Stakeholder summary (Stage 2): {_model_name(m)} on {_device_name(m)}")
    doc.h2("Executive summary")
    doc.bullets(findings(m))
    doc.h2("Where GPU time goes")
    doc.keyed_table(_stage_rows(m))
    doc.h2("Recommendations")
    recs = [] if whatif is None else measured_lever_lines(whatif, _device_name(m), _model_name(m))
    tried = frozenset() if whatif is None else measured_override_keys(whatif)
    dec = m.decode_steps
    graphs = m.workload_settings is not None and m.workload_settings.runtime.uses_cuda_graphs  # already in force
    if dec and _decode_launch_bound(m) and not graphs and not tried >= DECODE_LEVERS:
        recs.append(
            f"Batch-1 decode keeps the GPU busy only {dec.gpu_busy_fraction:.0%} of the time with "
            f"{dec.kernels_per_step:.0f} launches per step: capture the decode step in a CUDA graph "
            "(static KV cache) or compile it, and batch pages."
        )
    mem = [r for r in m.ncu_kernels if r.bound == "memory"]
    if mem:
        recs.append(
            f"{len(mem)} targeted kernel(s) are memory-bound (e.g. `{mem[0].name}`): fusion and fewer "
            "intermediate tensors pay off there."
        )
    if not recs:
        recs.append("No single bottleneck stands out; compare modes or GPUs with Stage 1.")
    doc.bullets(recs)
    if m.warnings:
        doc.h2("Caveats")
        doc.bullets(m.warnings)
    return doc.text()

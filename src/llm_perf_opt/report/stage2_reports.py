"""Stage 2's artifacts from its exports: metrics.json, kernels.md, report.md, stakeholder_summary.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llm_perf_opt.artifacts import to_plain
from llm_perf_opt.hardware import peak_bandwidth, peak_compute
from llm_perf_opt.kernel_names import kernel_label
from llm_perf_opt.nsight.ncu_report import read_ncu_raw_csv
from llm_perf_opt.nsight.nsys_trace import KernelStat, NsysTrace
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.report import stage2_plots
from llm_perf_opt.report.markdown import Doc, ms, pct

TOP_OVERALL = 20
TOP_PER_STAGE = 10
LOW_BUSY = 0.5  # GPU-busy fraction under which a stage is launch/CPU bound rather than GPU bound


def _stage1_ms(workload: Mapping[str, Any] | None) -> dict[str, float]:
    """Stage 1 CUDA-event time per stage, summed over the workload's timed passes."""
    if not workload:
        return {}
    out: dict[str, float] = {}

    def add(stage: str, value: float) -> None:
        out[stage] = out.get(stage, 0.0) + float(value)

    for rec in workload.get("records", []):
        add(vocab.PREPROCESS, rec["preprocess_ms"])
        add(vocab.PREFILL, rec["prefill_ms"])
        for stage, value in rec["vision_ms"].items():
            add(stage, value)
        if rec["decode_step_ms"]:
            add(vocab.DECODE, rec["decode_ms"])
            add(vocab.DECODE_STEP, sum(rec["decode_step_ms"]))
    return out


def _stage_flops(workload: Mapping[str, Any] | None) -> dict[str, float]:
    """Counted FLOPs per stage over the workload's timed passes."""
    if not workload:
        return {}
    per_image = workload.get("flops_per_image", {})
    out: dict[str, float] = {}
    for rec in workload.get("records", []):
        for stage, value in per_image.get(rec["image"], {}).items():
            out[stage] = out.get(stage, 0.0) + float(value)
    return out


def _stage_bytes(workload: Mapping[str, Any] | None) -> dict[str, float]:
    """Analytic bytes per stage over the workload's timed passes (from Stage 1's efficiency table)."""
    return {row["stage"]: float(row["bytes"]) for row in (workload or {}).get("efficiency") or []}


def _peak(workload: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    for row in (workload or {}).get("mfu", []):
        if row.get("peak"):
            return dict(row["peak"])
    return None


def _counts_tensor_ops(raw: Path) -> bool:
    """Whether the ncu raw CSV's header has a tensor-core op counter (`sm__ops_path_tensor_src_*`): without one,
    its FLOPs cover CUDA-core work only and are too low for any kernel that ran on tensor cores."""
    with raw.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if '"Kernel Name"' in line or line.startswith('"ID"'):
                return '"sm__ops_path_tensor_src_' in line
    return False


def timed_pass_kernels(trace: NsysTrace) -> list[KernelStat]:
    """Every kernel launched inside the timed passes' top-level ranges (preprocess, prefill, decode), hottest first.

    The model build and the warm-up passes run outside every range, so their kernels (weight initialisation,
    first-call autotuning) are left out; `share` is of the timed passes' kernel time.
    """
    merged: dict[tuple[str, str], list[float]] = {}
    for stage in (vocab.PREPROCESS, vocab.PREFILL, vocab.DECODE):
        for k in trace.top_kernels(1_000_000, stage=stage):
            key = (k.name, k.demangled)
            calls, total, low, high = merged.get(key, [0, 0.0, float("inf"), 0.0])
            merged[key] = [calls + k.calls, total + k.total_ms, min(low, k.min_ms), max(high, k.max_ms)]
    grand = sum(v[1] for v in merged.values())
    out = [
        KernelStat(
            name=name,
            demangled=demangled,
            stage=None,
            calls=int(calls),
            total_ms=total,
            mean_ms=total / calls,
            min_ms=low,
            max_ms=high,
            share=total / grand if grand else 0.0,
        )
        for (name, demangled), (calls, total, low, high) in merged.items()
    ]
    return sorted(out, key=lambda k: (-k.total_ms, k.demangled, k.name))


def _stage_kernel_time(trace: NsysTrace, stage: str) -> dict[str, tuple[float, float, int]]:
    """nsys short name -> (GPU ms, share of the stage's kernel time, instantiations), every instantiation summed."""
    out: dict[str, tuple[float, float, int]] = {}
    for k in trace.top_kernels(1_000_000, stage=stage):
        ms_so_far, share_so_far, count = out.get(k.name, (0.0, 0.0, 0))
        out[k.name] = (ms_so_far + k.total_ms, share_so_far + k.share, count + 1)
    return out


def _stage_ncu_rows(run_dir: Path, stage: str, target: Mapping[str, Any], trace: NsysTrace) -> list[dict[str, Any]]:
    """One row per kernel name that ncu profiled in `stage` (first round that reached it), with its nsys GPU time."""
    times = _stage_kernel_time(trace, stage)
    found: dict[str, dict[str, Any]] = {}
    for rnd in target.get("rounds", []):
        raw = run_dir / rnd["folder"] / "raw.csv"
        if not raw.is_file():
            continue
        tensor = _counts_tensor_ops(raw)
        for kernel in read_ncu_raw_csv(raw):
            gpu_ms, share, instantiations = times.get(kernel.name, (None, None, 0))
            found.setdefault(
                kernel.name,
                {
                    "stage": stage,
                    "round_folder": rnd["folder"],
                    **to_plain(kernel),
                    "tensor_ops_counted": tensor,
                    "stage_gpu_ms": gpu_ms,  # nsys, all timed passes
                    "stage_share": share,  # of the stage's summed kernel time (nsys)
                    "stage_instantiations": instantiations,  # nsys kernels sharing this function name
                },
            )
    return list(found.values())


def _ncu_rows(
    run_dir: Path, trace: NsysTrace, targets: Mapping[str, Any] | None, warnings: list[str]
) -> list[dict[str, Any]]:
    """The ncu rows of every targeted stage; notes rounds and kernels ncu missed in `warnings`."""
    rows: list[dict[str, Any]] = []
    for stage, target in ((targets or {}).get("stages") or {}).items():
        found = _stage_ncu_rows(run_dir, stage, target, trace)
        rows.extend(found)
        warnings.extend(f"{stage}: {rnd['note']}." for rnd in target.get("rounds", []) if rnd.get("note"))
        names = {r["name"] for r in found}
        missed = [n for n in target.get("kernels", []) if n not in names]
        if target.get("kernels") and not found:
            warnings.append(f"Nsight Compute profiled no kernel in {stage} (filters matched nothing); see ncu logs.")
        elif missed:
            warnings.append(
                f"Nsight Compute did not reach {len(missed)} of the {len(target['kernels'])} targeted kernels in "
                f"{stage} within its launch windows: {', '.join(missed[:5])}."
            )
    return rows


def _roofs(
    device_name: str, peak: Mapping[str, Any] | None, bandwidth: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Compute roofs (highest first) and the memory roof for the kernel roofline.

    Compute: the workload's peak (its dtype, or the user's override), else the GPU table's dense BF16 tensor-core
    peak; plus the table's FP32 CUDA-core peak, the roof of kernels that do not use tensor cores. Memory: the
    workload's bandwidth peak, else the table's. Each keeps its source; unknown GPUs give none.
    """
    compute = [dict(peak)] if peak else []
    for dtype in ([] if peak else ["bfloat16"]) + ["float32"]:
        figure = peak_compute(device_name, dtype)
        if figure is not None and figure.dtype_key not in {c.get("dtype_key") for c in compute}:
            compute.append(to_plain(figure))
    compute.sort(key=lambda c: -float(c["value"]))
    if bandwidth:
        return compute, dict(bandwidth)
    table_bw = peak_bandwidth(device_name)
    return compute, None if table_bw is None else to_plain(table_bw)


def build_metrics(
    run_dir: Path,
    trace: NsysTrace,
    capture: Mapping[str, Any],
    targets: Mapping[str, Any] | None,
    workload: Mapping[str, Any] | None,
    env: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything the Stage 2 reports show, JSON-ready."""
    stage1 = _stage1_ms(workload)
    flops = _stage_flops(workload)
    peak = _peak(workload)
    moved = _stage_bytes(workload)
    bandwidth = (workload or {}).get("bandwidth_peak")
    warnings: list[str] = []
    stage_rows = []
    for st in trace.stage_times():
        row = to_plain(st)
        row["stage1_cuda_event_ms"] = stage1.get(st.stage)
        stage_flops = flops.get(st.stage)
        row["flops"] = stage_flops
        if stage_flops and st.gpu_busy_ms > 0:
            achieved = stage_flops / (st.gpu_busy_ms / 1e3)
            row["achieved_tflops_on_busy_time"] = achieved / 1e12
            row["mfu_on_busy_time"] = achieved / peak["value"] if peak else None
        stage_bytes = moved.get(st.stage)
        row["bytes"] = stage_bytes
        if stage_bytes and st.gpu_busy_ms > 0 and bandwidth:
            row["mbu_on_busy_time"] = stage_bytes / (st.gpu_busy_ms / 1e3) / bandwidth["value"]
        stage_rows.append(row)
    if not stage_rows:
        warnings.append("The trace holds no NVTX range of the llm_perf_opt domain: no per-stage figures.")
    analysed = [r["stage"] for r in stage_rows if r["stage"] in (vocab.PREFILL, vocab.DECODE)] or [
        r["stage"] for r in stage_rows
    ]
    per_stage = {
        name: [to_plain(k) for k in trace.top_kernels(TOP_PER_STAGE, stage=name)]
        for name in [r["stage"] for r in stage_rows]
        if name not in (vocab.DECODE_STEP,)
    }
    ncu_rows = _ncu_rows(run_dir, trace, targets, warnings)
    compute_roofs, bandwidth_roof = _roofs(str(trace.device().get("name") or ""), peak, bandwidth)
    decode = trace.decode_steps()
    tools = capture.get("tools", {})
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": "stage2",
        "run_id": capture.get("run_id", run_dir.name),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": capture.get("mode"),
        "device": {**trace.device(), "driver": (env.get("gpu") or {}).get("driver")},
        "tools": tools,
        "ncu_clock_control": capture.get("ncu_clock_control"),
        "tool_runs": {
            k: {"seconds": v.get("seconds"), "returncode": v.get("returncode")}
            for k, v in capture.get("runs", {}).items()
        },
        "forwarded_overrides": capture.get("forwarded_overrides", []),
        "model": (workload or {}).get("model"),
        "workload_settings": (workload or {}).get("settings"),
        "peak": peak,
        "compute_roofs": compute_roofs,
        "bandwidth_peak": bandwidth_roof,
        "stages": stage_rows,
        "decode_steps": to_plain(decode) if decode else None,
        "kernel_count": trace.kernel_count(),
        "top_kernels": [to_plain(k) for k in timed_pass_kernels(trace)[:TOP_OVERALL]],
        "top_kernels_by_stage": per_stage,
        "analysed_stages": analysed,
        "ncu_kernels": ncu_rows,
        "warnings": warnings,
    }


def _label(kernel: Mapping[str, Any]) -> str:
    return f"`{kernel_label(kernel['name'], kernel.get('demangled', ''))}`"


def _ncu_cells(m: Mapping[str, Any], stage: str, name: str) -> list[str]:
    row = next((r for r in m["ncu_kernels"] if r["stage"] == stage and r["name"] == name), None)
    if row is None:
        return ["", "", "", "", "", ""]
    tflops = row.get("achieved_tflops")
    ai = row.get("arithmetic_intensity")
    return [
        "n/a" if tflops is None else f"{tflops:,.2f}",
        f"{row['dram_gbps']:,.0f}",
        "n/a" if ai is None else f"{ai:,.1f}",
        pct(None if row.get("sm_throughput_pct") is None else row["sm_throughput_pct"] / 100),
        pct(None if row.get("dram_throughput_pct") is None else row["dram_throughput_pct"] / 100),
        str(row.get("bound", "")),
    ]


_KERNEL_HEADER = [
    "#",
    "kernel",
    "stage",
    "calls",
    "total ms",
    "mean ms",
    "% of stage GPU time",
    "TFLOP/s (ncu)",
    "DRAM GB/s (ncu)",
    "FLOP/byte",
    "SM % of peak",
    "memory % of peak",
    "bound",
]


def _kernel_roofline_section(doc: Doc, m: Mapping[str, Any], plots: Mapping[str, str]) -> None:
    """The kernel roofline chart with its caption, or why there is none; nothing when ncu did not run."""
    if not m["ncu_kernels"] and "kernel_roofline" not in plots:
        return
    doc.h2("Roofline of the profiled kernels")
    if "kernel_roofline" in plots:
        doc.image("Profiled kernels on the device's roofline", plots["kernel_roofline"])
        doc.para(stage2_plots.roofline_caption(m))
    else:
        doc.para(f"No kernel roofline chart: {stage2_plots.missing_reason(m)}.")


def kernels_md(m: Mapping[str, Any], plots: Mapping[str, str] | None = None) -> str:
    """The kernel tables per stage (nsys times, ncu roofline figures), after the kernel roofline chart in `plots`
    (name -> path relative to the folder)."""
    doc = Doc(f"Kernels: {(m.get('model') or {}).get('name', 'workload')} on {m['device'].get('name', 'GPU')}")
    doc.para(
        "Time columns from Nsight Systems (all timed passes, warm-up excluded); roofline columns from Nsight "
        f"Compute on the targeted launches (clock control: {m.get('ncu_clock_control')}; ncu flushes caches "
        "between replays, so its durations are not the run's durations). Kernel names are nsys short names; "
        "ncu selects kernels by function name, so where several instantiations share a name (marked †) its "
        "figures cover all of them."
    )
    _kernel_roofline_section(doc, m, plots or {})
    for stage, kernels in m["top_kernels_by_stage"].items():
        doc.h2(f"{stage}")
        shared = {k["name"] for k in kernels if sum(1 for o in kernels if o["name"] == k["name"]) > 1}
        rows = [
            [
                str(i),
                _label(k),
                stage,
                str(k["calls"]),
                ms(k["total_ms"], 3),
                ms(k["mean_ms"], 4),
                pct(k["share"]),
                *_ncu_cells(m, stage, k["name"]),
            ]
            for i, k in enumerate(kernels, 1)
        ]
        for row, k in zip(rows, kernels, strict=True):
            if k["name"] in shared and row[-1]:
                row[-1] += " †"
        doc.table(_KERNEL_HEADER, rows)
    doc.h2("All timed passes (kernels inside preprocess, prefill and decode)")
    doc.table(
        ["#", "kernel", "calls", "total ms", "mean ms", "% of timed-pass kernel time"],
        [
            [str(i), _label(k), str(k["calls"]), ms(k["total_ms"], 3), ms(k["mean_ms"], 4), pct(k["share"])]
            for i, k in enumerate(m["top_kernels"], 1)
        ],
    )
    return doc.text()


def _stage_table(m: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "stage",
        "instances",
        "NVTX range wall ms",
        "Stage 1 CUDA-event ms",
        "GPU busy ms (nsys)",
        "summed kernel ms",
        "GPU busy / wall",
        "kernels",
        "MFU on busy time",
        "MBU on busy time",
    ]
    rows = []
    for r in m["stages"]:
        rows.append(
            [
                r["stage"],
                str(r["instances"]),
                ms(r["wall_ms"]),
                ms(r.get("stage1_cuda_event_ms")),
                ms(r["gpu_busy_ms"]),
                ms(r["kernel_ms"]),
                pct(r["busy_fraction"]),
                f"{r['kernels']:,}",
                pct(r.get("mfu_on_busy_time"), 2),
                pct(r.get("mbu_on_busy_time"), 2),
            ]
        )
    return header, rows


def findings(m: Mapping[str, Any]) -> list[str]:
    """Data-driven statements for the summaries."""
    out = []
    by = {r["stage"]: r for r in m["stages"]}
    dec = m.get("decode_steps")
    if dec:
        msg = (
            f"Decode: {dec['steps']} steps at {dec['step_wall_ms']:.2f} ms each, {dec['kernels_per_step']:.0f} "
            f"kernels per step averaging {dec['mean_kernel_us']:.1f} µs; the GPU is busy "
            f"{dec['gpu_busy_fraction']:.0%} of each step."
        )
        if dec["gpu_busy_fraction"] < LOW_BUSY:
            moe = ((m.get("model") or {}).get("experts_implementation")) is not None
            msg += (
                " Most of a step is launch and Python overhead, not GPU work: CUDA graphs / torch.compile "
                f"(reduce-overhead){' or fusing the per-expert work' if moe else ''} would shorten it more than "
                "faster kernels."
            )
        out.append(msg)
    pre = by.get(vocab.PREFILL)
    if pre:
        out.append(
            f"Prefill: GPU busy {pre['busy_fraction']:.0%} of its wall time"
            + (f", {pre['mfu_on_busy_time']:.1%} MFU over its busy time" if pre.get("mfu_on_busy_time") else "")
            + "."
        )
    if m["top_kernels"]:
        top = m["top_kernels"][0]
        out.append(
            f"Hottest kernel of the timed passes: {_label(top)}, {top['share']:.0%} of their kernel time "
            f"({top['calls']} calls, {top['total_ms']:.1f} ms)."
        )
    bound = [r for r in m["ncu_kernels"] if r.get("bound") in ("memory", "compute", "latency")]
    if bound:
        counts: dict[str, int] = {}
        for r in bound:
            counts[r["bound"]] = counts.get(r["bound"], 0) + 1
        out.append(
            "Nsight Compute on the targeted kernels: " + ", ".join(f"{n} {b}-bound" for b, n in counts.items()) + "."
        )
    return out


def report_md(m: Mapping[str, Any], files: Sequence[str]) -> str:
    model = m.get("model") or {}
    doc = Doc(f"Stage 2 report: {model.get('name', 'workload')} on {m['device'].get('name', 'GPU')}")
    tools = m.get("tools", {})
    doc.para(
        f"Run `{m['run_id']}` · mode {m['mode']} · {model.get('weights_detail', '')} · "
        f"nsys {tools.get('nsys', {}).get('version', 'n/a')}, ncu {tools.get('ncu', {}).get('version', 'not run')} · "
        f"driver {m['device'].get('driver')}."
    )
    doc.h2("At a glance")
    doc.bullets(findings(m))
    if m["warnings"]:
        doc.h2("Warnings")
        doc.bullets(m["warnings"])
    doc.h2("GPU time per stage (all timed passes)")
    doc.para(
        "Cross-check: the NVTX range wall time (CPU side), Stage 1's CUDA-event time of the same passes, the GPU "
        "busy time (union of the kernels launched inside the range) and the summed kernel time. Busy / wall "
        "under 100% means the GPU waited for the host. MBU on busy time divides Stage 1's analytic bytes by GPU "
        "busy time and the peak bandwidth. Tracing slows kernel launches, so wall times under nsys "
        "are longer than in a plain Stage 1 run: take latency from Stage 1, GPU work from here. "
        "MFU here divides the counted FLOPs by GPU busy time"
        + (
            f" and the {m['peak']['value'] / 1e12:,.1f} TFLOP/s dense peak ({m['peak']['source']})."
            if m.get("peak")
            else "; no peak is known for this GPU."
        )
    )
    header, rows = _stage_table(m)
    doc.table(header, rows)
    doc.h2("Top kernels")
    doc.para(
        "Per stage with Nsight Compute's roofline figures, and the profiled kernels on the roofline chart: "
        "[kernels.md](kernels.md)."
    )
    doc.table(
        ["#", "kernel", "calls", "total ms", "% of timed-pass kernel time"],
        [
            [str(i), _label(k), str(k["calls"]), ms(k["total_ms"], 2), pct(k["share"])]
            for i, k in enumerate(m["top_kernels"][:10], 1)
        ],
    )
    doc.h2("Tools")
    runs = m.get("tool_runs", {})
    doc.bullets([f"{k}: {v['seconds']:.1f} s (exit {v['returncode']})" for k, v in runs.items() if v.get("seconds")])
    doc.para("Commands: `nsys/cmd.txt` and `ncu/<stage>/cmd.txt`; raw reports and exports under `nsys/` and `ncu/`.")
    doc.h2("Files")
    doc.bullets([f"[{f}]({f})" for f in sorted(set(files)) if f.endswith((".md", ".json", ".yaml", ".txt", ".png"))])
    return doc.text()


def stakeholder_md(m: Mapping[str, Any]) -> str:
    model = m.get("model") or {}
    doc = Doc(f"Stakeholder summary (Stage 2): {model.get('name', 'workload')} on {m['device'].get('name', 'GPU')}")
    doc.h2("Executive summary")
    doc.bullets(findings(m))
    doc.h2("Where GPU time goes")
    header, rows = _stage_table(m)
    doc.table(header, rows)
    doc.h2("Recommendations")
    recs = []
    dec = m.get("decode_steps")
    if dec and dec["gpu_busy_fraction"] < LOW_BUSY:
        recs.append(
            f"Batch-1 decode keeps the GPU busy only {dec['gpu_busy_fraction']:.0%} of the time with "
            f"{dec['kernels_per_step']:.0f} launches per step: capture the decode step in a CUDA graph "
            "(static KV cache) or compile it, and batch pages."
        )
    mem = [r for r in m["ncu_kernels"] if r.get("bound") == "memory"]
    if mem:
        recs.append(
            f"{len(mem)} targeted kernel(s) are memory-bound (e.g. `{mem[0]['name']}`): fusion and fewer "
            "intermediate tensors pay off there."
        )
    if not recs:
        recs.append("No single bottleneck stands out; compare modes or GPUs with Stage 1.")
    doc.bullets(recs)
    if m["warnings"]:
        doc.h2("Caveats")
        doc.bullets(m["warnings"])
    return doc.text()

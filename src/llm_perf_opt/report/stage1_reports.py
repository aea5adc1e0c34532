"""Stage 1's Markdown files: report.md, operators.md, stakeholder_summary.md, assumptions.md, predictions."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.data.prompts import read_prompt
from llm_perf_opt.measure.throughput import host_around
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.advice import Advice
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.folders import REPORT_FILE, STAKEHOLDER_FILE, STATUS_FILE
from llm_perf_opt.records.stage1 import (
    FLOP_SOURCE,
    CompileSummary,
    HostUsage,
    ImageRecord,
    InputsManifest,
    OperatorRow,
    OperatorTable,
    OutputCheck,
    OutputSettings,
    Prediction,
    ProfilerSettings,
    Stage1Metrics,
    StageEfficiency,
    StageStat,
)
from llm_perf_opt.records.whatif import WhatIfRecord
from llm_perf_opt.report import batches, gallery, pages
from llm_perf_opt.report.markdown import (
    Doc,
    bundled_samples,
    clip,
    flops,
    link,
    ms,
    num_bytes,
    number,
    pct,
    present,
    present_links,
    time_budget_text,
    write_markdown,
)
from llm_perf_opt.report.memory_energy import energy_section, memory_section
from llm_perf_opt.report.modules_report import launched_by, modules_md, modules_plot, modules_section
from llm_perf_opt.report.plots import records_by_image, write_stage1_plots
from llm_perf_opt.report.recommendations import key_findings, what_to_try

_LABELS = {
    vocab.PREPROCESS: "preprocess",
    vocab.PREFILL: "prefill (vision included)",
    vocab.TTFT: "time to first token",
    vocab.DECODE: "decode (all steps)",
    vocab.DECODE_STEP: "decode, per step",
    vocab.E2E: "end to end",
}


def stage_label(stage: str, vision: bool = True) -> str:
    """Report label of a stage; nested stages are marked with ↳. `vision`: the model has vision sub-stages."""
    if stage == vocab.PREFILL and not vision:
        return "prefill"
    if vocab.is_vision(stage):
        return f"↳ {stage}"
    if stage == vocab.DECODE_STEP:
        return "↳ decode/step"
    return _LABELS.get(stage, stage)


PROMPT_EXCERPT = 400  # characters of a text prompt shown in the predictions gallery


def _has_vision(stats: Sequence[StageStat]) -> bool:
    return any(vocab.is_vision(s.stage) for s in stats)


def _is_text(m: Stage1Metrics) -> bool:
    """True when the inputs are text prompts (a text-only model): no images, tiles or vision stages."""
    return m.settings.input_kind == "text"


def _interval(s: Summary) -> str:
    """The 95% interval, or n/a with the range when there are fewer than 3 values."""
    if s.ci95_low is None or s.ci95_high is None:
        return f"n/a (n < 3; range {ms(s.min)} – {ms(s.max)})"
    return f"{ms(s.ci95_low)} – {ms(s.ci95_high)}"


def _stat_row(stage: str, s: Summary, vision: bool, e2e_mean: float | None) -> dict[str, str]:
    derived = stage in (vocab.TTFT, vocab.E2E, vocab.DECODE_STEP)
    return {
        "stage": stage_label(stage, vision),
        "n": str(s.n),
        "mean": ms(s.mean),
        "p50": ms(s.p50),
        "p90": ms(s.p90),
        "min": ms(s.min),
        "max": ms(s.max),
        "std": ms(s.std),
        "CV (images mixed)": pct(s.cv),
        "95% interval": _interval(s),
        "share of e2e (mean)": pct(s.mean / e2e_mean) if e2e_mean and not derived else "",
    }


def _within_image_text(m: Stage1Metrics) -> str:
    """The median CV over one input's passes, per top-level stage (or why there is none)."""
    judged = [
        v for v in m.variation if v.within_image_cv_median is not None and v.stage in (*vocab.TOP_LEVEL, vocab.E2E)
    ]
    if not judged:
        return "it needs at least 3 passes of one input."
    figures = ", ".join(
        f"{v.stage} {pct(v.within_image_cv_median)}" + (f" ({v.noise_side})" if v.noise_side else "") for v in judged
    )
    sides = (
        "; in brackets the side the noise comes from, by how busy the profiled pass kept the GPU over the stage's "
        "timed median"
    )
    return f"{figures} (median CV over one input's passes{sides if any(v.noise_side for v in judged) else ''})."


def _mfu_rows(m: Stage1Metrics) -> list[list[str]]:
    vision = _has_vision(m.stages)
    return [
        [
            stage_label(r.stage, vision),
            flops(r.flops_total),
            ms(r.time_total_ms),
            f"{r.achieved_tflops:,.2f}",
            f"{r.peak.value / 1e12:,.1f}" if r.peak else "n/a",
            pct(r.mfu, 2),
        ]
        for r in m.mfu
    ]


def _has_device_times(sort_key: str) -> bool:
    """A GPU run ranks operators by device time; a CPU run has no device columns worth showing."""
    return sort_key == "self_device_ms"


def _operator_header(sort_key: str) -> list[str]:
    device = ["self device ms", "total device ms (incl.)"] if _has_device_times(sort_key) else []
    return ["#", "operator", "calls", *device, "self CPU ms", "total CPU ms (incl.)", "share of self time"]


def _operator_rows(rows: Sequence[OperatorRow], sort_key: str, limit: int) -> list[list[str]]:
    total = sum(getattr(r, sort_key) for r in rows) or 1.0
    device = _has_device_times(sort_key)
    return [
        [
            str(i),
            f"`{r.name}`",
            str(r.calls),
            *([ms(r.self_device_ms, 3), ms(r.total_device_ms, 3)] if device else []),
            ms(r.self_cpu_ms, 3),
            ms(r.total_cpu_ms, 3),
            pct(getattr(r, sort_key) / total),
        ]
        for i, r in enumerate(rows[:limit], 1)
    ]


SHAPES_CHARS = 72  # one shape group's text in a table cell, truncated beyond
MIB = 1024**2


_DETAIL_COLUMNS = {
    "shapes": "input shapes (top groups by calls: calls, self ms)",
    "cpu_memory": "self CPU memory (MiB)",
    "device_memory": "self device memory (MiB)",
    "sites": "called from (innermost user frame first)",
}


def _detail_columns(rows: Sequence[OperatorRow], sort_key: str) -> list[str]:
    """The detail columns the profiled pass recorded (shapes, memory, call sites); none when it recorded none."""
    shown = {
        "shapes": any(r.shapes for r in rows),
        "cpu_memory": any(r.self_cpu_memory_bytes is not None for r in rows),
        "device_memory": _has_device_times(sort_key) and any(r.self_device_memory_bytes is not None for r in rows),
        "sites": any(r.call_sites for r in rows),
    }
    return [key for key, on in shown.items() if on]


def _mib(value: int | None) -> str:
    if value is None:
        return "n/a"
    mib = value / MIB
    return f"{mib if abs(mib) >= 0.005 else 0.0:,.2f}"  # never "-0.00"


def _detail_cell(r: OperatorRow, column: str, time_of: str) -> str:
    if column == "shapes":
        return "<br>".join(
            f"`{clip(g.shapes, SHAPES_CHARS)}`: {g.calls}, {ms(getattr(g, time_of), 3)}" for g in r.shapes
        )
    if column == "cpu_memory":
        return _mib(r.self_cpu_memory_bytes)
    if column == "device_memory":
        return _mib(r.self_device_memory_bytes)
    sites = [" ← ".join(f"`{f}`" for f in site.frames) + f" ({site.calls} calls)" for site in r.call_sites]
    others = r.call_site_count - len(r.call_sites)
    return "<br>".join(sites + ([f"+{others} other sites"] if others > 0 else []))


def _detail_rows(rows: Sequence[OperatorRow], sort_key: str, columns: Sequence[str], limit: int) -> list[list[str]]:
    time_of = "self_device_ms" if _has_device_times(sort_key) else "self_cpu_ms"
    return [
        [str(i), f"`{r.name}`", str(r.calls), *(_detail_cell(r, c, time_of) for c in columns)]
        for i, r in enumerate(rows[:limit], 1)
    ]


def _details_section(doc: Doc, operators: OperatorTable, top_k: int) -> None:
    """Shapes, memory and call sites per operator, when the profiled pass recorded any of them."""
    columns = _detail_columns(operators.overall, operators.sort_key)
    if not columns:
        return
    doc.h2(f"Shapes, memory and call sites (top {top_k})")
    doc.para(
        "What the profiler recorded per operator (pipeline.torch_profiler record_shapes / profile_memory / "
        "with_stack): the most frequent input-shape groups with their calls and self time (ms); the memory the "
        "operator itself allocated minus what it freed (MiB, child operators excluded; negative when it frees more); "
        "the most frequent call sites in the model's Python code (framework frames left out)."
    )
    doc.table(
        ["#", "operator", "calls", *(_DETAIL_COLUMNS[c] for c in columns)],
        _detail_rows(operators.overall, operators.sort_key, columns, top_k),
    )


def activity_text(m: Stage1Metrics) -> str | None:
    """Kernels per decode step and GPU-busy fraction from the profiled pass, or why they are absent."""
    act = m.profiler.activity if m.profiler else None
    if act is None:
        if m.device.type == "cpu":
            return "Kernels per decode step and GPU-busy fraction: n/a on CPU (no GPU kernels)."
        return None
    spread = f"{act.kernels_min}–{act.kernels_max}" if act.kernels_min != act.kernels_max else str(act.kernels_min)
    text = (
        f"GPU activity per decode step ({act.steps} steps profiled): {act.kernels_mean:,.1f} kernels ({spread}), "
        f"{ms(act.kernel_ms_mean, 3)} ms of kernel time, GPU busy {ms(act.busy_ms_mean, 3)} ms of "
        f"{ms(act.wall_ms_mean, 3)} ms = {pct(act.busy_fraction)} busy"
    )
    if act.prefill is not None:
        text += (
            f"; prefill: {act.prefill.kernels:,} kernels, {ms(act.prefill.kernel_ms, 2)} ms of kernel time, busy "
            f"{pct(act.prefill.busy_ms / act.prefill.wall_ms if act.prefill.wall_ms else None)} of "
            f"{ms(act.prefill.wall_ms, 2)} ms"
        )
    if act.unattributed_kernels:
        text += f"; {act.unattributed_kernels:,} kernels launched outside the prefill and the steps"
    return text + "."


def _measured_peaks_section(doc: Doc, r: _Report) -> None:
    """MFU and MBU against the achievable peaks measured on this GPU, beside the datasheet figures."""
    m, mp = r.m, r.m.measured_peaks
    if mp is None:
        return
    doc.h2("Against this GPU's measured peaks")
    peaks = [
        f"compute {mp.compute.value / 1e12:,.1f} TFLOP/s ({mp.compute.source})" if mp.compute else "compute: n/a",
        f"bandwidth {mp.bandwidth.value / 1e9:,.0f} GB/s ({mp.bandwidth.source})" if mp.bandwidth else "bandwidth: n/a",
    ]
    doc.para(
        "The datasheet peaks are rarely reachable; these denominators are what a large GEMM in the run's dtype and a "
        "large device-to-device copy achieve on this GPU: " + "; ".join(peaks) + "."
    )
    vision = _has_vision(m.stages)
    rows = []
    for stage in (x.stage for x in m.mfu):
        sheet, achievable = m.efficiency_of(stage), next((e for e in mp.efficiency if e.stage == stage), None)
        sheet_mfu, measured_mfu = m.mfu_of(stage), next((x for x in mp.mfu if x.stage == stage), None)
        rows.append(
            [
                stage_label(stage, vision),
                pct(sheet_mfu.mfu if sheet_mfu else None, 2),
                pct(measured_mfu.mfu if measured_mfu else None, 2),
                pct(sheet.mbu if sheet else None, 2),
                pct(achievable.mbu if achievable else None, 2),
            ]
        )
    doc.table(["stage", "MFU (datasheet)", "MFU (measured peak)", "MBU (datasheet)", "MBU (measured peak)"], rows)


def _runtime_section(doc: Doc, m: Stage1Metrics) -> None:
    """How the decoder ran: compilation cost, outputs against the eager reference, MoE experts hit per step."""
    checks = [(r.image, r.output_check) for r in m.records if r.output_check is not None]
    if m.compile is None and not checks and m.routing is None:
        return
    doc.h2("Runtime")
    lines = [f"Runtime: {batches.runtime_text(m)}."]
    if m.compile is not None:
        c = m.compile
        lines.append(
            f"Compilation: {len(c.events)} compiling call(s), {c.compile_ms / 1e3:,.1f} s of host time in all "
            f"({c.recompiles} recompile(s), {c.cudagraph_skips} CUDA-graph capture(s) skipped); "
            + _compile_placement(m.settings.warmup, c)
        )
    if checks:
        by_image: dict[str, list[OutputCheck]] = {}
        for image, check in checks:
            by_image.setdefault(image, []).append(check)
        for image, found in by_image.items():
            departures = [c.first_departure for c in found if c.first_departure is not None]
            worst = max(c.prefill_logits_max_abs_diff for c in found)
            agree = (
                f"tokens identical to the eager dynamic-cache reference for all {found[0].compared_tokens}"
                if not departures
                else f"tokens depart from the eager dynamic-cache reference at index {min(departures)}"
            )
            lines.append(f"Outputs of {image}: {agree}; prefill logits differ by at most {worst:.3g}.")
    if m.routing is not None:
        routing, o = m.routing, m.routing.overall
        lines.append(
            f"MoE routing over {routing.steps} decode steps: {o.mean:.1f} distinct experts per step and layer "
            f"(p50 {o.p50:.0f}, p90 {o.p90:.0f}) of {routing.experts}, top-{routing.top_k} with "
            f"{routing.tokens_per_step} token(s) per step; E·(1−(1−k/E)^B) expects {routing.expected_unique:.1f}."
        )
    doc.bullets(lines)


def _compile_placement(warmup: int, c: CompileSummary) -> str:
    """Whether the compilation fell in the warm-up passes or in the timed ones (as far as the record says)."""
    passes = f"{warmup} warm-up pass{'es' if warmup != 1 else ''} per input"
    timed = c.in_timed_passes
    if timed:
        seconds = sum(e.host_ms for e in timed) / 1e3
        return (
            f"{len(timed)} of the compiling calls ({seconds:,.1f} s) fell in the timed passes despite {passes}: "
            "those passes include compilation and are not steady state."
        )
    if warmup == 0:
        return "with no warm-up pass, the first timed pass of each input includes compilation."
    if timed is None:
        return f"the {passes} are meant to absorb it (this older record does not say whether any fell in timed passes)."
    return f"the {passes} absorbed it: none fell in the timed passes."


def _flops_source(m: Stage1Metrics) -> str:
    """How the run counted its FLOPs (as recorded; the current method for a run that recorded none)."""
    return next((r.flops_source for r in m.mfu), FLOP_SOURCE)


def _passes_text(m: Stage1Metrics) -> str:
    """Inputs × timed passes; for a run that stopped early, the passes measured against those asked for."""
    noun = "prompt" if _is_text(m) else "image"
    s = m.settings
    if s.partial and s.measured_passes is not None and s.asked_passes is not None:
        return (
            f"{len(m.images)} {noun}(s), {s.measured_passes} of {s.asked_passes} timed passes measured (stopped early)"
        )
    grouped = f" in batches of {batches.batch_run(m)}" if batches.batch_run(m) > 1 else ""
    return f"{len(m.images)} {noun}(s){grouped} × {s.repeats} timed pass(es)"


def _fates_section(doc: Doc, inputs: InputsManifest | None) -> None:
    """Every input file the selection considered and what became of it (when any was not run)."""
    if inputs is None or all(f.fate == "run" for f in inputs.fates):
        return
    doc.h2("Inputs considered")
    doc.para(
        f"{len(inputs.fates)} file(s) under `{bundled_samples(inputs.dataset_root)}`: "
        f"{sum(f.fate == 'run' for f in inputs.fates)} run. "
        "Not selected: left out by dataset.max_images or sampling; skipped: not usable (the reason is given)."
    )
    root = inputs.dataset_root.rstrip("/") + "/"
    doc.table(
        ["input", "fate", "reason"],
        [[f.path.removeprefix(root), f.fate, f.reason or ""] for f in inputs.fates],
    )


@attrs.frozen
class _Report:
    """What every section of report.md reads: the records, and the lookups built once before the sections run."""

    m: Stage1Metrics
    operators: OperatorTable | None
    files: Sequence[str]
    plots: Mapping[str, str]
    inputs: InputsManifest | None
    whatif: WhatIfRecord | None
    unfinished: str | None
    records_of: Mapping[str, Sequence[ImageRecord]]  # an input's timed passes, by its name
    advice: Sequence[Advice] = ()  # what to try, ranked (`measure.advice.advise`)

    def plot(self, doc: Doc, name: str, title: str) -> None:
        """The plot `name` as an image, when it was written."""
        if name in self.plots:
            doc.image(title, self.plots[name])


def _header_section(doc: Doc, r: _Report) -> None:
    """One line of what ran, and a warning when the folder does not say how the run ended."""
    m = r.m
    profile = m.settings.workload_profile
    doc.para(
        f"Run `{m.run_id}` · "
        + (f"workload {profile['name']} · " if profile else "")
        + f"{m.model.weights_detail} · {m.model.dtype} · {batches.runtime_text(m)} · "
        + _passes_text(m)
        + " · "
        f"{m.settings.max_new_tokens} new tokens per pass · times in ms ({m.device.timing_method})."
    )
    if (budget := time_budget_text(m.time_budget)) is not None:
        doc.para(budget)
    if r.unfinished:
        doc.para(f"**Not marked finished:** {r.unfinished}. The figures are those it wrote before.")


def _glance_section(doc: Doc, r: _Report) -> None:
    """The three things first: where the time goes and how efficient (findings), what to try, warnings."""
    doc.h2("At a glance")
    doc.bullets(key_findings(r.m))
    doc.h2("What to try")
    what_to_try(doc, r.m, r.advice, r.whatif)
    if r.m.warnings:
        doc.h2("Warnings")
        doc.bullets(r.m.warnings)


def _lead_plots_section(doc: Doc, r: _Report) -> None:
    per = "per prompt" if _is_text(r.m) else "per image"
    r.plot(doc, "stage_breakdown", f"Where the time goes, {per}")
    r.plot(doc, "roofline", "Stages on the roofline")


def _stage_times_section(doc: Doc, r: _Report) -> None:
    m = r.m
    doc.h2("Stage times over all timed passes (ms)")
    doc.para(
        ("Vision sub-stages (↳) run inside prefill and decode/step" if _has_vision(m.stages) else "Decode/step runs")
        + " inside decode: they are shown nested and never added again. Time to first token = preprocess + prefill. "
        "End to end = preprocess + prefill + decode."
    )
    methods = sorted({st.summary.ci_method for st in m.stages if st.summary.ci_method})
    e2e_mean = next((s.summary.mean for s in m.stages if s.stage == vocab.E2E), None)
    vision = _has_vision(m.stages)
    doc.keyed_table([_stat_row(st.stage, st.summary, vision, e2e_mean) for st in m.stages])
    doc.para(
        "n: timed passes (decode/step: one value per pass, its mean step time, so the interval is over passes). "
        f"95% interval: {'; '.join(methods) or 'none (fewer than 3 passes)'}; none from fewer than 3 values. "
        "CV over every pass of every input mixes different inputs; run-to-run noise is judged within one input: "
        + _within_image_text(m)
    )


def _per_image_row(
    image: str, stats: Sequence[StageStat], recs: Sequence[ImageRecord], image_cols: bool, first: ImageRecord | None
) -> dict[str, str]:
    """One input's medians by column; `recs`: its timed passes (tokens from the first, peak memory the highest);
    `first`: its first (warm-up) pass where the run kept one."""
    rec = recs[0]
    p50 = {s.stage: s.summary.p50 for s in stats}
    mem = max((r.peak_memory_bytes or 0) for r in recs)
    first_pass = {"first pass e2e": ms(first.e2e_ms)} if first is not None else {}
    return {
        "image" if image_cols else "prompt": image,
        **({"tiles": str(rec.tiles), "image tokens": str(rec.image_tokens)} if image_cols else {}),
        "prompt tokens": str(rec.prompt_tokens),
        "preprocess": ms(p50.get(vocab.PREPROCESS)),
        "prefill": ms(p50.get(vocab.PREFILL)),
        "TTFT": ms(p50.get(vocab.TTFT)),
        "decode": ms(p50.get(vocab.DECODE)),
        "ms/token": ms(p50.get(vocab.DECODE_STEP), 2),
        "e2e": ms(p50.get(vocab.E2E)),
        **first_pass,
        "peak GPU memory": num_bytes(mem) if mem else "n/a (CPU)",
    }


def _first_pass_text(m: Stage1Metrics) -> str | None:
    """What the first passes say: the most and least each input's first (warm-up) pass took above its timed
    median, and why that matters; None where the run kept none."""
    extra = m.first_pass_extras_ms()
    if not extra:
        return None
    compiled = " (and its compiling)" if m.compile is not None else ""
    text = (
        f"First pass e2e: each input's first warm-up pass, outside the figures above, at shapes this process had "
        f"not run yet{compiled}: {min(extra):+,.1f} to {max(extra):+,.1f} ms against the input's timed median."
    )
    if max(extra) <= 0:
        return text
    return text + (
        " Setup done once per new shape lands there, e.g. the plan cuDNN builds for each new sequence length where "
        "SDPA runs on cuDNN (one per eager decode step with a growing KV cache); a deployment pays it for each length "
        "it has not met yet, which the timed figures leave out. The largest of these is the first-pass extra that "
        "perf-whatif judges and perf-compare compares."
    )


def _per_image_section(doc: Doc, r: _Report) -> None:
    m = r.m
    image_cols = not _is_text(m)  # tiles and image tokens mean nothing for a text prompt
    doc.h2("Per image (medians, ms)" if image_cols else "Per prompt (medians, ms)")
    first = {f.image: f for f in m.first_passes}
    doc.keyed_table(
        [
            _per_image_row(image, stats, r.records_of[image], image_cols, first.get(image))
            for image, stats in m.per_image.items()
        ]
    )
    if (text := _first_pass_text(m)) is not None:
        doc.para(text)
    r.plot(doc, "decode_latency", "Decode step latency against context length")


def _runtime_and_batches_section(doc: Doc, r: _Report) -> None:
    _runtime_section(doc, r.m)
    r.plot(doc, "routing_hits", "Experts hit per MoE layer over the timed decode steps")
    batches.batches_section(doc, r.m)


def _throughput_section(doc: Doc, r: _Report) -> None:
    m = r.m
    noun = "prompts" if _is_text(m) else "pages"
    doc.h2("Throughput")
    t = m.throughput
    batch = "batch 1" if batches.batch_run(m) == 1 else f"per input, batch {batches.batch_run(m)}"
    lines = [f"Decode: {t.decode_tokens_per_s:,.1f} tokens/s (decode steps / decode time, {batch})"]
    if aggregate := batches.aggregate_line(m):
        lines.append(aggregate)
    if m.host_peak_rss_bytes:
        rss = num_bytes(m.host_peak_rss_bytes)
        lines.append(f"Host peak memory: {rss} (the process's peak resident set, whole run)")
    if m.host_usage and m.host_usage.passes:
        lines.append(host_usage_line(m.host_usage))
    if h := host_around(m):
        lines.append(pages.host_around_line(h, noun, m.device.type == "cuda", m.settings.pinned))
    if m.pages is None:  # a folder written before schema 1.4
        legacy = f"End to end: {t.e2e_images_per_s:,.3f} {noun}/s, {t.e2e_tokens_per_s:,.1f} new tokens/s (medians)"
        doc.bullets([*lines, legacy])
        return
    doc.bullets([*pages.throughput_lines(m.pages, noun), *lines])
    pages.parts_table(doc, m.pages, noun)


def host_usage_line(u: HostUsage) -> str:
    """The host's usage over the timed passes, per pass, in one line."""
    cpu = u.user_cpu_s + u.system_cpu_s
    own = u.pass_thread_cpu_s
    thread = "" if own is None else f", {u.per_pass(own):.2f} s of it the passes' thread"
    return (
        f"Host over the {u.passes} timed pass{'es' * (u.passes != 1)}, per pass: {u.per_pass(cpu):.2f} s of CPU "
        f"(user {u.per_pass(u.user_cpu_s):.2f}, system {u.per_pass(u.system_cpu_s):.2f} s{thread}) in "
        f"{u.per_pass(u.wall_s):.2f} s of wall time, {u.per_pass(u.minor_faults):,.0f} minor and "
        f"{u.per_pass(u.major_faults):,.0f} major page faults, {u.per_pass(u.involuntary_switches):,.0f} involuntary "
        f"and {u.per_pass(u.voluntary_switches):,.0f} voluntary context switches (getrusage: this process and its "
        "threads, time.thread_time; more involuntary switches or system time at the same kernels means a busier "
        "host, more CPU in the passes' thread for the same work a slower CPU)"
    )


def _mfu_section(doc: Doc, r: _Report) -> None:
    m = r.m
    doc.h2("Model FLOPs utilisation (MFU)")
    peak = m.compute_peak
    denominator = (
        f"Denominator: {peak.value / 1e12:,.1f} TFLOP/s dense {peak.dtype_key} peak of {peak.device_name} — "
        f"{peak.source}."
        if peak
        else "Denominator: none known for this device and dtype, so MFU is n/a; set `hardware.peak_tflops=<dense "
        "TFLOP/s>` to supply one."
    )
    doc.para(
        "MFU = FLOPs over all timed passes / (their measured time × dense peak FLOP/s). "
        f"FLOPs: {_flops_source(m)}. {denominator}" + batches.efficiency_note(m)
    )
    doc.table(
        ["stage", "FLOPs (all passes)", "time (all passes, ms)", "achieved TFLOP/s", "peak TFLOP/s", "MFU"],
        _mfu_rows(m),
    )


def _sol_row(e: StageEfficiency, vision: bool) -> dict[str, str]:
    return {
        "stage": stage_label(e.stage, vision),
        "time (all passes, ms)": ms(e.time_ms),
        "FLOPs": flops(e.flops),
        "bytes": num_bytes(e.bytes),
        "FLOP/byte": number(e.arithmetic_intensity),
        "ridge": number(e.ridge_point, 0),
        "bound": e.bound or "n/a",
        "MFU": pct(e.mfu, 2),
        "MBU": pct(e.mbu, 2),
        "speed of light (ms)": ms(e.speed_of_light_ms, 2),
        "measured / SoL": f"{e.gap:,.1f}×" if e.gap is not None else "n/a",
    }


def _speed_of_light_section(doc: Doc, r: _Report) -> None:
    m = r.m
    if not m.efficiency:
        return
    doc.h2("Speed of light per stage")
    bw = m.bandwidth_peak
    doc.para(
        "FLOPs as counted above; bytes from the analytic model (weights read + activations + KV cache). "
        "MBU = bytes / (time × peak bandwidth"
        + (f" {bw.value / 1e9:,.0f} GB/s, {bw.source})" if bw else "; none known: set hardware.peak_bandwidth_gbps)")
        + ". A stage whose FLOP/byte is above the ridge point is compute-bound. Speed of light = max(FLOPs / "
        "peak FLOP/s, bytes / peak bandwidth); the gap is measured time / speed of light."
    )
    vision = _has_vision(m.stages)
    doc.keyed_table([_sol_row(e, vision) for e in m.efficiency])


def _memory_and_energy_sections(doc: Doc, r: _Report) -> None:
    memory_section(doc, r.m.memory, r.plots.get("memory_timeline"))
    energy_section(doc, r.m.energy)


def _top_operators_section(doc: Doc, r: _Report) -> None:
    m, operators = r.m, r.operators
    if operators is None:
        return
    doc.h2("Top operators of the profiled pass")
    doc.para(
        f"One untimed pass under torch.profiler: prefill + {operators.decode_steps} decode steps, "
        f"{operators.events:,} events, sorted by {operators.sort_key.replace('_', ' ')}. "
        + _bound_sentence(operators)
        + "Full tables per stage: [operators.md](operators.md)."
    )
    doc.table(_operator_header(operators.sort_key), _operator_rows(operators.overall, operators.sort_key, 10))
    if (activity := activity_text(m)) is not None:
        act = m.profiler.activity if m.profiler else None
        doc.para(activity + (f" Method: {act.method}" if act else ""))
    r.plot(doc, "operator_shares", "Operator time shares")


def _modules_section(doc: Doc, r: _Report) -> None:
    if r.m.modules is not None:
        modules_section(doc, r.m.modules, r.plots.get("modules"))


def _modules_plot(m: Stage1Metrics, path: Path) -> Path | None:
    return modules_plot(m.modules, path) if m.modules is not None else None


def _files_section(doc: Doc, r: _Report) -> None:
    _fates_section(doc, r.inputs)
    doc.h2("Files")
    doc.bullets([link(f, f) for f in sorted(set(r.files)) if not f.startswith(".")])  # those that are there


# report.md, in order: each section reads the records (and the lookups `_Report` builds once) and adds its Markdown.
REPORT_SECTIONS: tuple[Callable[[Doc, _Report], None], ...] = (
    _header_section,
    _glance_section,
    _lead_plots_section,
    _stage_times_section,
    _per_image_section,
    _runtime_and_batches_section,
    _throughput_section,
    _mfu_section,
    _speed_of_light_section,
    _measured_peaks_section,
    _modules_section,
    _memory_and_energy_sections,
    _top_operators_section,
    _files_section,
)


def report_md(
    m: Stage1Metrics,
    operators: OperatorTable | None,
    files: Sequence[str],
    plots: Mapping[str, str] | None = None,
    inputs: InputsManifest | None = None,
    whatif: WhatIfRecord | None = None,
    unfinished: str | None = None,
    advice: Sequence[Advice] = (),
) -> str:
    """The main report, one function per section (`REPORT_SECTIONS`). `unfinished`: why the folder's status does
    not say how the run ended (it still reads `running`); `advice`: what to try, ranked (`measure.advice.advise`)."""
    report = _Report(m, operators, files, plots or {}, inputs, whatif, unfinished, records_by_image(m), advice)
    doc = Doc(f"Stage 1 report: {m.model.name} on {m.device.name}")
    for section in REPORT_SECTIONS:
        section(doc, report)
    return doc.text()


def _bound_sentence(operators: OperatorTable) -> str:
    """The profiled pass's bound at a large batch as a sentence (with a trailing space), or nothing."""
    bound = operators.bound_text()
    return "" if bound is None else bound[0].upper() + bound[1:] + ". "


def operators_md(m: Stage1Metrics, operators: OperatorTable, top_k: int) -> str:
    doc = Doc(f"Operators: {m.model.name} on {m.device.name}")
    inputs = "one image" if operators.inputs == 1 else f"a batch of {operators.inputs} inputs"
    parse_s = operators.torch_parse_s
    parse = "" if parse_s is None else f", of which torch's own parsing of its events {parse_s:.2f} s"
    doc.para(
        f"Profiled pass (untimed, separate from the timed passes): prefill + {operators.decode_steps} decode steps "
        f"of {inputs}; {operators.events:,} profiler events; post-processing {operators.postprocess_s:.2f} s{parse}. "
        + _bound_sentence(operators)
        + f"Sorted by {operators.sort_key.replace('_', ' ')}. Self times exclude child operators and add up to the "
        "total; inclusive (incl.) times contain their children and must not be summed."
    )
    if operators.trace_path:
        trace = Path(operators.trace_path)
        doc.para(
            f"Chrome/Perfetto trace: [{trace.parent.name}/{trace.name}]({trace.parent.name}/{trace.name}) in this run "
            "folder (open it in https://ui.perfetto.dev)."
        )
    doc.h2(f"All stages (top {top_k})")
    doc.table(_operator_header(operators.sort_key), _operator_rows(operators.overall, operators.sort_key, top_k))
    _details_section(doc, operators, top_k)
    if operators.kernels:
        _kernels_section(doc, operators, top_k)
    for stage, rows in operators.by_stage.items():
        doc.h2(f"Stage {stage} (top {min(top_k, 10)})")
        doc.table(_operator_header(operators.sort_key), _operator_rows(rows, operators.sort_key, min(top_k, 10)))
    return doc.text()


def _kernels_section(doc: Doc, operators: OperatorTable, top_k: int) -> None:
    """operators.md's kernel table, each kernel with the operators and modules that launched it."""
    doc.h2(f"GPU kernels (top {top_k}, by device time)")
    times = operators.modules
    known = times is not None and bool(times.kernel_sources)
    doc.para(
        "Kernels by short name (template arguments and parameters dropped), summed over their launches. "
        + (
            "Launched by: the operators around each kernel's launch and the modules (folded across layers) whose "
            "forward ran them, with their share of the kernel's time in the profiled pass's stages."
            if known
            else "Launched by: not recorded (the profiled pass ran without module attribution, "
            "`pipeline.torch_profiler.modules=false`, or wrote its record before it kept kernel sources)."
        )
    )
    total = sum(k.self_device_ms for k in operators.kernels) or 1.0
    header = ["#", "kernel", "launches", "device ms", "share of kernel time"]
    rows = []
    for i, k in enumerate(operators.kernels[:top_k], 1):
        row = [str(i), f"`{k.name}`", str(k.calls), ms(k.self_device_ms, 3), pct(k.self_device_ms / total)]
        if times is not None and known:
            row.append(launched_by(times.sources_of_kernel(k.name)))
        rows.append(row)
    doc.table(header + (["launched by (operator in module, share)"] if known else []), rows)


def _cost_centre_rows(stats: Sequence[StageStat]) -> list[list[str]]:
    """Top-level stages by mean time with their share of the mean end-to-end time, each followed by its nested
    stages with their share of it (means add up pass by pass; medians do not)."""
    mean = {s.stage: s.summary.mean for s in stats}
    e2e = mean.get(vocab.E2E)
    vision = _has_vision(stats)
    rows = []
    for top in sorted((s for s in stats if s.stage in vocab.TOP_LEVEL), key=lambda s: -s.summary.mean):
        rows.append(
            [stage_label(top.stage, vision), ms(top.summary.mean), pct(top.summary.mean / e2e) if e2e else "n/a"]
        )
        inner = [s for s in stats if s.nested_in == top.stage and s.stage != vocab.DECODE_STEP]
        for s in sorted(inner, key=lambda s: -s.summary.mean):
            share = pct(s.summary.mean / top.summary.mean) if top.summary.mean else "n/a"
            rows.append([stage_label(s.stage, vision), ms(s.summary.mean), f"{share} of {top.stage}"])
    return rows


def stakeholder_md(m: Stage1Metrics, whatif: WhatIfRecord | None = None, advice: Sequence[Advice] = ()) -> str:
    doc = Doc(f"Stakeholder summary: {m.model.name} inference on {m.device.name}")
    doc.para(
        f"{m.model.weights_detail}. Batch size {batches.batch_size_text(m)}, {m.settings.max_new_tokens} new tokens "
        "per image."
        + (f" {aggregate}." if (aggregate := batches.aggregate_line(m)) else "")
        + (f" Throughput: {pages.headline(m.pages, 'prompts' if _is_text(m) else 'pages')}." if m.pages else "")
    )
    doc.h2("Key findings")
    doc.bullets(key_findings(m))
    doc.h2("Top cost centres (share of the mean end-to-end time)")
    doc.para(
        "Top-level stages add up to the end-to-end time; nested stages (↳) are shares of the stage that contains them."
    )
    doc.table(["stage", "mean ms", "share"], _cost_centre_rows(m.stages))
    doc.h2("What to try")
    what_to_try(doc, m, advice, whatif)
    if m.warnings:
        doc.h2("Caveats")
        doc.bullets(m.warnings)
    return doc.text()


def assumptions_md(m: Stage1Metrics, inputs: InputsManifest) -> str:
    doc = Doc("Assumptions and settings")
    s = m.settings
    prof = s.profiler or ProfilerSettings()
    doc.h2("Device")
    doc.bullets(
        [
            f"Device: {m.device.name} ({m.device.type}{'' if m.device.index is None else ':' + str(m.device.index)})",
            f"Timing: {m.device.timing_method}; warm-up passes excluded; a separate FLOP-counting pass per image "
            + ("and per batch " if m.settings.batch_size > 1 else "")
            + "(untimed) runs first",
            f"Compute dtype: {m.model.dtype}",
        ]
    )
    doc.h2("Model and weights")
    doc.bullets(
        [
            f"Model: {m.model.name} ({m.model.class_name}, adapter {m.model.adapter}), "
            f"{m.model.parameters:,} parameters",
            f"Weights: {m.model.weights_detail}",
            f"Architecture from: {m.model.config_source}",
            *(
                ["Architecture: " + ", ".join(f"{k} {v}" for k, v in arch.items() if v not in (None, {}))]
                if (arch := m.model.architecture)
                else []
            ),
            f"Attention implementation: {m.model.attn_implementation}; MoE experts implementation: "
            f"{m.model.experts_implementation}",
            *([f"Weights quantized: {q.text}"] if (q := m.model.quantized) else []),
        ]
    )
    doc.h2("Run")
    profile = s.workload_profile
    doc.bullets(
        [
            f"Named workload: {profile['name']} — {profile['document']}" if profile else "Named workload: none",
            f"Batch size: {batches.batch_size_text(m)}",
            f"Runtime: {batches.runtime_text(m)} (runtime.kv_cache={s.runtime.kv_cache}, "
            f"runtime.compile={s.runtime.compile}, runtime.compile_mode={s.runtime.compile_mode}, "
            f"runtime.output_check={s.runtime.output_check})",
            f"Timed passes per image (run.repeats): {s.repeats} ({s.sources['run.repeats']})",
            f"Warm-up passes per image (run.warmup): {s.warmup} ({s.sources['run.warmup']})",
            f"Decoding: {s.decoding}; {s.max_new_tokens} new tokens ({s.sources['infer.max_new_tokens']})",
            *([f"CPU affinity (run.cpu_affinity): {s.cpu_affinity}"] if s.cpu_affinity else []),
        ]
    )
    doc.h2("Preprocessing")
    doc.bullets([f"{k}: {v}" for k, v in m.model.preprocess.items()])
    doc.h2("Profiling")
    doc.bullets(
        [
            f"Torch profiler: {'on' if prof.enable else 'off'}; decode steps profiled: {prof.decode_steps}; "
            f"record_shapes={prof.record_shapes}, profile_memory={prof.profile_memory}, with_stack={prof.with_stack}, "
            f"with_flops={prof.with_flops}, chrome_trace={prof.chrome_trace}"
            + (", modules=True" if prof.modules else "")
            + (f", max_vision_inputs={prof.max_vision_inputs}" if prof.max_vision_inputs else ""),
            "NVTX ranges (domain llm_perf_opt): preprocess, prefill, "
            + "".join(f"{st.stage}, " for st in m.stages if vocab.is_vision(st.stage))
            + "decode, decode/step",
            f"FLOPs: {_flops_source(m)}",
        ]
    )
    doc.h2("Dataset selection")
    doc.bullets(
        [
            f"Root: {bundled_samples(inputs.dataset_root)}",
            f"Subset list: {bundled_samples(inputs.subset_filelist or 'none')}",
            f"Discovered {inputs.discovered} {'prompt' if _is_text(m) else 'image'} file(s); ran "
            f"{len(inputs.images)}; skipped {len(inputs.skipped)}; sampling {inputs.sampling} (seed "
            f"{inputs.seed}); max_images {inputs.max_images or 'all'} ({s.sources['dataset.max_images']})",
            *([f"Inputs chosen automatically: {s.inputs_note}"] if s.inputs_note else []),
        ]
    )
    return doc.text()


def write_gallery(
    art: ArtifactsManager,
    m: Stage1Metrics,
    predictions: Sequence[Prediction],
    outputs: OutputSettings,
) -> None:
    """`viz/predictions.md`: per input its thumbnail (grounding boxes drawn) or prompt excerpt, timings, output."""
    if not outputs.visualization.enable:
        return
    knobs = outputs.extra.deepseek_ocr
    viz_dir = art.resolve_save_dir(outputs.visualization.save_dir)
    viz_dir.mkdir(parents=True, exist_ok=True)
    doc = Doc("Predictions gallery")
    doc.para(f"{m.model.weights_detail}. Per-image medians in ms.")
    shown = predictions[: knobs.max_images]
    if len(predictions) > len(shown):
        doc.para(
            f"The first {len(shown)} of {len(predictions)} inputs (pipeline.torch_profiler.output.extra.deepseek_ocr."
            "visualization.max_images); every output is in predictions/predictions.jsonl."
        )
    records_of = records_by_image(m)
    for pred in shown:
        name = pred.image
        doc.h2(name)
        recs = records_of.get(name, [])
        if m.settings.input_kind == "text":  # a prompt file: show its start, no thumbnail
            prompt = read_prompt(Path(pred.path))
            excerpt = prompt[:PROMPT_EXCERPT] + (" …" if len(prompt) > PROMPT_EXCERPT else "")
            doc.raw("\n**Prompt**\n\n```text\n" + excerpt + "\n```\n\n**Output**\n")
            size = [f"{recs[0].prompt_tokens} prompt tokens"] if recs else []
            facts: list[str] = []
        else:
            stem = Path(name).with_suffix("").as_posix().replace("/", "__")  # a/page.png and b/page.png differ
            size = [f"{recs[0].tiles} tiles, {recs[0].image_tokens} image tokens"] if recs else []
            facts = []
            if Path(pred.path).is_file():
                thumb = gallery.thumbnail_with_boxes(
                    Path(pred.path), pred.text, viz_dir / f"{stem}.png", width=knobs.thumbnail_width
                )
                art.note_file(thumb)
                doc.image(name, os.path.relpath(thumb, viz_dir))
                facts.append(f"Boxes drawn: {gallery.count_boxes(pred.text)}")
            else:  # a folder read on another machine than the run's
                facts.append(f"No thumbnail: the input is not at {bundled_samples(pred.path)} on this machine")
        timing = (
            f"TTFT {ms(statistics.median(r.ttft_ms for r in recs))} ms, decode "
            f"{ms(statistics.median(r.decode_ms for r in recs))} ms"
            if recs
            else "no timed pass of this input in the record"
        )
        doc.bullets([", ".join([timing, f"{pred.tokens} tokens", *size]), *facts])
        body = pred.text if pred.text is not None else f"(no tokenizer: token ids) {list(pred.token_ids)[:64]}"
        doc.raw("\n```text\n" + body + "\n```\n")
    art.write_anywhere(viz_dir / "predictions.md", present_links(doc.text(), viz_dir, "predictions.md"))


def write_all(
    art: ArtifactsManager,
    m: Stage1Metrics,
    *,
    inputs: InputsManifest,
    operators: OperatorTable | None,
    predictions: Sequence[Prediction],
    advice: Sequence[Advice],
    whatif: WhatIfRecord | None = None,
    unfinished: str | None = None,
    images: bool = True,
) -> None:
    """Every Stage 1 Markdown artifact and plot (`write_details`), then report.md (`write_report`), which lists the
    others that are there."""
    plots = write_details(
        art, m, inputs=inputs, operators=operators, predictions=predictions, advice=advice, whatif=whatif, images=images
    )
    write_report(art, m, plots, inputs=inputs, operators=operators, advice=advice, whatif=whatif, unfinished=unfinished)


def write_details(
    art: ArtifactsManager,
    m: Stage1Metrics,
    *,
    inputs: InputsManifest,
    operators: OperatorTable | None,
    predictions: Sequence[Prediction],
    advice: Sequence[Advice],
    whatif: WhatIfRecord | None = None,
    images: bool = True,
) -> dict[str, str]:
    """Every Stage 1 artifact but report.md (`write_report`, after the run's time budget is known); returns the
    plots written (name -> path in the folder); `images`: False for no plots and no predictions gallery."""
    top_k = m.settings.profiler.top_k if m.settings.profiler else 0
    if operators is not None:
        write_markdown(art, "operators.md", operators_md(m, operators, top_k))
    write_markdown(art, STAKEHOLDER_FILE, stakeholder_md(m, whatif, advice))
    write_markdown(art, "assumptions.md", assumptions_md(m, inputs))
    if images:
        write_gallery(art, m, predictions, m.settings.outputs)
    if m.modules is not None:
        write_markdown(art, "modules.md", modules_md(m.modules, f"{m.model.name} on {m.device.name}"))
    written = write_stage1_plots(m, art.run_dir, {"modules": _modules_plot}) if images else {}
    for path in written.values():
        art.record(str(path.relative_to(art.run_dir)))
    return {name: str(path.relative_to(art.run_dir)) for name, path in written.items()}


def write_report(
    art: ArtifactsManager,
    m: Stage1Metrics,
    plots: Mapping[str, str],
    *,
    inputs: InputsManifest,
    operators: OperatorTable | None,
    advice: Sequence[Advice],
    whatif: WhatIfRecord | None = None,
    unfinished: str | None = None,
) -> None:
    """report.md, listing the files written before it (`write_details`)."""
    files = [*present(art.run_dir, [*art.written, STATUS_FILE]), REPORT_FILE]
    write_markdown(art, REPORT_FILE, report_md(m, operators, files, plots, inputs, whatif, unfinished, advice))

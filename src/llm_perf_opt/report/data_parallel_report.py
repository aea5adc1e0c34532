"""A data-parallel run rendered (`data_parallel.md`): each process's pages/s, the combined pages/s over the window
in which all of them were timing, pages per day and the scaling efficiency; and the scaling table of several such
runs (`scaling_table`, printed by `stage1-run run.data_parallel=N` and `bench/data_parallel.sh`)."""

from __future__ import annotations

from collections.abc import Sequence

from llm_perf_opt.records.data_parallel import DataParallelSummary, ShardFigures
from llm_perf_opt.report.markdown import Doc, link, number, pct
from llm_perf_opt.report.pages import per_day

HOW = (
    "Every process timed its own pages on its own device; each timed pass was recorded on the wall clock. The "
    "**window** runs from the latest first-pass start to the earliest last-pass end: the time in which every "
    "process was timing. A process's pages in the window are its passes' pages, a pass cut by an edge of the window "
    "counted by its share inside; its pages/s in the window is that over the window's length, and the **combined "
    "pages/s** is the sum over the processes. **Scaling efficiency** = combined pages/s ÷ (processes × the "
    "single-GPU pages/s of the same workload, measured the same way: its pages over the span of its timed passes)."
)


def _offset(value: float | None, origin: float | None) -> str:
    return "n/a" if value is None or origin is None else f"{value - origin:,.1f}"


def _shard_row(f: ShardFigures, origin: float | None) -> list[object]:
    report = f"{f.folder}/report.md"
    return [
        f.shard, f.device or "n/a", f.host or "n/a", f.status,
        f"{_offset(f.timed_from_s, origin)} – {_offset(f.timed_to_s, origin)}", f.passes,
        number(f.pages_per_s_alone, 2), number(f.window_pages, 1), number(f.window_pages_per_s, 2),
        link("report", report) if f.ok else f.skipped_reason or "",
    ]  # fmt: skip


def data_parallel_markdown(summary: DataParallelSummary) -> str:
    """`data_parallel.md` of one data-parallel run."""
    doc = Doc(f"Data parallel: {summary.processes} processes")
    doc.para(
        f"Folder `{summary.folder}`"
        + (f"; every process ran {summary.workload}" if summary.workload else "")
        + f". {len([f for f in summary.shards if f.ok])} of {summary.processes} processes timed their pages."
    )
    if any(f.replicated for f in summary.shards):
        doc.para(
            "The workload has fewer inputs than processes, so every process timed all of them (its own copies): "
            "the processes share no pages, and the combined figure is the rate of N such streams."
        )
    doc.h2("Combined")
    if summary.problem is not None or summary.combined_pages_per_s is None:
        doc.para(f"**No combined pages/s**: {summary.problem or 'the processes did not time at once'}.")
    else:
        combined = summary.combined_pages_per_s
        lines = [
            f"**{combined:,.2f} pages/s** from {summary.processes} processes together, over the "
            f"{summary.window_s:,.2f} s in which all of them were timing: {per_day(combined)} pages per day",
        ]
        if summary.single_gpu is not None and summary.scaling_efficiency is not None:
            single = summary.single_gpu
            lines.append(
                f"Scaling efficiency **{pct(summary.scaling_efficiency, 1)}**: {combined:,.2f} ÷ "
                f"({summary.processes} × {single.pages_per_s:,.2f} pages/s on one GPU; {single.source}); "
                f"{combined / single.pages_per_s:,.2f}× one GPU's pages/s"
            )
        else:
            lines.append(
                "Scaling efficiency: n/a (no single-GPU run of the same workload given: run.data_parallel_baseline="
                "<its folder or pages/s>)"
            )
        doc.bullets(lines)
    doc.h2("Processes")
    origin = min((f.timed_from_s for f in summary.shards if f.timed_from_s is not None), default=None)
    doc.table(
        ["shard", "device", "host", "status", "timed (s from the first start)", "passes", "pages/s alone (p50)",
         "pages in window", "pages/s in window", "report"],
        [_shard_row(f, origin) for f in summary.shards],
    )  # fmt: skip
    if summary.window_start_s is not None and origin is not None:
        doc.para(
            f"Window: {_offset(summary.window_start_s, origin)} – {_offset(summary.window_end_s, origin)} s. "
            "Pages/s alone: the median over a process's own passes (its report's figure), which leaves out the gaps "
            "between passes that the window counts."
        )
    doc.para(HOW)
    return doc.text()


def scaling_table(summaries: Sequence[DataParallelSummary]) -> str:
    """One Markdown table row per data-parallel run: processes, per-GPU pages/s, combined, per day, efficiency."""
    doc = Doc("Data-parallel scaling")
    rows = []
    for s in summaries:
        per_gpu = ", ".join(number(f.window_pages_per_s, 2) for f in s.shards) or "n/a"
        combined = s.combined_pages_per_s
        rows.append([
            s.processes, per_gpu, number(combined, 2), per_day(combined) if combined is not None else "n/a",
            number(s.single_gpu.pages_per_s if s.single_gpu else None, 2),
            pct(s.scaling_efficiency, 1),
            s.problem or "", s.folder,
        ])  # fmt: skip
    doc.table(
        ["processes", "per-GPU pages/s", "combined pages/s", "pages per day", "1-GPU pages/s", "efficiency",
         "problem", "folder"],
        rows,
    )  # fmt: skip
    return doc.text()

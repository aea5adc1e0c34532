"""The sweep summary rendered: `sweep_summary.md` (jobs and skipped jobs), `sweep_summary.png` (p50 bars) and, for a
sweep over run.batch_size, `throughput_latency.png` (per-input against aggregate decode tokens/s)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.records.sweep import SweepJob, SweepSummary
from llm_perf_opt.report.markdown import Doc, flops, link, ms, pct
from llm_perf_opt.report.plots import save_figure
from llm_perf_opt.report.pyplot import closes_its_figures, pyplot


def _rate(tflops: float | None) -> str:
    return "n/a" if tflops is None else f"{flops(tflops * 1e12)}/s"


def sweep_markdown(
    summary: SweepSummary, plot: str | None, curve_plot: str | None = None, data_parallel: str | None = None
) -> str:
    """The Markdown summary; `plot` and `curve_plot` are the plots' file names next to it (None: no plot);
    `data_parallel`: the data-parallel summary's file name beside it (a sweep over run.shard)."""
    keys = summary.swept_keys
    done, skipped = summary.summarised, summary.skipped
    doc = Doc("Sweep summary")
    doc.para(
        f"Sweep folder `{summary.sweep_dir}`: {len(summary.jobs)} job(s), {len(done)} summarised, "
        f"{len(skipped)} skipped. "
        f"Swept keys: {', '.join(f'`{k}`' for k in keys) or 'none (all jobs share their overrides)'}. "
        "Times are medians (p50) over the timed passes, in ms; MFU and MBU are n/a where the device peak is unknown."
    )
    if data_parallel is not None:
        doc.para(
            "The jobs are the processes of one data-parallel run (run.shard): each GPU's pages/s, their sum over the "
            "window in which all were timing, pages per day and the scaling efficiency are in "
            f"{link(data_parallel, data_parallel)}."
        )
    doc.h2("Jobs")
    header = [
        "job", *keys, "status", "e2e p50 (ms)", "prefill p50 (ms)", "decode p50 (ms/token)", "TTFT p50 (ms)",
        "prefill MFU", "prefill achieved", "decode MBU", "decode tokens/s", "report",
    ]  # fmt: skip
    rows = []
    for job, m in done:
        rows.append([
            job.num, *(job.value(k) for k in keys), job.status,
            ms(m.e2e_p50_ms), ms(m.prefill_p50_ms), ms(m.decode_ms_per_token_p50, 2), ms(m.ttft_p50_ms),
            pct(m.prefill_mfu, 2), _rate(m.prefill_achieved_tflops), pct(m.decode_mbu, 2),
            ms(m.decode_tokens_per_s), link("report", job.report) if job.report else "n/a",
        ])  # fmt: skip
    doc.table(header, rows)
    if plot is not None:
        doc.image("prefill and decode p50 per job", plot)
    _throughput_latency_section(doc, summary, curve_plot)
    doc.h2("Skipped jobs")
    doc.table(
        ["job", *keys, "status", "reason", "message"],
        [[j.num, *(j.value(k) for k in keys), j.status, j.skipped_reason, j.message or ""] for j in skipped],
    )
    return doc.text()


def _throughput_latency_section(doc: Doc, summary: SweepSummary, plot: str | None) -> None:
    """Per-input against aggregate decode tokens/s by batch size (a sweep over run.batch_size only)."""
    points = summary.throughput_latency
    if not points:
        return
    doc.h2("Throughput against latency (run.batch_size)")
    doc.para(
        "Per input: one input's decode tokens/s (tokens after the first over the batch's decode time): what each "
        "reader waits for. Aggregate: every input's decode tokens over the same time: what the GPU delivers. p50 over "
        "the full batches' passes; the speed-up is against the smallest batch size swept."
    )
    base = points[0].aggregate_decode_tokens_per_s
    doc.table(
        ["batch size", "job", "per-input decode tokens/s", "aggregate decode tokens/s", "decode p50 (ms/token)",
         "aggregate speed-up"],
        [
            [p.batch_size, p.job, ms(p.per_input_decode_tokens_per_s), ms(p.aggregate_decode_tokens_per_s),
             ms(p.decode_ms_per_token_p50, 2), f"{p.aggregate_decode_tokens_per_s / base:,.2f}×" if base else "n/a"]
            for p in points
        ],
    )  # fmt: skip
    if plot is not None:
        doc.image("per-input against aggregate decode tokens/s by batch size", plot)


@closes_its_figures
def throughput_latency_plot(summary: SweepSummary, target: Path) -> Path | None:
    """Per-input decode tokens/s against aggregate decode tokens/s, one point per batch size, joined in batch order;
    None when the sweep does not vary run.batch_size."""
    points = summary.throughput_latency
    if not points:
        return None
    xs = [p.aggregate_decode_tokens_per_s for p in points]
    ys = [p.per_input_decode_tokens_per_s for p in points]
    fig, ax = pyplot().subplots(figsize=(6.4, 4.6))
    ax.plot(xs, ys, "-o", color="#4e79a7")
    for p, x, y in zip(points, xs, ys, strict=True):
        ax.annotate(f"batch {p.batch_size}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9)
    ax.set_xlabel("aggregate decode tokens/s (whole batch)")
    ax.set_ylabel("per-input decode tokens/s")
    ax.set_title("Decode throughput against per-input speed, by batch size (p50)")
    ax.set_xlim(0, max(xs) * 1.25)
    ax.set_ylim(0, max(ys) * 1.25)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, target)


def _label(job: SweepJob, keys: Sequence[str]) -> str:
    if not keys:
        return f"job {job.num}"
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={job.value(k)}" for k in keys)


@closes_its_figures
def sweep_plot(summary: SweepSummary, target: Path) -> Path | None:
    """Grouped bars of prefill p50 and decode p50 (ms) per summarised job; None when there is nothing to draw."""
    done = summary.summarised
    if not done:
        return None
    series = (
        ("prefill p50", [m.prefill_p50_ms for _, m in done], "#f28e2b"),
        ("decode p50 (all tokens)", [m.decode_p50_ms for _, m in done], "#59a14f"),
    )
    keys = summary.swept_keys
    width = 0.38
    fig, ax = pyplot().subplots(figsize=(max(6.0, 1.3 * len(done) + 2.5), 4.6))
    for i, (name, values, colour) in enumerate(series):
        xs = [n + (i - 0.5) * width for n in range(len(done))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=name, color=colour)
        ax.bar_label(bars, labels=[ms(v) for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(done)))
    ax.set_xticklabels([_label(j, keys) for j, _ in done], rotation=20 if len(done) > 4 else 0, ha="center")
    ax.set_xlabel(", ".join(keys) if keys else "job")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title("Prefill and decode p50 latency per sweep job", pad=28)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, fontsize=9, frameon=False)
    fig.tight_layout()  # leaves a placeholder layout engine: `save_figure` saves without re-measuring
    return save_figure(fig, target)

"""The sweep summary rendered: `sweep_summary.md` (jobs and skipped jobs) and `sweep_summary.png` (p50 bars)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.records.sweep import SweepJob, SweepSummary
from llm_perf_opt.report.markdown import Doc, flops, ms, pct


def _rate(tflops: float | None) -> str:
    return "n/a" if tflops is None else f"{flops(tflops * 1e12)}/s"


def sweep_markdown(summary: SweepSummary, plot: str | None) -> str:
    """The Markdown summary; `plot` is the plot's file name next to it (None: no plot)."""
    keys = summary.swept_keys
    done, skipped = summary.summarised, summary.skipped
    doc = Doc("Sweep summary")
    doc.para(
        f"Sweep folder `{summary.sweep_dir}`: {len(summary.jobs)} job(s), {len(done)} summarised, "
        f"{len(skipped)} skipped. "
        f"Swept keys: {', '.join(f'`{k}`' for k in keys) or 'none (all jobs share their overrides)'}. "
        "Times are medians (p50) over the timed passes, in ms; MFU and MBU are n/a where the device peak is unknown."
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
            ms(m.decode_tokens_per_s), f"[report]({job.report})" if job.report else "n/a",
        ])  # fmt: skip
    doc.table(header, rows)
    if plot is not None:
        doc.image("prefill and decode p50 per job", plot)
    doc.h2("Skipped jobs")
    doc.table(
        ["job", *keys, "status", "reason", "message"],
        [[j.num, *(j.value(k) for k in keys), j.status, j.skipped_reason, j.message or ""] for j in skipped],
    )
    return doc.text()


def _label(job: SweepJob, keys: Sequence[str]) -> str:
    if not keys:
        return f"job {job.num}"
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={job.value(k)}" for k in keys)


def sweep_plot(summary: SweepSummary, target: Path) -> Path | None:
    """Grouped bars of prefill p50 and decode p50 (ms) per summarised job; None when there is nothing to draw."""
    done = summary.summarised
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = (
        ("prefill p50", [m.prefill_p50_ms for _, m in done], "#f28e2b"),
        ("decode p50 (all tokens)", [m.decode_p50_ms for _, m in done], "#59a14f"),
    )
    keys = summary.swept_keys
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(done) + 2.5), 4.6))
    try:
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
        fig.tight_layout()
        fig.savefig(target, dpi=110)
    finally:
        plt.close(fig)
    return target

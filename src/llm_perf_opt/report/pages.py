"""Pages per second in report.md: the throughput, the per-page latency and the time per page beside its floor,
rendered from `Stage1Metrics.pages` (`measure.throughput`)."""

from __future__ import annotations

from llm_perf_opt.measure.throughput import HostAround
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.stage1 import PAGE_PREPROCESS, PAGE_VISION, PageThroughput
from llm_perf_opt.report.markdown import Doc, ms, pct

SECONDS_PER_DAY = 86_400


def interval_text(s: Summary, digits: int) -> str:
    """`; 95% interval a – b` where the summary has one (none from fewer than 3 passes)."""
    if s.ci95_low is None or s.ci95_high is None:
        return ""
    return f"; 95% interval {s.ci95_low:,.{digits}f} – {s.ci95_high:,.{digits}f}"


def _passes(p: PageThroughput) -> str:
    return f"{p.pages_per_s.n} {'batch ' if p.batch_size > 1 else ''}pass{'es' * (p.pages_per_s.n != 1)}"


def per_day(pages_per_s: float) -> str:
    """Pages per day at a rate, rounded for reading: `0.96 million`, `30,240`."""
    day = pages_per_s * SECONDS_PER_DAY
    return f"{day / 1e6:,.2f} million" if day >= 1e6 else f"{day:,.0f}"


def headline(p: PageThroughput, noun: str) -> str:
    """One sentence: pages/s at the run's batch with its interval, and per day."""
    rate = p.pages_per_s
    return (
        f"**{rate.p50:,.2f} {noun}/s** at batch {p.batch_size} (p50 over {_passes(p)}{interval_text(rate, 2)}), from "
        f"the first byte of preprocessing to the last token: {per_day(rate.p50)} {noun} per day on this device"
    )


def throughput_lines(p: PageThroughput, noun: str) -> list[str]:
    """The Throughput section's lines on pages: rate, tokens, latency and what bounds the rate."""
    lines = [
        headline(p, noun),
        f"New tokens: {p.tokens_per_s.p50:,.1f} tokens/s end to end (every {noun[:-1]}'s new tokens over its "
        f"pass's time; p50{interval_text(p.tokens_per_s, 1)})",
        f"Latency per {noun[:-1]}: first token p50 {ms(p.ttft_ms.p50)} ms, p90 {ms(p.ttft_ms.p90)} ms; last token "
        f"p50 {ms(p.ttlt_ms.p50)} ms, p90 {ms(p.ttlt_ms.p90)} ms"
        + (f" (every {noun[:-1]} of a batch pass gets its pass's times)" if p.batch_size > 1 else ""),
    ]
    return [*lines, *(line for line in (prefetched_line(p), bound_line(p, noun)) if line)]


def prefetched_line(p: PageThroughput) -> str | None:
    """Whether the passes' page files were decoded ahead (`runtime.prefetch_pages`), and in how many of them."""
    if not p.prefetched:
        return None
    passes = p.pages_per_s.n
    some = "" if p.prefetched >= passes else f" ({p.prefetched} of the {passes} passes; the others decoded their own)"
    return (
        "Page files decoded ahead while the previous pass ran (runtime.prefetch_pages): the time per page leaves "
        f"their decoding out, as in a steady stream of batches{some}"
    )


def bound_line(p: PageThroughput, noun: str) -> str | None:
    """What holds the time per page, and the rate at the priced floors."""
    part = p.bound_by
    total = sum(x.ms_per_page for x in p.parts)
    if part is None or total <= 0:
        return None
    text = f"Bound by **{part.part}**: {pct(part.ms_per_page / total, 0)} of the time per {noun[:-1]}"
    if part.floor_ms_per_page:
        text += f", {part.ms_per_page / part.floor_ms_per_page:,.1f}× its floor"
    floor = p.floor_ms_per_page
    if floor:
        preprocess = next((x.ms_per_page for x in p.parts if x.part == PAGE_PREPROCESS), 0.0)
        at_floor = floor + preprocess
        text += (
            f". At the floors of the priced parts (preprocessing as measured) a {noun[:-1]} would take "
            f"{ms(at_floor, 2)} ms: {1e3 / at_floor:,.1f} {noun}/s"
        )
    return text


def parts_table(doc: Doc, p: PageThroughput, noun: str) -> None:
    """The time per page at the run's batch, part by part, beside each part's floor."""
    total = sum(x.ms_per_page for x in p.parts)
    rows = [
        [
            x.part,
            ms(x.ms_per_page, 2),
            pct(x.ms_per_page / total, 0) if total > 0 else "n/a",
            ms(x.floor_ms_per_page, 3),
            f"{x.ms_per_page / x.floor_ms_per_page:,.1f}×" if x.floor_ms_per_page else "n/a",
        ]
        for x in p.parts
    ]
    doc.table([f"part (batch {p.batch_size})", f"ms per {noun[:-1]}", "share", "floor (ms)", "× floor"], rows)
    images = any(x.part == PAGE_VISION for x in p.parts)
    split = (
        "; the language model's prefill is the prefill less the vision sub-stages (merging included)" if images else ""
    )
    doc.para(
        f"Each part's time in a pass divided by the {noun} the pass holds, median over {_passes(p)}{split}. Floor: "
        "the analytic speed of light of the same work (counted FLOPs at the dense peak or priced bytes at the peak "
        "bandwidth, whichever is longer); a decode floor falls as the batch grows, since a step reads the weights "
        f"once for every {noun[:-1]} in it."
    )


def host_around_line(h: HostAround, noun: str, cuda: bool, pinned: bool) -> str:
    """The host's work around each timed pass and, where the process's threads crowd the host on a GPU run, the
    setting that spares them."""
    text = (
        f"Around each pass: {ms(h.outside_ms)} ms (p50) of host work outside its timed stages ({pct(h.share, 0)} of "
        f"the pass's wall time: the call's window less its end to end), which the {noun}/s per pass leaves out"
    )
    if h.crowded and cuda and not pinned and h.cores_busy is not None:
        text += (
            f". The process kept {h.cores_busy:,.1f} cores busy per pass: its threads (one torch thread per core, "
            "beside any preprocessing threads) may crowd each other. Pin them to a share of the cores "
            "(`run.cpu_affinity`, e.g. `run.cpu_affinity=1-15`; on a 64-core H200 host at batch 64 this took 23.1 "
            "to 30.8 pages/s, docs/benchmarks.md)"
        )
    return text

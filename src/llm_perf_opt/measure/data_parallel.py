"""Data parallel over GPUs, combined: pages/s of N processes, each timing its own pages on its own GPU at once.

Every process records each timed forward on the wall clock (`PassWindow`); the **common window** runs from the latest
first-pass start to the earliest last-pass end, the time in which every process was timing. Each process's pages in the
window are its forwards' inputs, a forward cut by an edge of the window counted pro rata by the share of its time inside
it; its rate is those pages over the window's length, and the **combined pages/s** is the sum of the rates: the pages
all GPUs finished together per second of the window. The **scaling efficiency** is the combined rate over N times the
single-GPU rate of the same workload (pages over the span of its timed passes, first start to last end, measured the
same way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs

from llm_perf_opt.records.data_parallel import DataParallelSummary, PassWindow, ShardFigures, SingleGpu

Span = tuple[float, float]


@attrs.frozen
class ShardRun:
    """One process as the combination reads it: its figures (the window's not yet set) and its timed forwards."""

    figures: ShardFigures
    windows: tuple[PassWindow, ...] = ()


def timed_span(windows: Sequence[PassWindow]) -> Span | None:
    """From the first timed forward's start to the last one's end (None: no forward)."""
    if not windows:
        return None
    return min(w.started_s for w in windows), max(w.ended_s for w in windows)


def common_window(spans: Sequence[Span]) -> Span | None:
    """The time every span covers: the latest start to the earliest end; None when they share no moment."""
    if not spans:
        return None
    start, end = max(s for s, _ in spans), min(e for _, e in spans)
    return (start, end) if end > start else None


def pages_within(windows: Sequence[PassWindow], start: float, end: float) -> float:
    """Inputs the forwards finished inside [start, end], a forward cut by an edge counted by its share inside."""
    pages = 0.0
    for w in windows:
        inside = min(w.ended_s, end) - max(w.started_s, start)
        length = w.ended_s - w.started_s
        if inside > 0 and length > 0:
            pages += w.inputs * inside / length
    return pages


def span_rate(windows: Sequence[PassWindow]) -> float | None:
    """Pages over the span of the timed forwards (a single-GPU run's rate, measured as a process's window rate)."""
    span = timed_span(windows)
    if span is None or span[1] <= span[0]:
        return None
    return sum(w.inputs for w in windows) / (span[1] - span[0])


def single_gpu_from_run(folder: str, windows: Sequence[PassWindow], p50_pages_per_s: float | None) -> SingleGpu | None:
    """The single-GPU rate of a Stage 1 run folder: its pages over its timed span; its p50 pages/s per pass where
    it recorded no wall-clock times (a folder of an older release); None when it has neither."""
    rate, span = span_rate(windows), timed_span(windows)
    if rate is not None and span is not None:
        pages = sum(w.inputs for w in windows)
        return SingleGpu(rate, f"run folder {folder}: {pages} pages over its timed passes' {span[1] - span[0]:,.2f} s")
    if p50_pages_per_s is None:
        return None
    return SingleGpu(p50_pages_per_s, f"run folder {folder}: p50 pages/s of its passes (no wall-clock times)")


def _shared_gpus(runs: Sequence[ShardRun]) -> str | None:
    """Processes that ran on the same GPU of one host, in words (None: each had its own)."""
    seen: dict[tuple[str | None, str], list[int]] = {}
    for run in runs:
        device = run.figures.device
        if device is not None and device.startswith("cuda"):
            seen.setdefault((run.figures.host, device), []).append(run.figures.shard)
    shared = [(key, shards) for key, shards in seen.items() if len(shards) > 1]
    if not shared:
        return None
    said = "; ".join(f"shards {', '.join(map(str, s))} on {dev} of {host}" for (host, dev), s in shared)
    return (
        f"processes shared a GPU ({said}): more processes ran at once than there were GPUs, so their pages/s is not "
        "data parallel; run as many processes as GPUs (run.data_parallel and the launcher's n_jobs at most the "
        "visible GPUs)"
    )


def _problem(processes: int, runs: Sequence[ShardRun], done: Sequence[ShardRun]) -> str | None:
    """Why the processes give no combined figure (None: they do, if they timed at once)."""
    twice = sorted(s for s, n in Counter(r.figures.shard for r in runs).items() if n > 1)
    if twice:
        return f"shard {', '.join(map(str, twice))} ran more than once: each of the {processes} shards must run once"
    missing = [r for r in runs if not r.figures.ok]
    if len(done) < processes:
        absent = sorted(set(range(processes)) - {r.figures.shard for r in runs})
        parts = [f"shard {r.figures.shard}: {r.figures.skipped_reason}" for r in missing]
        if absent:
            parts.append(f"shard {', '.join(map(str, absent))}: no run")
        return (
            f"{len(done)} of {processes} processes timed their pages ({'; '.join(parts)}); a combined figure needs "
            "every process"
        )
    return _shared_gpus(done)


def _no_overlap(done: Sequence[ShardRun], spans: Sequence[Span]) -> str:
    first = min(s for s, _ in spans)
    said = ", ".join(
        f"shard {r.figures.shard} {s - first:,.1f}–{e - first:,.1f} s" for r, (s, e) in zip(done, spans, strict=True)
    )
    return (
        f"the processes did not time at the same time ({said}, from the first one's start): their timed passes share "
        "no moment, so there is no combined pages/s. Launch them at once (run.data_parallel=N, or a launcher with "
        "n_jobs at least the number of shards) and leave the wait for each other on"
    )


def combine(
    folder: str,
    processes: int,
    runs: Sequence[ShardRun],
    single: SingleGpu | None = None,
    workload: str | None = None,
) -> DataParallelSummary:
    """The data-parallel summary of `processes` processes from their runs (in any order; see the module docstring)."""
    ordered = sorted(runs, key=lambda r: r.figures.shard)
    checked = [
        r if r.windows or not r.figures.ok
        else attrs.evolve(r, figures=attrs.evolve(r.figures, skipped_reason="no wall-clock times of its timed passes"))
        for r in ordered
    ]  # fmt: skip
    done = [r for r in checked if r.figures.ok]
    spans = [span for r in done if (span := timed_span(r.windows)) is not None]  # all of them: ok runs have windows
    figures = [
        attrs.evolve(r.figures, timed_from_s=span[0], timed_to_s=span[1], passes=len(r.windows))
        if (span := timed_span(r.windows)) is not None
        else r.figures
        for r in checked
    ]
    summary = DataParallelSummary(
        folder=folder, processes=processes, shards=tuple(figures), single_gpu=single, workload=workload
    )
    problem = _problem(processes, checked, done)
    if problem is not None:
        return attrs.evolve(summary, problem=problem)
    window = common_window(spans)
    if window is None:
        return attrs.evolve(summary, problem=_no_overlap(done, spans))
    start, end = window
    by_shard = {r.figures.shard: r.windows for r in done}
    in_window = [
        attrs.evolve(f, window_pages=(pages := pages_within(by_shard[f.shard], start, end)),
                     window_pages_per_s=pages / (end - start))
        if f.ok else f
        for f in figures
    ]  # fmt: skip
    combined = sum(f.window_pages_per_s or 0.0 for f in in_window if f.ok)
    efficiency = None if single is None or single.pages_per_s <= 0 else combined / (processes * single.pages_per_s)
    return attrs.evolve(
        summary,
        shards=tuple(in_window),
        window_start_s=start,
        window_end_s=end,
        combined_pages_per_s=combined,
        scaling_efficiency=efficiency,
    )

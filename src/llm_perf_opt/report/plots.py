"""Stage 1 plots from its `Stage1Metrics` record, and the roofline helpers the Stage 2 kernel roofline shares. Each
plot function takes the record and a PNG path and returns the path, or None (writing nothing) without its data."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import ImageRecord, Stage1Metrics
from llm_perf_opt.report.pyplot import closes_its_figures, pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
TOP_OPERATORS = 10
MAX_PANELS = 4
ANNOTATED_CELLS = 256  # routing heatmaps up to this many cells print each cell's count
PREPROCESS = vocab.PREPROCESS
REST_OF_PREFILL = "prefill (rest)"
DECODE = vocab.DECODE

SEGMENT_COLOURS = {PREPROCESS: "#9e9e9e", REST_OF_PREFILL: "#f28e2b", DECODE: "#59a14f"}
_VISION_COLOURS = ("#1f4e9c", "#4e79a7", "#a0cbe8", "#76b7b2", "#b07aa1")
STAGE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINE_STYLES = ("-", "--", "-.", ":")

Metrics = Stage1Metrics
S = TypeVar("S")  # what a set of plots is drawn from (a record)


def _ticker() -> ModuleType:
    """`matplotlib.ticker`, imported with pyplot (on the Agg backend)."""
    pyplot()
    import matplotlib.ticker

    return matplotlib.ticker


def save_figure(fig: Figure, path: Path) -> Path:
    """Write `fig` to `path` as PNG, close it, return `path`. A constrained-layout figure (every report figure)
    already fits its labels; any other is cut to its tight bounding box, at the cost of measuring every artist again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if fig.get_layout_engine() is None:
            fig.savefig(path, dpi=DPI, bbox_inches="tight")
        else:
            fig.savefig(path, dpi=DPI)
    finally:
        pyplot().close(fig)
    return path


def records_by_image(m: Metrics) -> dict[str, list[ImageRecord]]:
    """Each input's timed passes, in the record's order."""
    out: dict[str, list[ImageRecord]] = {}
    for rec in m.records:
        out.setdefault(rec.image, []).append(rec)
    return out


def _segments(rec: ImageRecord, vision: Sequence[str]) -> dict[str, float]:
    parts = {PREPROCESS: rec.preprocess_ms}
    parts.update({v: rec.vision_ms.get(v, 0.0) for v in vision})
    # vision runs inside prefill: only the remainder of prefill is added on top of it
    parts[REST_OF_PREFILL] = max(0.0, rec.prefill_ms - sum(rec.vision_ms.values()))
    parts[DECODE] = rec.decode_ms
    return parts


def stage_segments(m: Metrics) -> dict[str, dict[str, float]]:
    """image -> segment -> ms of the image's median pass by end-to-end time (the two middle passes averaged
    when the count is even), so the segments add up to the median end-to-end time."""
    vision = m.vision_stages
    out: dict[str, dict[str, float]] = {}
    for image, recs in records_by_image(m).items():
        ordered = sorted(recs, key=lambda r: r.e2e_ms)
        mid = len(ordered) // 2
        middle = ordered[mid : mid + 1] if len(ordered) % 2 else ordered[mid - 1 : mid + 1]
        seg = [_segments(r, vision) for r in middle]
        out[image] = {k: statistics.fmean(s[k] for s in seg) for k in seg[0]}
    return out


@closes_its_figures
def stage_breakdown(m: Metrics, path: Path) -> Path | None:
    """Stacked horizontal bar per image: preprocess, vision sub-stages, rest of prefill, decode (ms)."""
    segs = stage_segments(m)
    if not segs:
        return None
    images = list(segs)
    names = list(next(iter(segs.values())))
    vision = [n for n in names if n not in SEGMENT_COLOURS]
    colours = {**SEGMENT_COLOURS, **{v: _VISION_COLOURS[i % len(_VISION_COLOURS)] for i, v in enumerate(vision)}}
    totals = [sum(segs[i].values()) for i in images]
    longest = max(totals) or 1.0

    fig, ax = pyplot().subplots(figsize=(10, 2.2 + 0.5 * len(images)), layout="constrained")
    left = [0.0] * len(images)
    for name in names:
        widths = [segs[i][name] for i in images]
        bars = ax.barh(
            images, widths, left=left, height=0.7, color=colours[name], edgecolor="white", linewidth=0.5, label=name
        )
        text_colour = "white" if name != PREPROCESS else "black"
        for bar, w in zip(bars, widths, strict=True):
            if w >= 0.07 * longest:  # label only segments wide enough to hold the text
                x, y = bar.get_x() + w / 2, bar.get_y() + bar.get_height() / 2
                ax.text(x, y, f"{w:.0f}", ha="center", va="center", fontsize=8, color=text_colour)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(totals):
        ax.text(total + 0.01 * longest, y, f"{total:.0f} ms", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.12)
    ax.set_xlabel("time (ms)")
    unit = "prompt" if m.settings.input_kind == "text" else "image"
    ax.set_ylabel(unit)
    ax.set_title(
        f"End-to-end time per {unit} by stage ({m.device.name}; median pass by end-to-end time)"
        + ("\nvision stages are part of prefill, shown once" if m.vision_stages else ""),
        fontsize=10,
    )
    fig.legend(loc="outside lower center", ncol=len(names), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return save_figure(fig, path)


def decode_step_medians(m: Metrics) -> dict[str, tuple[list[int], list[float]]]:
    """image -> (context lengths = prompt tokens + step index, median step latency over repeats in ms)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for image, recs in records_by_image(m).items():
        steps = [list(r.decode_step_ms) for r in recs]
        n = max((len(s) for s in steps), default=0)
        if n == 0:
            continue
        prompt = round(statistics.median(r.prompt_tokens for r in recs))
        medians = [statistics.median(s[i] for s in steps if len(s) > i) for i in range(n)]
        out[image] = ([prompt + i for i in range(n)], medians)
    return out


@closes_its_figures
def decode_latency(m: Metrics, path: Path) -> Path | None:
    """Per-step decode latency (ms) against context length, one line per image (median over repeats), one panel
    (shared y axis) per prompt length, since each image spans only its few steps; over MAX_PANELS lengths share one."""
    series = decode_step_medians(m)
    if not series:
        return None
    groups: dict[int, list[str]] = {}
    for image, (ctx, _) in series.items():
        groups.setdefault(ctx[0], []).append(image)
    panels = sorted(groups.items()) if len(groups) <= MAX_PANELS else [(0, list(series))]
    fig, axes = pyplot().subplots(
        1, len(panels), figsize=(3.2 + 3.2 * len(panels), 4.8), sharey=True, layout="constrained", squeeze=False
    )
    top = max(max(ms) for _, ms in series.values())
    k = 0
    for ax, (_, images) in zip(axes[0], panels, strict=True):
        for image in images:
            ctx, ms = series[image]
            style, marker = _LINE_STYLES[k % len(_LINE_STYLES)], STAGE_MARKERS[k % len(STAGE_MARKERS)]
            label = f"{image}\n(prompt {ctx[0]} tokens)"
            ax.plot(
                ctx, ms, linestyle=style, marker=marker, markersize=3.5, linewidth=1.3, color=f"C{k % 10}", label=label
            )
            k += 1
        ax.set_ylim(0, top * 1.3)
        ax.xaxis.set_major_locator(_ticker().MaxNLocator(nbins=5, integer=True))
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("decode step latency (ms)")
    handles = [h for ax in axes[0] for h in ax.get_lines()]
    # Below the panels, never on the data.
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=7.5, frameon=False)
    fig.suptitle(
        f"Decode step latency vs context length = prompt tokens + step index ({m.device.name}; median over repeats)",
        fontsize=10,
    )
    return save_figure(fig, path)


def _compute_peaks(m: Metrics) -> list[tuple[float, str]]:
    peaks: dict[float, str] = {}
    for rec in m.mfu:
        if rec.peak is not None and rec.peak.value:
            peaks.setdefault(rec.peak.value, rec.peak.dtype_key or "")
    return sorted(peaks.items(), reverse=True)


def roofline_limits(
    points: Sequence[tuple[float, float]], peaks: Sequence[tuple[float, str]], bw: float
) -> tuple[float, float, float, float]:
    """(x_lo, x_hi, y_lo, y_hi) holding every (FLOP/byte, FLOP/s) point, every ridge and the top roof, with margins."""
    ridges = [p / bw for p, _ in peaks]
    x_lo = min(min(x for x, _ in points), min(ridges)) / 4
    x_hi = max(max(x for x, _ in points), max(ridges)) * 6
    y_lo = min(min(y for _, y in points), x_lo * bw) / 4
    return x_lo, x_hi, y_lo, max(p for p, _ in peaks) * 3


def draw_roofs(ax: Axes, peaks: Sequence[tuple[float, str]], bw: float, x_lo: float, x_hi: float) -> None:
    """One roof min(peak, intensity x bw) per compute peak (FLOP/s, label; highest first, solid), with its ridge."""
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    for k, (peak, label) in enumerate(peaks):
        ridge = peak / bw
        ax.plot(
            xs,
            [min(peak, x * bw) for x in xs],
            color="black",
            linewidth=max(0.8, 2 - 0.5 * k),
            linestyle="-" if k == 0 else "--",
            label=f"roof: min({si(peak, 'FLOP/s')} {label}, intensity × {si(bw, 'B/s')})",
        )
        ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
        note = f"ridge {ridge:.3g} FLOP/B"
        ax.annotate(note, (ridge, peak), xytext=(5, -14), textcoords="offset points", fontsize=8, color="dimgrey")


def style_roofline_axes(ax: Axes, limits: tuple[float, float, float, float]) -> None:
    """Log-log axes with the given limits, unit labels and a light grid."""
    x_lo, x_hi, y_lo, y_hi = limits
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.yaxis.set_major_formatter(_ticker().EngFormatter(unit=""))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved throughput (FLOP/s)")
    ax.grid(which="major", alpha=0.3)
    ax.grid(which="minor", alpha=0.1)


@closes_its_figures
def roofline(m: Metrics, path: Path) -> Path | None:
    """Log-log roofline of the device with each stage of `efficiency` as a point; None without both peaks."""
    peaks = _compute_peaks(m)
    bw = m.bandwidth_peak.value if m.bandwidth_peak else 0.0
    points = [
        (e.stage, e.flops / e.bytes, e.flops / (e.time_ms / 1e3), e.mfu)
        for e in m.efficiency
        if e.flops > 0 and e.bytes > 0 and e.time_ms > 0
    ]
    if not peaks or bw <= 0 or not points:
        return None

    limits = roofline_limits([(p[1], p[2]) for p in points], peaks, bw)
    fig, ax = pyplot().subplots(figsize=(9, 7), layout="constrained")
    draw_roofs(ax, peaks, bw, limits[0], limits[1])
    for k, (stage, intensity, achieved, mfu) in enumerate(points):
        mfu_txt = f", MFU {100 * mfu:.2g}%" if mfu is not None else ""
        ax.scatter(
            [intensity],
            [achieved],
            s=60,
            marker=STAGE_MARKERS[k % len(STAGE_MARKERS)],
            zorder=3,
            color=f"C{k % 10}",
            label=f"{stage}: {intensity:.3g} FLOP/B, {si(achieved, 'FLOP/s')}{mfu_txt}",
        )
        dy = _label_dy(k, points)
        ax.annotate(stage, (intensity, achieved), xytext=(8, dy), textcoords="offset points", fontsize=8, va="center")
    style_roofline_axes(ax, limits)
    ax.set_title(
        f"Roofline of the stages over all timed passes ({m.device.name})\nFLOPs counted, bytes from the analytic model",
        fontsize=10,
    )
    fig.legend(loc="outside lower center", fontsize=8, frameon=False, ncol=2)
    return save_figure(fig, path)


def si(value: float, unit: str) -> str:
    """`989.4e12, "FLOP/s"` -> `989 TFLOP/s` (3 significant digits, engineering prefix)."""
    return str(_ticker().EngFormatter(unit=unit)(float(f"{value:.3g}")))


def _label_dy(k: int, points: Sequence[tuple[str, float, float, float | None]]) -> float:
    """Vertical label offset (points): apart from a neighbour closer than ~0.2 decades in both axes."""
    _, x, y, _ = points[k]
    for j, (_, x2, y2, _) in enumerate(points):
        if j != k and abs(math.log10(x2 / x)) < 0.2 and abs(math.log10(y2 / y)) < 0.2:
            return 7.0 if (y, k) > (y2, j) else -7.0
    return 0.0


_SORT_KEY_LABELS = {"self_device_ms": "self device time", "self_cpu_ms": "self CPU time"}


@closes_its_figures
def operator_shares(m: Metrics, path: Path) -> Path | None:
    """Horizontal bars: each of the top 10 operators' share of the sort key, the remaining listed ones as "other"."""
    key = m.operator_sort_key
    rows = [(r.name, float(getattr(r, key))) for r in m.top_operators] if key else []
    total = sum(v for _, v in rows)
    if total <= 0:
        return None
    rows.sort(key=lambda r: r[1], reverse=True)
    shown, rest = rows[:TOP_OPERATORS], rows[TOP_OPERATORS:]
    if rest:
        shown.append((f"other ({len(rest)} operators)", sum(v for _, v in rest)))
    names = [n for n, _ in shown]
    shares = [100 * v / total for _, v in shown]

    fig, ax = pyplot().subplots(figsize=(9, 1.2 + 0.38 * len(shown)), layout="constrained")
    colours = ["#4e79a7"] * min(len(rows), TOP_OPERATORS) + ["#bab0ac"] * bool(rest)
    ax.barh(names, shares, color=colours)
    for y, (share, (_, ms)) in enumerate(zip(shares, shown, strict=True)):
        ax.text(share + 0.5, y, f"{share:.1f}% ({ms:.1f} ms)", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(shares) * 1.3)
    label = _SORT_KEY_LABELS.get(str(key), str(key))
    ax.set_xlabel(f"share of {label} over the {len(rows)} listed operators (%)")
    ax.set_title(f"Top operators by {label} (torch profiler, profiled pass; {m.device.name})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return save_figure(fig, path)


@closes_its_figures
def routing_hits(m: Metrics, path: Path) -> Path | None:
    """Heatmap of the MoE routing record: for each MoE layer (rows) and routed expert (columns), the share of the
    timed decode steps whose tokens picked it; None for a run without a routing record."""
    routing = m.routing
    if routing is None or not routing.hit_histogram or not routing.steps:
        return None
    share = [[100.0 * hits / routing.steps for hits in row] for row in routing.hit_histogram]
    layers = [f"layer {r.layer}" for r in routing.per_layer]
    experts = routing.experts
    size = (max(6.0, 2.5 + 0.16 * experts), max(2.6, 1.6 + 0.32 * len(layers)))
    fig, ax = pyplot().subplots(figsize=size, layout="constrained")
    image = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0.0, vmax=100.0, interpolation="nearest")
    if experts * len(layers) <= ANNOTATED_CELLS:  # a small grid: each cell's count of steps
        for row, hits in enumerate(routing.hit_histogram):
            for expert, count in enumerate(hits):
                colour = "white" if share[row][expert] < 50 else "black"
                ax.text(expert, row, str(count), ha="center", va="center", fontsize=8, color=colour)
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels(layers, fontsize=8)
    ax.xaxis.set_major_locator(_ticker().MaxNLocator(integer=True, nbins=min(experts, 16)))
    ax.set_xlabel(f"routed expert (of {experts})")
    ax.set_ylabel("MoE layer")
    uniform = 100.0 * routing.expected_unique / experts
    ax.set_title(
        f"Experts hit per decode step: top-{routing.top_k}, {routing.tokens_per_step} token(s) per step, "
        f"{routing.steps} timed steps\n(uniform routing would hit each expert in {uniform:.0f}% of the steps; "
        f"{m.model.name})",
        fontsize=10,
    )
    bar = fig.colorbar(image, ax=ax, pad=0.02)
    bar.set_label("decode steps that hit it (%)")
    return save_figure(fig, path)


PLOTS = {
    "stage_breakdown": stage_breakdown,
    "decode_latency": decode_latency,
    "roofline": roofline,
    "operator_shares": operator_shares,
    "routing_hits": routing_hits,
}


MEMORY_TIMELINE = "memory/memory_timeline.png"
_BAND_COLOURS = {PREPROCESS: "#9e9e9e", vocab.PREFILL: "#f28e2b", DECODE: "#59a14f"}


@closes_its_figures
def memory_timeline(m: Metrics, path: Path) -> Path | None:
    """Allocated and reserved GPU memory over the memory pass (samples at every stage boundary, so every decode
    step), with a band per top-level stage; None without a memory pass."""
    measured = m.memory.measured if m.memory is not None else None
    if measured is None or not measured.samples:
        return None
    samples = measured.samples
    t = [s.t_ms for s in samples]
    gib = 2.0**30

    def times(stage: str, event: str) -> list[float]:
        return [s.t_ms for s in samples if s.stage == stage and s.event == event]

    fig, ax = pyplot().subplots(figsize=(9.0, 4.2), layout="constrained")
    for stage, colour in _BAND_COLOURS.items():
        begins, ends = times(stage, "begin"), times(stage, "end")
        for k, (lo, hi) in enumerate(zip(begins, ends, strict=False)):
            ax.axvspan(lo, hi, color=colour, alpha=0.15, linewidth=0, label=stage if k == 0 else None)
    ax.step(t, [s.reserved_bytes / gib for s in samples], where="post", color="#4e79a7", label="reserved")
    ax.step(t, [s.allocated_bytes / gib for s in samples], where="post", color="#e15759", label="allocated")
    ax.step(t, [s.kv_bytes / gib for s in samples], where="post", color="#76b7b2", linestyle="--", label="KV cache")
    ax.axhline(measured.weights_bytes / gib, color="#555555", linestyle=":", linewidth=1, label="weights")
    # The boundaries miss what happens inside a stage: each stage's own peak (allocator counter) across its span.
    # A peak is named once, by its innermost stage (a vision stage's peak is also its prefill's).
    vision_peaks = {p.peak_allocated_bytes for p in measured.peaks if vocab.is_vision(p.stage)}
    first = True
    for peak in measured.peaks:
        if peak.stage in (vocab.E2E, vocab.DECODE_STEP):
            continue
        begins, ends = times(peak.stage, "begin"), times(peak.stage, "end")
        if not begins or not ends:
            continue
        y = peak.peak_allocated_bytes / gib
        ax.hlines(y, min(begins), max(ends), color="#e15759", linewidth=3, alpha=0.45,
                  label="peak allocated in the stage" if first else "_nolegend_")  # fmt: skip
        first = False
        nested_peak = not vocab.is_vision(peak.stage) and peak.peak_allocated_bytes in vision_peaks
        minor_vision = vocab.is_vision(peak.stage) and peak.peak_allocated_bytes != max(vision_peaks)
        if minor_vision or nested_peak:
            continue
        ax.annotate(f"{peak.stage}: {y:.2f} GiB", (min(begins), y), textcoords="offset points", xytext=(2, 5),
                    fontsize=7.5)  # fmt: skip
    ax.set_xlabel("host time since the pass began (ms)")
    ax.set_ylabel("GPU memory (GiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    ax.set_title(
        f"Memory pass: {measured.input} (batch {measured.batch_size}, {measured.new_tokens} new tokens; "
        f"{m.device.name})\nlines: at stage boundaries; bars: each stage's own peak",
        fontsize=9.5,
    )
    return save_figure(fig, path)


def write_plots(plots: Mapping[str, Callable[[S, Path], Path | None]], source: S, folder: Path) -> dict[str, Path]:
    """Every plot of `plots` that applies to `source`, as `folder/plots/<name>.png`; returns name -> path."""
    written = {name: plot(source, folder / "plots" / f"{name}.png") for name, plot in plots.items()}
    return {name: path for name, path in written.items() if path is not None}


def write_stage1_plots(
    m: Metrics, folder: Path, extra: Mapping[str, Callable[[Metrics, Path], Path | None]] | None = None
) -> dict[str, Path]:
    """Every Stage 1 plot that applies (`PLOTS`, then `extra`), as `folder/plots/<name>.png` (the memory timeline
    as `folder/memory/memory_timeline.png`); returns name -> path."""
    out = write_plots({**PLOTS, **(extra or {})}, m, folder)
    timeline = memory_timeline(m, folder / MEMORY_TIMELINE)
    if timeline is not None:
        out["memory_timeline"] = timeline
    return out

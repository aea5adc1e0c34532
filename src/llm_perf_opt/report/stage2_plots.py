"""Stage 2 plot from its `Stage2Metrics` record: the kernels Nsight Compute profiled on the device's roofline, each
at (FLOPs / DRAM bytes, FLOPs / duration) per launch, drawn only when those figures are complete (`kernel_points`);
the caption says how many were left out and why."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from llm_perf_opt.kernel_names import kernel_label
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.stage2 import NcuKernelRow, Stage2Metrics
from llm_perf_opt.report import plots
from llm_perf_opt.report.markdown import clip
from llm_perf_opt.report.pyplot import closes_its_figures, pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

KERNEL_ROOFLINE = "kernel_roofline.png"
LABELLED = 6  # hottest kernels (nsys GPU time) named on the chart
LABEL_CHARS = 36  # longer kernel names are cut with "…"
SIZE_FLOOR = 18.0  # marker area (pt²) of a kernel with a 0% share, or an unknown one
SIZE_PER_SHARE = 900.0  # marker area (pt²) added per 100% of the stage's GPU time: area ∝ share
SIZE_KEY = (0.01, 0.1, 0.3)  # shares shown in the legend's size key
# (side: +1 right / -1 left of the marker, vertical offset in points), in order of preference
_LABEL_OFFSETS = tuple((side, dy) for dy in (0, 11, -11, 22, -22, 33, -33, 44, -44) for side in (1, -1))

STAGE_COLOURS = {
    vocab.PREFILL: plots.SEGMENT_COLOURS[plots.REST_OF_PREFILL],
    vocab.DECODE: plots.SEGMENT_COLOURS[plots.DECODE],
}

# Why a profiled kernel is not on the chart, in the order they are checked.
# Each reads after "N kernel(s) with".
NO_FLOPS = "no FLOP counter in their ncu export"
NO_TENSOR = "no tensor-core FLOP counter in their ncu export (their FLOPs could miss tensor-core work)"
ZERO_FLOPS = "0 FLOPs (no place on a log axis)"
ZERO_BYTES = "0 DRAM bytes (unbounded intensity)"


@attrs.frozen
class KernelPoint:
    """One profiled kernel on the roofline."""

    stage: str
    label: str  # readable kernel name (kernel_names.kernel_label)
    intensity: float  # FLOP per DRAM byte (ncu, per launch)
    achieved: float  # FLOP/s (ncu: FLOPs / duration, per launch)
    share: float | None  # of the stage's summed kernel time (nsys); None when nsys has no kernel of that name
    gpu_ms: float | None  # nsys GPU time of the kernel in the stage, all timed passes


def _left_out_reason(row: NcuKernelRow) -> str | None:
    if row.flops is None or row.achieved_tflops is None:
        return NO_FLOPS
    if not row.tensor_ops_counted:
        return NO_TENSOR
    if row.flops <= 0:
        return ZERO_FLOPS
    if row.dram_bytes <= 0 or row.arithmetic_intensity is None:
        return ZERO_BYTES
    return None


def _point(row: NcuKernelRow) -> KernelPoint:
    """A kernel `_left_out_reason` keeps, as a point."""
    assert row.arithmetic_intensity is not None and row.achieved_tflops is not None
    return KernelPoint(
        stage=row.stage,
        # † : the time share covers every instantiation of the function name, not only the one ncu measured
        label=kernel_label(row.name, row.full_name) + (" †" if row.stage_instantiations > 1 else ""),
        intensity=row.arithmetic_intensity,
        achieved=row.achieved_tflops * 1e12,
        share=row.stage_share,
        gpu_ms=row.stage_gpu_ms,
    )


def kernel_points(m: Stage2Metrics) -> tuple[list[KernelPoint], dict[str, int]]:
    """The plottable ncu kernels, hottest (nsys GPU time) first, and reason -> number of kernels left out."""
    points: list[KernelPoint] = []
    left_out: dict[str, int] = {}
    for row in m.ncu_kernels:
        reason = _left_out_reason(row)
        if reason is None:
            points.append(_point(row))
        else:
            left_out[reason] = left_out.get(reason, 0) + 1
    points.sort(key=lambda p: (p.gpu_ms is None, -(p.gpu_ms or 0.0), -p.achieved))
    return points, left_out


def _roof_label(roof: PeakFigure) -> str:
    key = roof.dtype_key or ""
    if not key:
        return "compute"
    return f"{key.upper()} {'CUDA-core' if key == 'fp32' else 'tensor-core'}"


def _roofs(m: Stage2Metrics) -> tuple[list[tuple[float, str]], float]:
    """(compute roofs as (FLOP/s, label), highest first; memory roof in B/s, 0 when unknown)."""
    compute = sorted(((r.value, _roof_label(r)) for r in m.compute_roofs if r.value), reverse=True)
    return compute, m.bandwidth_peak.value if m.bandwidth_peak else 0.0


def source_summary(sources: Iterable[str]) -> str:
    """Distinct peak sources, each cut to its origin and URL: `datasheet: NVIDIA H100 SXM5 (https://…)`."""
    out: list[str] = []
    for source in sources:
        url = re.search(r"\((https://[^)\s]+)\)", source)
        head = source.split(", ", 1)[0] if url else source
        text = f"{head.removesuffix(url.group(0)).strip()} ({url.group(1)})" if url else head
        if text not in out:
            out.append(text)
    return "; ".join(out)


def _peak_sources(m: Stage2Metrics) -> str:
    roofs = [*m.compute_roofs, *([m.bandwidth_peak] if m.bandwidth_peak else [])]
    return source_summary(r.source for r in roofs if r.source)


def _size(share: float | None) -> float:
    return SIZE_FLOOR + SIZE_PER_SHARE * (share or 0.0)


def _scatter_by_stage(ax: Axes, points: Sequence[KernelPoint]) -> list[Line2D]:
    """One scatter per stage (hollow markers where the share is unknown); returns the stages' legend handles."""
    handles = []
    markers = plots.STAGE_MARKERS
    for k, stage in enumerate(dict.fromkeys(p.stage for p in points)):
        colour, marker = STAGE_COLOURS.get(stage, f"C{(k + 2) % 10}"), markers[k % len(markers)]
        mine = [p for p in points if p.stage == stage]
        for known in (True, False):
            group = [p for p in mine if (p.share is not None) is known]
            if group:
                ax.scatter(
                    [p.intensity for p in group],
                    [p.achieved for p in group],
                    s=[_size(p.share) for p in group],
                    marker=marker,
                    facecolors=colour if known else "none",
                    edgecolors="black" if known else colour,
                    linewidths=0.5 if known else 1.5,
                    alpha=0.85,
                    zorder=3,
                )
        handles.append(_handle(marker, 8, colour, f"{stage} ({len(mine)})"))
    return handles


def _handle(marker: str, size: float, colour: str, label: str, face: str | None = None) -> Line2D:
    """A legend entry: one marker (filled with `face`, else with `colour`), no line."""
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="", marker=marker, markersize=size, markerfacecolor=face, color=colour, label=label)


def _size_key(points: Sequence[KernelPoint]) -> list[Line2D]:
    """Legend handles for marker area = share of the stage's GPU time, plus the hollow unknown-share marker."""
    handles = [_handle("o", math.sqrt(_size(s)), "grey", f"{s:.0%}") for s in SIZE_KEY]
    if any(p.share is None for p in points):
        unknown = "share unknown (name not in the nsys trace)"
        handles.append(_handle("o", math.sqrt(SIZE_FLOOR), "grey", unknown, face="none"))
    return handles


def _short(point: KernelPoint) -> str:
    name = clip(point.label, LABEL_CHARS)
    return name if point.share is None else f"{name} ({100 * point.share:.2g}%)"


def _marker_boxes(ax: Axes, points: Sequence[KernelPoint]) -> list[Bbox]:
    """Each point's marker as a display-space box (pixels)."""
    from matplotlib.transforms import Bbox

    px_per_pt = ax.figure.dpi / 72
    boxes = []
    for p in points:
        x, y = ax.transData.transform((p.intensity, p.achieved))
        r = math.sqrt(_size(p.share)) / 2 * px_per_pt
        boxes.append(Bbox.from_extents(x - r, y - r, x + r, y + r))
    return boxes


def _text_box(note: Annotation, renderer: RendererBase) -> Bbox:
    """The annotation's text box without its leader line, 2 px of padding around it."""
    from matplotlib.text import Text

    note.update_positions(renderer)
    return Text.get_window_extent(note, renderer).padded(2)


def _label_hottest(ax: Axes, hottest: Sequence[KernelPoint], points: Sequence[KernelPoint]) -> None:
    """Name each of `hottest` next to its marker, at the first offset whose text stays inside the axes and clears
    every marker, earlier label and ridge note (else at the offset with the fewest clashes)."""
    from matplotlib.text import Annotation

    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    inside = ax.get_window_extent(renderer)
    obstacles = [*_marker_boxes(ax, points), *(_text_box(t, renderer) for t in ax.texts if isinstance(t, Annotation))]
    for point in hottest:
        gap = math.sqrt(_size(point.share)) / 2 + 4  # points from the marker's centre to the text
        best: tuple[int, Annotation, Bbox] | None = None
        for side, dy in _LABEL_OFFSETS:
            note = ax.annotate(
                _short(point),
                (point.intensity, point.achieved),
                xytext=(side * gap, dy),
                textcoords="offset points",
                ha="left" if side > 0 else "right",
                va="center",
                fontsize=8,
                arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.6} if dy else None,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.75},
                zorder=4,
            )
            box = _text_box(note, renderer)
            outside = not (inside.containsx(box.x0) and inside.containsx(box.x1))
            clashes = 100 * outside + sum(box.overlaps(o) for o in obstacles)
            if best is None or clashes < best[0]:
                if best is not None:
                    best[1].remove()
                best = (clashes, note, box)
            else:
                note.remove()
            if clashes == 0:
                break
        if best is not None:
            obstacles.append(best[2])


def left_out_text(left_out: Mapping[str, int]) -> str:
    """`5 kernels with 0 FLOPs (…); 1 kernel with …`; empty when none was left out."""
    return "; ".join(f"{n} kernel{'s' * (n != 1)} with {reason}" for reason, n in left_out.items())


def _title(m: Stage2Metrics, points: Sequence[KernelPoint], left_out: Mapping[str, int]) -> str:
    device = m.device.name or "GPU"
    total = len(points) + sum(left_out.values())
    counted = f"{len(points)} of {total} profiled kernels plotted" + (
        f"; left out: {sum(left_out.values())} (see kernels.md)" if left_out else ""
    )
    return (
        f"Hot kernels on the roofline of the {device} (Nsight Compute, per launch)\n"
        f"{counted}; peaks: {_peak_sources(m)}"
    )


@closes_its_figures
def kernel_roofline_figure(m: Stage2Metrics) -> Figure | None:
    """Log-log roofline of the device with each plottable ncu kernel as a point (colour and marker: stage; area:
    share of the stage's GPU time; the LABELLED hottest named); None without a compute and a memory roof or
    without a plottable kernel. The caller closes the figure."""
    roofs, bw = _roofs(m)
    points, left_out = kernel_points(m)
    if not roofs or bw <= 0 or not points:
        return None
    limits = plots.roofline_limits([(p.intensity, p.achieved) for p in points], roofs, bw)
    fig, ax = pyplot().subplots(figsize=(10, 7.5), layout="constrained")
    plots.draw_roofs(ax, roofs, bw, limits[0], limits[1])
    stage_handles = _scatter_by_stage(ax, points)
    plots.style_roofline_axes(ax, limits)
    ax.set_title(_title(m, points, left_out), fontsize=9)
    roof_handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=roof_handles, loc="outside lower center", fontsize=8, frameon=False, ncol=1)
    ax.legend(
        handles=[*stage_handles, *_size_key(points)],
        loc="upper left",
        fontsize=8,
        title="stage (kernels) · area = share of stage GPU time",
        title_fontsize=8,
        labelspacing=1.0,
        borderpad=0.8,
    )
    fig.canvas.draw()  # settle the layout, so label boxes are measured where they end up
    _label_hottest(ax, points[:LABELLED], points)
    return fig


def roofline_caption(m: Stage2Metrics) -> str:
    """What the kernel roofline shows and which profiled kernels it leaves out."""
    points, left_out = kernel_points(m)
    total = len(points) + sum(left_out.values())
    text = (
        "Each point is one kernel that Nsight Compute profiled: x = FLOPs / DRAM bytes, y = FLOPs / duration, both "
        "per launch as ncu measured them (caches flushed between replays; FMA = 2 FLOPs; tensor-core ops counted "
        "as FLOPs). Colour and marker give the stage, the marker's area the kernel's share of the stage's GPU time "
        f"(nsys); labels name the hottest (up to {LABELLED}, by nsys GPU time); † marks a function name shared by "
        "several instantiations: the point is the one ncu measured, the share covers all of them. Roofs: "
        f"min(compute peak, intensity × memory bandwidth), peaks from {_peak_sources(m) or 'no source'}. "
        f"Plotted: {len(points)} of the {total} profiled kernels"
    )
    return text + (f"; left out: {left_out_text(left_out)}." if left_out else ".")


def missing_reason(m: Stage2Metrics) -> str:
    """Why no kernel roofline was drawn (for the report in its place)."""
    roofs, bw = _roofs(m)
    if not roofs or bw <= 0:
        device = m.device.name or "this GPU"
        return (
            f"no compute or bandwidth peak is known for {device} (pass hardware.peak_tflops and "
            "hardware.peak_bandwidth_gbps to stage2-profile; they reach the workload)"
        )
    _, left_out = kernel_points(m)
    if not left_out:
        return "Nsight Compute profiled no kernel"
    return f"no profiled kernel has complete figures; left out: {left_out_text(left_out)}"


def write_stage2_plots(m: Stage2Metrics, folder: Path) -> dict[str, str]:
    """Every Stage 2 plot that applies, in `folder`; returns name -> path relative to `folder`. A plot that no
    longer applies is removed, so a re-rendered folder holds no stale chart."""
    target = folder / KERNEL_ROOFLINE
    fig = kernel_roofline_figure(m)
    if fig is None:
        target.unlink(missing_ok=True)
        return {}
    plots.save_figure(fig, target)
    return {"kernel_roofline": KERNEL_ROOFLINE}

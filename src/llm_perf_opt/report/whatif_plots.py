"""What-if plots from a `WhatIfRecord`: the waterfall from the baseline to the best rung (decode ms/token, or time to
first token for a run ranked by it), the distance to the floor per stage, the best rung's module moves and pages/s
against per-page latency. Each takes the record and a PNG path and returns the path, or None (writing nothing) when
the data it needs is absent."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llm_perf_opt.measure.whatif_objectives import latency_point
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import StageModuleChanges
from llm_perf_opt.records.whatif import BASELINE, LADDER, LATENCY_FIGURES, MEASURED, Rung, WhatIfRecord
from llm_perf_opt.report.modules_report import changes_waterfall
from llm_perf_opt.report.plots import save_figure, write_plots
from llm_perf_opt.report.pyplot import closes_its_figures, pyplot

if TYPE_CHECKING:
    from matplotlib.patches import Patch


def _patch() -> type[Patch]:
    """matplotlib's legend `Patch`, imported with pyplot."""
    pyplot()
    from matplotlib.patches import Patch

    return Patch


TOTAL_COLOUR = "#4e79a7"
IDLE_COLOUR = "#f28e2b"  # launch and host overhead
BUSY_COLOUR = "#59a14f"  # the kernels' own work
OTHER_COLOUR = "#bab0ac"  # a change the attribution does not split
LAYER_COLOURS = ("#59a14f", "#76b7b2", "#4e79a7", "#f28e2b")  # speed of light, kernels, busy, wall
LAYERS = ("speed of light", "summed kernels", "GPU busy", "wall")


FIRST_TOKEN_FIGURE = "ttft_ms"  # a run ranked by it gets the first-token waterfall
PREPROCESS_COLOUR = "#f28e2b"  # time to first token outside the prefill: preprocessing
VISION_COLOUR = "#59a14f"
DECODER_COLOUR = "#76b7b2"  # the prefill's decoder part: prefill − vision
Split = tuple[list[tuple[float, str]], str]  # a step's change in parts (delta, colour) and the note over its bar
# The legend of the parts a waterfall's changes are split into: for a run ranked by time to first token, else decode.
FIRST_TOKEN_PARTS = {
    PREPROCESS_COLOUR: "change outside the prefill (preprocessing)",
    VISION_COLOUR: "change in vision (SAM, CLIP, projector)",
    DECODER_COLOUR: "change in the prefill's decoder part",
}
DECODE_PARTS = {
    IDLE_COLOUR: "change in idle time (launch/host overhead)",
    BUSY_COLOUR: "change in GPU-busy time (kernel work)",
}


def _decode_p50(record: WhatIfRecord, rung: Rung) -> float | None:
    f = record.figures_of(rung)
    return None if f is None or f.decode_ms_per_token is None else f.decode_ms_per_token.p50


def _ttft_p50(record: WhatIfRecord, rung: Rung) -> float | None:
    f = record.figures_of(rung)
    return None if f is None or f.ttft_ms is None else f.ttft_ms.p50


def _stage_p50(record: WhatIfRecord, rung: Rung, figure: str) -> float | None:
    """A rung's p50 of a judged figure (`vision_ms`, `prefill_ms`) per pass: its own judgement's value, or for the
    baseline any judged rung's base; None where it was judged per page (no part of a pass's first token)."""
    if rung.phase == BASELINE:
        return next((j.base for r in record.rungs if (j := r.judgement(figure)) is not None and not j.per), None)
    judged = rung.judgement(figure)
    return None if judged is None or judged.per else judged.value


def ranks_first_token(record: WhatIfRecord) -> bool:
    """The run ranks by time to first token: its waterfall and module plot follow that time, not the decode step."""
    return record.objective.name == FIRST_TOKEN_FIGURE


def waterfall_steps(record: WhatIfRecord) -> list[Rung]:
    """The rungs from the baseline to the best: baseline, the ladder up to the best rung (or the best rung alone when
    it is not on the ladder); every one with the plotted figure (decode time, or time to first token)."""
    value = _ttft_p50 if ranks_first_token(record) else _decode_p50
    base, best = record.baseline, record.best_rung
    if base is None or best is None or value(record, base) is None:
        return []
    ladder = [r for r in record.rungs if r.phase == LADDER and r.state == MEASURED]
    names = [r.name for r in ladder]
    path = ladder[: names.index(best.name) + 1] if best.name in names else [best]
    steps = [base, *(r for r in path if r.phase != BASELINE)]
    return [r for r in steps if value(record, r) is not None]


def _added(rung: Rung, previous: Rung) -> str:
    """The levers a rung adds to the previous one."""
    new = [lever for lever in rung.levers if lever not in previous.levers] or list(rung.levers)
    return "+ " + " + ".join(new)


def _decode_split(record: WhatIfRecord, rung: Rung, previous: Rung) -> Split:
    """A decode-step change split into idle (launch/host) and busy (kernel work), where the attribution has them."""
    a = rung.attribution
    if a is None or a.idle_ms is None or a.busy_ms is None:
        return [], ""
    note = f"\nidle {_signed_ms(a.idle_ms)} ms, busy {_signed_ms(a.busy_ms)} ms"
    return [(a.idle_ms, IDLE_COLOUR), (a.busy_ms, BUSY_COLOUR)], note


def _first_token_split(record: WhatIfRecord, rung: Rung, previous: Rung) -> Split:
    """A time-to-first-token change split into vision, the prefill's decoder part and the rest (preprocessing),
    from the rungs' p50s (medians do not add exactly: what they leave is drawn apart)."""
    figures = []
    for r in (previous, rung):
        ttft, vision = _ttft_p50(record, r), _stage_p50(record, r, "vision_ms")
        prefill = _stage_p50(record, r, "prefill_ms")
        if ttft is None or vision is None or prefill is None:
            return [], ""
        figures.append((ttft, vision, prefill))
    (ttft0, vision0, prefill0), (ttft1, vision1, prefill1) = figures
    d_vision = vision1 - vision0
    d_decoder = (prefill1 - prefill0) - d_vision
    d_rest = (ttft1 - ttft0) - (prefill1 - prefill0)
    parts = [(d_rest, PREPROCESS_COLOUR), (d_vision, VISION_COLOUR), (d_decoder, DECODER_COLOUR)]
    note = f"\npreprocess {_signed_ms(d_rest)}, vision {_signed_ms(d_vision)},\ndecoder {_signed_ms(d_decoder)} ms"
    return parts, note


@closes_its_figures
def waterfall(record: WhatIfRecord, path: Path) -> Path | None:
    """From the baseline through each ladder rung to the best: decode ms/token split into idle (launch/host) and busy
    (kernel work), or, for a run ranked by time to first token, that time split into preprocessing, vision and the
    prefill's decoder part. A full bar at each end, a floating bar for each change."""
    steps = waterfall_steps(record)
    if len(steps) < 2:
        return None
    first_token = ranks_first_token(record)
    value = _ttft_p50 if first_token else _decode_p50
    split = _first_token_split if first_token else _decode_split
    values = [value(record, r) or 0.0 for r in steps]
    top = max(values)
    fig, ax = pyplot().subplots(figsize=(2.2 + 1.9 * (len(steps) + 1), 5.2), layout="constrained")
    labels = ["baseline"]
    ax.bar(0, values[0], color=TOTAL_COLOUR, width=0.6)
    ax.text(0, values[0] + 0.01 * top, f"{values[0]:,.2f} ms", ha="center", va="bottom", fontsize=9)
    used: set[str] = set()
    for i in range(1, len(steps)):
        rung, before, after = steps[i], values[i - 1], values[i]
        labels.append(_added(rung, steps[i - 1]))
        parts, note = split(record, rung, steps[i - 1])
        level = before
        rest = (after - before) - sum(p for p, _ in parts)
        if abs(rest) > 0.005 * top or not parts:
            parts.append((rest, OTHER_COLOUR if parts else TOTAL_COLOUR))
        for delta, colour in parts:
            ax.bar(i, delta, bottom=level, color=colour, width=0.6, edgecolor="white", linewidth=0.5)
            used.add(colour)
            level += delta
        ax.plot([i - 1 + 0.3, i - 0.3], [before, before], color="grey", linewidth=0.8, linestyle=":")
        change = f"{_signed_ms(after - before)} ms{note}\n→ {after:,.2f} ms"
        ax.text(i, max(before, after) + 0.01 * top, change, ha="center", va="bottom", fontsize=8.5)
    last = len(steps)
    labels.append(f"best:\n{steps[-1].name}")
    ax.bar(last, values[-1], color=TOTAL_COLOUR, width=0.6)
    ax.plot([last - 1 + 0.3, last - 0.3], [values[-1], values[-1]], color="grey", linewidth=0.8, linestyle=":")
    ratio = values[0] / values[-1] if values[-1] else None
    faster = "faster" if first_token else "faster per step"
    end = f"{values[-1]:,.2f} ms" + (f"\n({ratio:,.1f}× {faster})" if ratio else "")
    ax.text(last, values[-1] + 0.01 * top, end, ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(labels)), [_wrap(label) for label in labels], fontsize=8)
    ax.set_ylim(0, top * 1.25)
    what = "time to first token" if first_token else "decode time per token"
    ax.set_ylabel(f"{what} (ms, p50 over timed passes)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    shown = "Time to first token" if first_token else "Decode ms/token"
    ranked = first_token or record.objective.name == "decode_ms_per_token"
    ranked_by = "" if ranked else f"\nthe run ranks by {record.objective.label}"
    ax.set_title(
        f"{shown} from the baseline to the best rung ({record.device or 'device not recorded'}; "
        f"{record.model}){ranked_by}",
        fontsize=10,
    )
    total = "time to first token" if first_token else "decode ms/token"
    legend = {
        TOTAL_COLOUR: total + (" (or a change the run does not split)" if TOTAL_COLOUR in used else ""),
        **(FIRST_TOKEN_PARTS if first_token else DECODE_PARTS),
        OTHER_COLOUR: "change the medians leave unsplit" if first_token else "change not split by the profiled pass",
    }
    handles = [_patch()(color=c, label=label) for c, label in legend.items() if c == TOTAL_COLOUR or c in used]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return save_figure(fig, path)


def _signed_ms(value: float) -> str:
    """`+1.20` / `−16.93` (a true minus sign)."""
    return f"{value:+,.2f}".replace("-", "\u2212")


def _wrap(label: str, width: int = 18) -> str:
    """Break a long tick label at " + " (or spaces) so that neighbouring labels do not overlap."""
    lines: list[str] = []
    for word in label.replace(" + ", " +\u00a0").split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines).replace("\u00a0", " ")


@closes_its_figures
def floor(record: WhatIfRecord, path: Path) -> Path | None:
    """One panel per stage: speed of light, summed kernels, GPU busy and wall (ms), baseline beside the best rung."""
    base, best = record.baseline, record.best_rung
    base_f = None if base is None else record.figures_of(base)
    if base_f is None or not base_f.floors:
        return None
    best_f = None if best is None else record.figures_of(best)
    best_by_stage = {f.stage: f for f in (best_f.floors if best_f else ())}
    stages = list(base_f.floors)
    fig, axes = pyplot().subplots(
        1, len(stages), figsize=(1.5 + 4.6 * len(stages), 4.8), layout="constrained", squeeze=False
    )
    best_name = record.best or "best"
    for ax, stage_floor in zip(axes[0], stages, strict=True):
        groups = [("baseline", stage_floor)]
        other = best_by_stage.get(stage_floor.stage)
        if other is not None:
            groups.append((f"best: {best_name}", other))
        width = 0.8 / len(LAYERS)
        top = max(v for _, f in groups for v in f.layers if v is not None)
        for g, (_, f) in enumerate(groups):
            for k, value in enumerate(f.layers):
                x = g + (k - (len(LAYERS) - 1) / 2) * width
                if value is None:
                    ax.text(x, 0.01 * top, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                    continue
                ax.bar(x, value, width=width * 0.95, color=LAYER_COLOURS[k])
                ax.text(x, value + 0.01 * top, f"{value:,.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(groups)), [_wrap(name, 22) for name, _ in groups], fontsize=8)
        ax.set_ylim(0, top * 1.15)
        ax.set_ylabel("ms per decode step" if stage_floor.stage.startswith("decode") else "ms per prefill")
        ax.set_title(stage_floor.stage, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles = [_patch()(color=c, label=label) for c, label in zip(LAYER_COLOURS, LAYERS, strict=True)]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(LAYERS), fontsize=8, frameon=False)
    against = "baseline vs best rung" if best_by_stage else f"baseline (the best rung, {best_name}, recorded none)"
    fig.suptitle(
        f"Distance to the floor per stage, {against} ({record.device or 'device not recorded'})\n"
        "speed of light: analytic bytes / peak bandwidth or FLOPs / peak compute; kernels and busy: profiled pass; "
        "wall: p50",
        fontsize=9,
    )
    return save_figure(fig, path)


def module_waterfall_stage(record: WhatIfRecord) -> StageModuleChanges | None:
    """The stage the module plot shows: the best rung's decode step against the baseline's, or for a run ranked by
    time to first token the prefill or vision stage it moved most (None without both runs attributed by module)."""
    best = record.best_rung
    if best is None:
        return None
    if ranks_first_token(record):
        moved = [s for s in best.modules if s.stage != vocab.DECODE_STEP]
        return max(moved, key=lambda s: abs(s.other_ms - s.base_ms), default=None)
    return next((s for s in best.modules if s.stage == vocab.DECODE_STEP), None)


def module_waterfall(record: WhatIfRecord, path: Path) -> Path | None:
    """The best rung's `module_waterfall_stage` against the baseline's, module by module."""
    stage, best = module_waterfall_stage(record), record.best_rung
    if stage is None or best is None:
        return None
    name = "Decode step" if stage.stage == vocab.DECODE_STEP else stage.stage
    return changes_waterfall(stage, f"{name} by module: baseline → {best.name}", path)


GOODPUT_COLOUR = "#e15759"  # the goodput rung
TARGET_COLOUR = "#b07aa1"


@closes_its_figures
def pages_latency(record: WhatIfRecord, path: Path) -> Path | None:
    """Pages/s against per-page p90 latency, one point per rung the goodput considered: the frontier joined, the
    latency target as a line and the goodput rung marked (None with fewer than two rungs to set apart)."""
    g = record.goodput
    if g is None or len(g.considered) < 2:
        return None
    figures = {name: r.figures for name in g.considered if (r := record.rung(name)) is not None}
    points = {name: p for name, f in figures.items() if f is not None and (p := latency_point(f, g.figure)) is not None}
    fig, ax = pyplot().subplots(figsize=(8.0, 5.2), layout="constrained")
    for name, (x, y) in points.items():
        on = name in g.frontier
        colour = GOODPUT_COLOUR if name == g.best else TOTAL_COLOUR if on else OTHER_COLOUR
        ax.scatter([x], [y], color=colour, s=46 if on else 30, zorder=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    line = [points[name] for name in g.frontier if name in points]
    ax.plot([x for x, _ in line], [y for _, y in line], color=TOTAL_COLOUR, linewidth=1.0, linestyle="--", zorder=2)
    limit = None if g.target is None else g.target.limits.get(g.figure)
    if limit is not None:
        ax.axvline(limit, color=TARGET_COLOUR, linewidth=1.0, linestyle=":")
        where = ax.get_xaxis_transform()  # x in data, y in axes fractions
        ax.text(limit, 0.02, f" target ≤ {limit:,.0f} ms", color=TARGET_COLOUR, fontsize=8, transform=where)
    ax.set_xlabel(f"{LATENCY_FIGURES[g.figure]} (ms)")
    ax.set_ylabel("pages/s (p50 over timed passes)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
    best = "" if g.best is None else f"; goodput: {g.best}"
    ax.set_title(
        f"Pages/s against per-page latency ({record.device or 'device not recorded'}; {record.model})\n"
        f"dashed: the frontier (no rung has more pages/s at a latency as low){best}",
        fontsize=10,
    )
    return save_figure(fig, path)


PLOTS = {"waterfall": waterfall, "floor": floor, "module_waterfall": module_waterfall, "pages_latency": pages_latency}


def write_whatif_plots(record: WhatIfRecord, folder: Path) -> dict[str, Path]:
    """Every what-if plot that applies, as `folder/plots/<name>.png`; returns name -> path."""
    return write_plots(PLOTS, record, folder)

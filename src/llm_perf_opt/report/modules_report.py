"""`records.modules.ModuleAttribution` (`measure.module_floors`) as Markdown and a plot, each module's time beside
its floor: report.md the largest distances per stage, `modules.md` every folded module, `plots/modules.png` bars."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.records.modules import (
    PROVENANCE_METHOD_NAME,
    UNATTRIBUTED,
    KernelSources,
    Launcher,
    ModuleAttribution,
    ModuleFloorRow,
    StageModuleChanges,
    StageModules,
)
from llm_perf_opt.records.vocabulary import DECODE_STEP
from llm_perf_opt.report.markdown import Doc, flops, num_bytes
from llm_perf_opt.report.plots import save_figure
from llm_perf_opt.report.pyplot import closes_its_figures, pyplot

REPORT_ROWS = 8  # folded modules per stage in report.md
PLOT_ROWS = 10  # bars per stage in the plot


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _rate(amount: float | None, row: ModuleFloorRow, scale: float) -> str:
    if amount is None or row.ms <= 0:
        return "—"
    return f"{amount / (row.ms / 1e3) / scale:,.1f}"


def module_row(row: ModuleFloorRow) -> dict[str, str]:
    """One folded module's cells, by column."""
    return {
        "module (folded across layers)": f"`{row.module}`",
        "type": row.module_type,
        "modules": str(row.members),
        "kernels": f"{row.kernels:,}",
        "time (ms)": f"{row.ms:,.3f}",
        "share": f"{row.share:.1%}",
        "floor (ms)": _num(row.floor_ms, ",.3f"),
        "× floor": _num(row.ratio, ",.1f") + ("×" if row.ratio is not None else ""),
        "above floor (ms)": _num(row.above_floor_ms, ",.3f"),
        "TFLOP/s": _rate(row.flops, row, 1e12),
        "GB/s": _rate(row.bytes, row, 1e9),
        "largest kernel (launched by)": f"`{row.top_kernel}`" if row.top_kernel else "—",
    }


def _per(stage: str) -> str:
    """What a stage's module times are per: a decode step (its rows are per step), else a pass."""
    return "per decode step" if stage.startswith(DECODE_STEP) else "per pass"


def stage_summary(stage: StageModules, time_kind: str) -> str:
    """One sentence: the stage's time, floor, attributed share and method."""
    per = _per(stage.stage)
    floor = f", floor {stage.floor_ms:,.3f} ms ({stage.total_ms / stage.floor_ms:,.1f}×)" if stage.floor_ms else ""
    text = (
        f"{time_kind} {stage.total_ms:,.3f} ms {per}{floor}; {stage.attributed_share:.1%} given to a module"
        f" ({', '.join(stage.methods) or 'no method applied'})"
    )
    if stage.unattributed_ms > 0:
        text += f"; {stage.unattributed_ms:,.3f} ms unattributed: {stage.unattributed_reason}"
    return text + "."


def _method_para(a: ModuleAttribution) -> str:
    floors = (
        f"Floor = {a.floors}, of the analytic ops placed on the module."
        if a.floors
        else "No floors: no analytic model for this model or no peak known for this device."
    )
    fused = (
        " In compiled code a kernel fused from several modules' operations goes to their closest common ancestor "
        "(e.g. `layers` for one that fuses the end of a layer with the start of the next)."
        if any(PROVENANCE_METHOD_NAME in s.methods for s in a.stages)
        else ""
    )
    return (
        f"Each kernel of the profiled pass is given to the innermost module whose forward launched it "
        f"({a.time_kind}; module ranges opened by forward hooks in the profiled pass only, never in a timed pass). "
        f"Rows fold the same module across layers (`layers.*`); sorted by time above the floor. {floors}{fused} "
        + " ".join(a.method_notes)
    )


def _launcher_text(s: Launcher, share: float) -> str:
    operator = s.operator or "no operator (graph replay or compiled code)"
    where = "outside every module" if s.module == UNATTRIBUTED else f"`{s.module}`"
    return f"{operator} in {where} ({share:.0%})"


def launched_by(sources: KernelSources | None, shown: int = 2) -> str:
    """ "aten::copy_ in `model.layers.*.attn` (64%), aten::add in `…` (20%)": the operators and (folded) modules
    that launched a kernel, with their share of its time in the profiled pass; `NOT_KNOWN`-like text without one."""
    if sources is None or not sources.launchers:
        return "not in the profiled pass's stages"
    pairs = sources.shares()
    text = ", ".join(_launcher_text(s, share) for s, share in pairs[:shown])
    rest = 1.0 - sum(share for _, share in pairs[:shown])
    return text + (f", others {rest:.0%}" if rest >= 0.005 else "")


def module_table(doc: Doc, rows: Sequence[ModuleFloorRow]) -> None:
    """The folded modules' table: time beside floor, rates and the largest kernel."""
    doc.keyed_table([module_row(r) for r in rows])


def modules_section(doc: Doc, a: ModuleAttribution, plot: str | None) -> None:
    """report.md: per stage, the modules furthest above their floor."""
    doc.h2("Where each stage's time goes, by module")
    doc.para(_method_para(a) + " Every module: [modules.md](modules.md).")
    for stage in a.stages:
        if not stage.rows:
            continue
        doc.h3(stage.stage)
        doc.para(stage_summary(stage, a.time_kind))
        module_table(doc, stage.rows[:REPORT_ROWS])
    if plot:
        doc.image("Module time against module floor, per stage", plot)


def modules_md(a: ModuleAttribution, title: str) -> str:
    """modules.md: every folded module of every stage."""
    doc = Doc(f"Modules: {title}")
    doc.para(_method_para(a))
    for stage in a.stages:
        doc.h2(stage.stage)
        doc.para(stage_summary(stage, a.time_kind))
        priced = [r for r in stage.rows if r.flops is not None]
        if priced:
            doc.para(
                f"Analytic work placed on these modules: {flops(sum(r.flops or 0 for r in priced))} FLOPs, "
                f"{num_bytes(sum(r.bytes or 0 for r in priced))} per forward."
            )
        module_table(doc, stage.rows)
    return doc.text()


def _short(module: str, width: int = 48) -> str:
    return module if len(module) <= width else "…" + module[-(width - 1) :]


@closes_its_figures
def modules_plot(a: ModuleAttribution, path: Path) -> Path | None:
    """Horizontal bars per stage: each module's time per forward, its floor drawn over it."""
    stages: Sequence[StageModules] = [s for s in a.stages if s.rows and s.total_ms > 0]
    if not stages:
        return None
    heights = [min(len(s.rows), PLOT_ROWS) for s in stages]
    fig, axes = pyplot().subplots(
        len(stages),
        1,
        figsize=(10, 1.0 + sum(0.32 * h + 1.1 for h in heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": [h + 2 for h in heights]},
        layout="constrained",
    )
    for ax, stage in zip(axes[:, 0], stages, strict=True):
        rows = list(stage.rows[:PLOT_ROWS])
        names = [_short(r.module) for r in rows]
        ax.barh(names, [r.ms for r in rows], color="#4e79a7", label="measured")
        floors = [r.floor_ms or 0.0 for r in rows]
        if any(floors):
            ax.barh(names, floors, color="none", edgecolor="#e15759", hatch="///", label="floor (speed of light)")
        for y, row in enumerate(rows):
            ratio = f"  {row.ratio:,.1f}×" if row.ratio else ""
            ax.text(row.ms, y, f" {row.ms:,.2f} ms{ratio}", va="center", fontsize=7)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlim(0, max(max(r.ms for r in rows), max(floors)) * 1.35)
        per = _per(stage.stage)
        order = "time above floor" if any(floors) else "time"
        ax.set_title(f"{stage.stage}: {a.time_kind} by module, {per} (sorted by {order})", fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)


def changes_table(doc: Doc, changes: StageModuleChanges) -> None:
    """A stage's change by module: the largest moves, then the rest, adding up to the stage's change."""
    per = _per(changes.stage)
    doc.para(
        f"{changes.stage}: {changes.base_ms:,.3f} → {changes.other_ms:,.3f} ms {per} "
        f"({changes.other_ms - changes.base_ms:+,.3f} ms)."
    )
    rows = [
        [f"`{c.module}`", f"{c.base_ms:,.3f}", f"{c.other_ms:,.3f}", f"{c.delta_ms:+,.3f}"] for c in changes.changes
    ]
    rows.append(["the rest (other modules, unattributed)", "", "", f"{changes.rest_delta_ms:+,.3f}"])
    doc.table(["module", "baseline (ms)", "this rung (ms)", "change (ms)"], rows)


@closes_its_figures
def changes_waterfall(changes: StageModuleChanges, title: str, path: Path) -> Path | None:
    """A waterfall from the baseline's stage time to the other run's, one bar per moved module."""
    steps = [(_short(c.module, 40), c.delta_ms) for c in changes.changes]
    steps.append(("the rest", changes.rest_delta_ms))
    if changes.base_ms <= 0:
        return None
    fig, ax = pyplot().subplots(figsize=(10, 1.6 + 0.34 * (len(steps) + 2)), layout="constrained")
    labels = ["baseline", *[name for name, _ in steps], "this rung"]
    level = changes.base_ms
    ax.barh(0, level, color="#4e79a7")
    for y, (_, delta) in enumerate(steps, 1):
        ax.barh(y, delta, left=level, color="#e15759" if delta > 0 else "#59a14f")
        ax.text(max(level, level + delta), y, f" {delta:+,.3f} ms", va="center", fontsize=7)
        level += delta
    ax.barh(len(steps) + 1, changes.other_ms, color="#4e79a7")
    ax.text(changes.base_ms, 0, f" {changes.base_ms:,.3f} ms", va="center", fontsize=7)
    ax.text(changes.other_ms, len(steps) + 1, f" {changes.other_ms:,.3f} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return save_figure(fig, path)

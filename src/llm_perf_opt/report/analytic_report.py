"""The analytic report's Markdown (`static_analysis/analytic_model/report.md`) from its record."""

from __future__ import annotations

from collections.abc import Sequence

from llm_perf_opt.records.analytic import AnalyticReport, RunInputs, StageBound, ViewsPrice, WorkloadRow
from llm_perf_opt.records.vocabulary import DECODE, PREFILL
from llm_perf_opt.report.markdown import Doc, flops, ms, num_bytes, number, pct


def views_text(w: WorkloadRow) -> str:
    """The page's views in words: OCR-2's tile count, or v1's mode and crop grid."""
    if w.mode is None:
        return f"global view {w.global_size} px + {w.tiles} tiles of {w.tile_size} px"
    if w.tiles and w.crop_grid:
        across, down = w.crop_grid
        return f"mode {w.mode}: global view {w.global_size} px + {across}x{down} tiles of {w.tile_size} px"
    return f"mode {w.mode}: one {w.global_size} px view, no tiles"


def _bound(b: StageBound) -> str:
    return f"{ms(b.speed_of_light_ms, 2)} ({b.bound[0]})"


def _intro(doc: Doc, r: AnalyticReport) -> None:
    w = r.workload
    if r.run is None:
        doc.para(
            f"Priced from the config alone (no weights). Workload: 1 page, {views_text(w)} → {w.image_tokens} image "
            f"tokens, prompt {w.prompt_tokens} tokens, {w.new_tokens} new tokens, {w.dtype}. {r.conventions}."
        )
        return
    count = len(r.run.inputs)
    inputs = "the input this run measured, as it ran" if count == 1 else f"the {count} inputs this run measured"
    summed = "" if count == 1 else " The stage, GPU, category and module tables are their sum over one pass each."
    doc.para(f"Priced from the config and {inputs} (no weights), {w.dtype}.{summed} {r.conventions}.")
    _inputs_section(doc, r.run)


def _inputs_section(doc: Doc, run: RunInputs) -> None:
    """Each input of the run: its views and tokens, its prefill and decode cost and lower bounds."""
    doc.h2(f"Inputs of this run (lower bounds on {run.gpu})")
    doc.keyed_table(
        [
            {
                "input": i.image,
                "views": views_text(i.workload),
                "image tokens": str(i.workload.image_tokens),
                "prompt tokens": str(i.workload.prompt_tokens),
                "new tokens": str(i.workload.new_tokens),
                "prefill matmul FLOPs": flops(i.stages[PREFILL].matmul_flops),
                "prefill bytes": num_bytes(i.stages[PREFILL].bytes),
                "decode matmul FLOPs": flops(i.stages[DECODE].matmul_flops),
                "decode bytes": num_bytes(i.stages[DECODE].bytes),
                "prefill lower-bound ms": _bound(i.bounds[PREFILL]),
                "decode lower-bound ms": _bound(i.bounds[DECODE]),
            }
            for i in run.inputs
        ]
    )


def _sweep_section(doc: Doc, r: AnalyticReport) -> None:
    """The what-if over the page's views: tile counts (OCR-2) or modes and crop grids (v1)."""
    rows: list[tuple[str, ViewsPrice]]
    if r.mode_sweep is not None:
        doc.h2(f"What-if: resolution modes and Gundam crop grids (prefill on {r.mode_sweep.gpu})")
        first = "mode"
        rows = [(t.label + (" (this workload)" if t.configured else ""), t.price) for t in r.mode_sweep.rows]
    elif r.tile_sweep is not None:
        doc.h2(f"What-if: tiles per page (prefill on {r.tile_sweep.gpu})")
        first = "tiles"
        rows = [(str(t.tiles), t.price) for t in r.tile_sweep.rows]
    else:
        return
    if r.run is not None:
        doc.para(f"Views varied around the run's input {r.run.inputs[0].image}, with its prompt and new tokens.")
    doc.keyed_table(
        [
            {
                first: label,
                "image tokens": str(p.image_tokens),
                "prompt tokens": str(p.prompt_tokens),
                "vision FLOPs": flops(p.vision_flops),
                "prefill matmul FLOPs": flops(p.prefill_flops),
                "prefill bytes": num_bytes(p.prefill_bytes),
                "lower-bound ms": ms(p.prefill_speed_of_light_ms, 2),
            }
            for label, p in rows
        ]
    )


def analytic_report_md(r: AnalyticReport, top_modules: int = 30) -> str:
    """The report: the workload (or the run's inputs), per-stage costs, lower bounds per GPU, the view what-if,
    operator categories and the top modules of prefill and decode."""
    profile = r.workload_profile
    doc = Doc(f"Analytic model: {r.model}" + (f" — workload {profile['name']}" if profile else ""))
    _intro(doc, r)
    doc.h2("Per stage")
    doc.keyed_table(
        [
            {
                "stage": s,
                "matmul FLOPs": flops(v.matmul_flops),
                "other FLOPs (est.)": flops(v.non_matmul_flops),
                "weights read": num_bytes(v.weight_bytes),
                "activations": num_bytes(v.activation_bytes),
                "KV cache": num_bytes(v.kv_bytes),
                "bytes": num_bytes(v.bytes),
                "FLOP/byte": number(v.intensity),
            }
            for s, v in r.stages.items()
        ]
    )
    doc.h2("What-if: lower-bound time per stage (ms) on each GPU")
    doc.para(
        "max(matmul FLOPs / dense peak, bytes / bandwidth), datasheet peaks from hardware/gpus.yaml; "
        "(c) compute-bound, (m) memory-bound."
    )
    stages: Sequence[str] = list(r.stages)
    doc.table(
        ["GPU", "dense TFLOP/s", "GB/s", *stages],
        [
            [g.gpu, f"{g.dense_tflops:,.1f}", f"{g.bandwidth_gbps:,.0f}", *[_bound(g.stages[s]) for s in stages]]
            for g in r.what_if
        ],
    )
    _sweep_section(doc, r)
    doc.h2("Operator categories (share of each stage's FLOPs and bytes)")
    doc.table(
        ["stage", "category", "FLOPs", "share of FLOPs", "bytes", "share of bytes"],
        [
            [stage, c.category, flops(c.flops), pct(c.share_of_flops), num_bytes(c.bytes), pct(c.share_of_bytes)]
            for stage, cats in r.categories.items()
            for c in cats
        ],
    )
    for stage, rows in r.modules.items():
        doc.h2(f"Modules of {stage} (top {top_modules} by FLOPs, layers grouped)")
        doc.table(
            ["module", "category", "calls", "FLOPs", "share", "weights", "activations", "KV cache"],
            [
                [
                    f"`{m.module}`",
                    m.category,
                    str(m.calls),
                    flops(m.flops),
                    pct(m.share_of_flops),
                    *(num_bytes(b) for b in (m.weight_bytes, m.activation_bytes, m.kv_bytes)),
                ]
                for m in rows[:top_modules]
            ],
        )
    return doc.text()

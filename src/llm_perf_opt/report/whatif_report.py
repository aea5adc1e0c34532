"""`whatif.md` and its plots: a `WhatIfRecord` rendered as Markdown. Every figure comes from the record; this module
ranks rungs for display and formats them, nothing more."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence

import attrs

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.measure.outputs import near_tie_text, share_text
from llm_perf_opt.measure.whatif_objectives import (
    ABSOLUTE_CHANGE,
    ENERGY,
    FIGURES,
    OUTPUTS,
    percent_digits,
    signed_amount,
)
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import REPORT_FILE
from llm_perf_opt.records.modules import StageModuleChanges
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    HYDRA_LAUNCHER,
    INTERRUPTED,
    LADDER,
    LOCAL_LAUNCHER,
    MEASURED,
    NOT_JUDGED,
    WORKLOAD,
    Judgement,
    Objective,
    OutputAgreement,
    Rung,
    RungFigures,
    Speedup,
    StepFloor,
    WhatIfRecord,
    hydra_launcher_name,
)
from llm_perf_opt.report.markdown import (
    NA,
    Doc,
    bundled_samples,
    flops,
    link,
    ms,
    num_bytes,
    number,
    pct,
    present,
    ratio_text,
    time_budget_text,
    write_markdown,
)
from llm_perf_opt.report.modules_report import changes_table, module_table, stage_summary
from llm_perf_opt.report.whatif_goodput import goodput_section
from llm_perf_opt.report.whatif_plots import module_waterfall_stage, ranks_first_token, write_whatif_plots
from llm_perf_opt.report.whatif_predictions import predictions_section

WHATIF_REPORT = "whatif.md"
CHANGES_WORKLOAD = "changes the workload"

Row = list[str]

# A machine's own absolute paths, kept out of whatif.md: the bundled samples folder becomes the resolver that names
# it (`bundled_samples`), any other absolute path its last two parts.
ABSOLUTE_PATH = re.compile(r"(?<![\w.$}~])/(?:[^\s/,'\"\[\]]+/)+[^\s/,'\"\[\]]+")
# The objectives of the per-objective table, in order (keys of `Judgement.objective`).
OBJECTIVE_COLUMNS = tuple(f.name for f in FIGURES)


# --------------------------------------------------------------------------------------------- cells


def clean_paths(text: str) -> str:
    """`text` without machine-specific absolute paths: `${llo_samples_dir:}` for the bundled samples folder, e.g.
    `${llo_samples_dir:}/lists/a4_page.txt`; `…/lists/a4_page.txt` (the last two parts) for any other."""
    return ABSOLUTE_PATH.sub(lambda m: "…/" + "/".join(m.group(0).rsplit("/", 2)[-2:]), bundled_samples(text))


def _signed(value: float | None, fmt: Callable[[float], str]) -> str:
    """A change with its sign (`+`, `−`, or none for 0), the magnitude formatted by `fmt`."""
    if value is None:
        return NA
    sign = "+" if value > 0 else "−" if value < 0 else ""
    return sign + fmt(abs(value))


def _objective_value(objective: Objective, figures: RungFigures | None) -> str:
    return NA if figures is None else f"{ms(figures.objective.p50, 2)} {objective.unit}"


def speedup_text(s: Speedup | None) -> str:
    """`1.34× (95% CI 1.30–1.38×)`, or the ratio alone without an interval."""
    if s is None:
        return NA
    if s.ci95_low is None or s.ci95_high is None:
        return ratio_text(s.value)
    return f"{ratio_text(s.value)} (95% CI {s.ci95_low:.2f}–{s.ci95_high:.2f}×)"


def outputs_text(o: OutputAgreement | None) -> str:
    """How a rung's outputs compare with the baseline's, in a few words."""
    if o is None:
        return NA
    inputs = f"{o.inputs} input{'s' if o.inputs != 1 else ''}"
    if o.identical:
        text = f"identical for {o.compared_tokens} tokens ({inputs})"
    else:
        text = f"depart at token {o.first_departure} of {o.compared_tokens} ({inputs})"
        if o.near_tie is not None:
            text += f", at {near_tie_text(o.near_tie)}"
    if o.prefill_logits_max_abs_diff is not None:
        text += f"; logits max |Δ| {o.prefill_logits_max_abs_diff:.3g}"
    return text


def _levers_text(rung: Rung) -> str:
    if rung.phase == BASELINE:
        return "none (the workload as given)"
    overrides = ", ".join(f"`{o}`" for o in rung.overrides)
    text = " + ".join(rung.levers) + (f" ({overrides})" if overrides else "")
    return text + (f"; **{CHANGES_WORKLOAD}**" if rung.changes_workload else "")


def _warmup_text(f: RungFigures) -> str:
    compiled = "no compilation" if f.compile_ms is None else f"compile {f.compile_ms / 1e3:,.1f} s"
    return f"{compiled}; {f.warmup_passes} warm-up pass{'es' if f.warmup_passes != 1 else ''}"


def _wall_text(rung: Rung) -> str:
    if rung.reused is not None:
        return f"not rerun (= {rung.reused})"
    return NA if rung.wall_s is None else f"{rung.wall_s:,.0f} s"


def _state_line(rung: Rung) -> str:
    return clean_paths(f"{rung.state}: {rung.reason or 'no reason recorded'}")


def judgement_text(j: Judgement | None) -> str:
    """One objective's cell: "−91% better", "+130% worse", "+1% within noise", "per page −75% better", "not
    judged", n/a."""
    if j is None:
        return NA
    if j.verdict == NOT_JUDGED:
        return "not judged"
    if j.objective == "outputs":
        return f"{j.verdict}: {j.why}" if j.why else j.verdict
    if j.objective in ABSOLUTE_CHANGE and j.base is not None and j.value is not None:
        change = f"{signed_amount(j.value - j.base)} {j.unit}"
    elif j.change is not None:
        change = _signed(j.change, lambda v: pct(v, percent_digits(j.change or 0.0)))
    else:
        change = NA
    per = f"per {j.per} " if j.per else ""  # judged per page: the column's pass time over the pass's pages
    return f"{per}{change} {j.verdict}"


# --------------------------------------------------------------------------------------------- order


def ranked_rungs(record: WhatIfRecord) -> list[Rung]:
    """Baseline first, then the ladder in its order, then each lever alone by speed-up (best first); the rungs
    that were not measured (or were interrupted) last, in the order they were tried."""
    measured = [r for r in record.rungs if r.state == MEASURED]
    alone = sorted((r for r in measured if r.phase == ALONE), key=lambda r: -(r.speedup.value if r.speedup else 0.0))
    return [
        *(r for r in measured if r.phase == BASELINE),
        *(r for r in measured if r.phase == LADDER),
        *alone,
        *(r for r in record.rungs if r.state != MEASURED),
    ]


def _batched(record: WhatIfRecord) -> bool:
    return any((f := record.figures_of(r)) is not None and f.batch_size > 1 for r in record.rungs)


# --------------------------------------------------------------------------------------------- sections


def verdict_paragraph(record: WhatIfRecord) -> str:
    """The paragraph at the top: the best rung against the baseline, its interval, its outputs."""
    base, best = record.baseline, record.best_rung
    objective = record.objective
    base_figures = None if base is None else record.figures_of(base)
    if base is None or base_figures is None or base.state != MEASURED:
        reason = f": {base.reason}" if base is not None and base.reason else ""
        measured = "interrupted" if base is not None and base.state == INTERRUPTED else "not measured"
        return f"The baseline was {measured}{reason}. Without it no lever can be judged."
    where = f"Measured on {record.device_phrase}: every figure is from these runs, not an estimate."
    best_figures = None if best is None else record.figures_of(best)
    if best is None or best_figures is None:
        if (unjudged := record.unjudged_levers()) and not any(v.judged for v in record.verdicts):
            return (
                f"No lever is called helped or best: {single_pass_text(record, unjudged)}; the baseline measured "
                f"{_objective_value(objective, base_figures)}. {where}"
            )
        return (
            f"No rung beat the baseline ({_objective_value(objective, base_figures)}) with its outputs checked; "
            f"the verdicts below say why for each lever. {where}"
        )
    s = best.speedup
    interval = ""
    if s is not None and s.ci95_low is not None and s.ci95_high is not None:
        interval = f" (95% interval {s.ci95_low:.2f}–{s.ci95_high:.2f}×; {s.verdict})"
    elif s is not None:
        interval = f" ({s.verdict})"
    text = (
        f"Best: **{best.name}** ({' + '.join(best.levers) or 'no lever'}) — {objective.label} "
        f"{_objective_value(objective, base_figures)} at baseline → {_objective_value(objective, best_figures)}, "
        f"{ratio_text(s.value if s else None)} the baseline{interval}. "
    )
    if best.outputs is not None:
        text += f"Outputs against the baseline: {outputs_text(best.outputs)}. "
    else:
        text += "Outputs were not compared with the baseline. "
    if best.changes_workload:
        text += (
            f"This rung {CHANGES_WORKLOAD}: its time is for different work, so check its outputs before adopting it. "
        )
    if best.tradeoffs:
        text += f"**Trade-off**: {'; '.join(best.tradeoffs)}. "
    return text + where


def single_pass_text(record: WhatIfRecord, levers: Sequence[str]) -> str:
    """Why `levers` were not judged: their figures, and the baseline's, are too few passes for an interval."""
    passes = sorted({f.objective.n for r in record.rungs if (f := record.figures_of(r)) is not None})
    counts = " or ".join(str(n) for n in passes)
    kind = "single passes" if passes == [1] else f"{counts} timed pass(es) each"
    return (
        f"the figures of {', '.join(levers)} and of the baseline are {kind}, too few for a 95% interval and a noise "
        "verdict (≥ 3 passes per side; run.repeats=3 or more), so their ratios are single measurements, not gains"
    )


def _header(doc: Doc, record: WhatIfRecord) -> None:
    o = record.objective
    overrides = ", ".join(f"`{clean_paths(w)}`" for w in record.workload_overrides) or "none (the defaults)"
    pages = ""
    if record.decode_tokens is not None:
        pages = f" · whole pages judged at {record.decode_tokens} decode tokens ({record.decode_tokens_source or '?'})"
    budget = "" if record.memory_budget_gib is None else f" · memory budget {record.memory_budget_gib:g} GiB"
    doc.para(
        f"Run `{record.run_id}` · {record.model} ({record.weights or 'weights not recorded'} weights) · "
        f"{record.device or 'device not recorded'} · preset `{record.preset}` · objective: {o.label} "
        f"({'higher' if o.higher_is_better else 'lower'} is better){pages}{budget} · workload overrides: "
        f"{overrides} · created {record.created}."
    )
    if (time_budget := time_budget_text(record.time_budget)) is not None:
        doc.para(time_budget)


def launcher_text(record: WhatIfRecord) -> str | None:
    """How the rungs ran (None for a record that does not say)."""
    if record.launcher == LOCAL_LAUNCHER:
        text = (
            "How the rungs ran: each its own `stage1-run` process, started by perf-whatif (`whatif_run.launcher=local`)"
        )
        if len(record.devices) <= 1:
            return text + "."
        return (
            f"{text}, up to {len(record.devices)} at a time, one per device ({', '.join(record.devices)}; "
            "`whatif_run.devices`). Rungs that ran at the same time shared this host's CPU cores, so the figures the "
            "host paces (preprocessing on the CPU, eager decode steps, compile time) carry that load; for figures "
            "to quote, run the rungs one at a time (`whatif_run.devices=null`)."
        )
    if record.launcher != HYDRA_LAUNCHER:
        return None
    name = hydra_launcher_name(record.launcher_overrides)
    settings = ", ".join(f"`{o}`" for o in record.launcher_overrides) or "no launcher overrides"
    text = (
        f"How the rungs ran: one `stage1-run -m` multirun per phase through Hydra's {name} launcher ({settings}), "
        "each rung's levers a config of the sweep."
    )
    if name == "basic":
        text += " The basic launcher runs the jobs one after the other in one process."
    elif name.startswith("joblib"):
        text += " joblib reuses its worker processes, so one process may run several rungs in turn."
    return (
        text + " A job that finds its process already used resets torch.compile's caches and the CUDA allocator's "
        "cache and peak counters first, and leaves out the host peak memory and its inputs' first passes."
    )


def _ranked_table(doc: Doc, record: WhatIfRecord) -> None:
    batched = _batched(record)
    energy = _joules_per_token(record)
    header = [
        "rung", "phase", "levers (overrides)", "TTFT p50 (ms)", "decode p50 (ms/token)", "pages/s",
        *(["aggregate decode tokens/s"] if batched else []), "speed-up vs baseline", "noise verdict", "kernels/step",
        "GPU busy (decode)", "outputs vs baseline", "peak memory", *(["J per decode token"] if energy else []),
        "compile / warm-up", "rung wall time", "trade-offs",
    ]  # fmt: skip
    rows: list[Row] = []
    for rung in ranked_rungs(record):
        head = [f"**{rung.name}**" if rung.name == record.best else rung.name, rung.phase, _levers_text(rung)]
        f = record.figures_of(rung)
        if f is None:
            rows.append([*head, _state_line(rung), *["—"] * (len(header) - 4)])
            continue
        judged = rung.state == MEASURED  # an interrupted rung shows the passes it measured, unjudged
        base = rung.phase == BASELINE and judged
        against = "1.00× (reference)" if base else speedup_text(rung.speedup) if judged else _state_line(rung)
        rows.append(
            [
                *head,
                ms(f.ttft_ms.p50 if f.ttft_ms else None, 1),
                ms(f.decode_ms_per_token.p50 if f.decode_ms_per_token else None, 2),
                ms(f.pages_per_s, 2),
                *([ms(f.aggregate_decode_tokens_per_s, 0)] if batched else []),
                against,
                "reference" if base else (rung.speedup.verdict if rung.speedup else NA),
                number(f.kernels_per_step, 0),
                pct(f.gpu_busy_fraction, 0),
                "reference" if base else outputs_text(rung.outputs),
                num_bytes(f.peak_memory_bytes),
                *([ms(energy.get(rung.name), 3)] if energy else []),
                _warmup_text(f),
                _wall_text(rung),
                "; ".join(([f"no change: {rung.no_change}"] if rung.no_change else []) + list(rung.tradeoffs)) or "—",
            ]
        )
    doc.table(header, rows)
    doc.para(
        f"Ranked: baseline, then the ladder (the levers that helped, added one at a time in order of measured gain, "
        "then those whose objective moved within noise while a part of it, such as vision or prefill within the first "
        "token, gained beyond noise), "
        f"then each lever alone by speed-up, then the rungs that did not run. Speed-up: the baseline's "
        f"{record.objective.label} over the rung's (above 1 is better), with the 95% interval of the ratio over the "
        "timed passes; noise verdict: whether the two runs' 95% intervals are apart. Kernels/step and GPU busy come "
        "from one profiled pass; peak memory is the largest over the timed passes. Rung wall time: the rung's process "
        "from its start to its end; consecutive rungs may share a few seconds (`whatif_run.overlap_rungs`), so the "
        "rungs' times can add up to more than the run's. Trade-offs: a gain with a loss beyond noise on another "
        "objective, or a peak memory over the budget or far above the baseline's."
    )


def _joules_per_token(record: WhatIfRecord) -> dict[str, float]:
    """Each rung's joules per decode token (the energy pass), from the per-objective verdicts; {} when no rung's
    energy was measured."""
    baseline = next((r.name for r in record.rungs if r.phase == BASELINE), BASELINE)
    out: dict[str, float] = {}
    for rung in record.rungs:
        j = rung.judgement(ENERGY.name)
        if j is not None and j.value is not None:
            out[rung.name] = j.value
        if j is not None and j.base is not None:
            out.setdefault(baseline, j.base)
    return out


def _goal_value(value: float | None, unit: str) -> str:
    if value is None:
        return NA
    return f"{value:,.2f} {unit}" if unit != "ms" else f"{value:,.1f} ms"


def goals_lines(record: WhatIfRecord) -> list[str]:
    """One line per goal: its best rung and value, or why there is none."""
    return [
        f"{c.label}: none ({c.why})"
        if c.rung is None
        else f"{c.label}: **{c.rung}**, {_goal_value(c.value, c.unit)} ({c.why})"
        for c in record.best_per_goal
    ]


def _goals(doc: Doc, record: WhatIfRecord) -> None:
    """The best rung per goal and the trade-off frontier (records written before them: nothing)."""
    if not record.best_per_goal:
        return
    doc.h3("Best rung per goal")
    doc.bullets(goals_lines(record))
    if record.frontier:
        doc.para(
            f"Trade-off frontier: {', '.join(record.frontier)} — no other rung is as good or better on every goal "
            "(whole-page latency, first token, pages/s, peak memory) and better on one; a figure within noise of "
            "the baseline counts as the baseline's. Workload-changing rungs are left out of both."
        )


def _objective_notes(rungs: Sequence[Rung], keep: Callable[[Judgement], bool]) -> list[str]:
    """ "figure: why" once where every rung gives the same reason, else once per rung ("figure (rung): why")."""
    by_label: dict[str, dict[str, list[str]]] = {}
    for rung in rungs:
        for j in rung.judgements:
            if keep(j) and j.why:
                by_label.setdefault(j.label, {}).setdefault(j.why, []).append(rung.name)
    lines = []
    for label, whys in by_label.items():
        if len(whys) == 1:
            lines.append(f"{label}: {next(iter(whys))}")
        else:
            lines += [f"{label} ({', '.join(names)}): {why}" for why, names in whys.items()]
    return sorted(lines)


def _objectives_table(doc: Doc, record: WhatIfRecord) -> None:
    """Every objective of every rung against the baseline: the change and its verdict."""
    doc.h2("Every objective against the baseline")
    judged = [r for r in ranked_rungs(record) if r.judgements and r.state == MEASURED]
    if not judged:
        doc.para(
            "Not judged per objective: this record holds no per-objective verdicts (written before them, or no "
            "rung was measured besides the baseline). `python -m llm_perf_opt.pipeline.whatif_judge <folder>` "
            "judges a what-if folder's rungs from their run folders."
        )
        return
    # a column is headed by its figure as measured (a cell judged per page says so itself)
    labels = {f.name: f.label for f in FIGURES} | {
        j.objective: j.label for r in judged for j in r.judgements if not j.per
    }
    columns = [c for c in OBJECTIVE_COLUMNS if any(r.judgement(c) is not None for r in judged)]
    rows = [[r.name, *(judgement_text(r.judgement(c)) for c in columns)] for r in judged]
    doc.table(["rung", *(labels[c] for c in columns)], rows)
    reasons = _objective_notes(judged, lambda j: j.verdict == NOT_JUDGED)
    # outputs' verdict and reason are in the table's own column
    how = _objective_notes(judged, lambda j: j.verdict != NOT_JUDGED and j.objective != OUTPUTS.name)
    doc.para(
        "Change of the rung's p50 against the baseline's (one value per rung for peak memory, compile time, the "
        "first-pass extra, the memory pass and energy), better or worse only beyond the noise: the two runs' 95% "
        "intervals apart over their timed passes, or beyond the stated threshold for one-value figures."
        + _outputs_rule(record)
    )
    notes = [clean_paths(line) for line in how]
    notes += [clean_paths(f"not judged — {line}") for line in reasons]
    if notes:
        doc.bullets(notes)


def _outputs_rule(record: WhatIfRecord) -> str:
    """How outputs were judged beside identical tokens: a departure at one of the baseline's near-ties ("" without a
    tolerance, or in a record written before it)."""
    if record.near_tie_tolerance is None:
        return ""
    return (
        " Outputs are the same when every generated token is identical, or when they depart only where the baseline's "
        f"own top two candidates were within {share_text(record.near_tie_tolerance)} of its top logit and the rung "
        "took the other one (a near-tie, `whatif_run.near_tie_tolerance`; no token after a departure is compared)."
    )


def _attribution_table(doc: Doc, record: WhatIfRecord) -> None:
    rows: list[Row] = [
        [
            rung.name,
            a.against,
            *(_signed(v, lambda v: ms(v, 2)) for v in (a.wall_ms, a.idle_ms, a.busy_ms)),
            _signed(a.kernels_per_step, lambda v: f"{v:,.0f}"),
            _signed(a.flops_per_step, flops),
            _signed(a.bytes_per_step, num_bytes),
            a.cause,
        ]
        for rung in ranked_rungs(record)
        if (a := rung.attribution) is not None and rung.state == MEASURED
    ]
    doc.h2("Where each gain came from (decode, per step)")
    doc.table(
        ["rung", "against", "Δ wall (ms/step)", "Δ idle: launch/host (ms/step)", "Δ busy: kernel work (ms/step)",
         "Δ kernels/step", "Δ FLOPs/step", "Δ bytes/step", "cause"],
        rows,
    )  # fmt: skip
    doc.para(
        "Against the baseline for a lever alone, against the previous rung for the ladder. Idle is wall time minus "
        "GPU-busy time (kernel launches, Python, synchronisation); busy is the union of the kernels' intervals. "
        "Negative is saved. FLOPs are counted on the modules, bytes from the analytic model."
    )


def _floor_rows(label: str, floor: StepFloor) -> Row:
    def share(value: float | None) -> str:
        return pct(value / floor.wall_ms, 0) if value is not None and floor.wall_ms else NA

    # each layer in ms, then each below the wall as a share of it
    return [floor.stage, label, *(ms(v, 2) for v in floor.layers), *(share(v) for v in floor.layers[:-1])]


def _removed_row(base: StepFloor, best: StepFloor) -> Row:
    *gone, wall_gone = (
        NA if a is None or b is None else _signed(b - a, lambda v: ms(v, 2))
        for a, b in zip(base.layers, best.layers, strict=True)
    )
    wall = _signed((best.wall_ms - base.wall_ms) / base.wall_ms, lambda v: pct(v, 0)) if base.wall_ms else NA
    return [base.stage, "change (best − baseline)", *gone, f"{wall_gone} ({wall})", "", "", ""]


def floor_pairs(record: WhatIfRecord) -> list[tuple[StepFloor, StepFloor | None]]:
    """(baseline, best) floors of each stage the baseline recorded; best is None when it has none for the stage."""
    base = record.baseline
    base_f = None if base is None else record.figures_of(base)
    best = record.best_rung
    best_f = None if best is None else record.figures_of(best)
    best_by_stage = {f.stage: f for f in (best_f.floors if best_f else ())}
    return [(f, best_by_stage.get(f.stage)) for f in (base_f.floors if base_f else ())]


def _floor_table(doc: Doc, record: WhatIfRecord) -> None:
    doc.h2("Distance to the floor")
    pairs = floor_pairs(record)
    if not pairs:
        doc.para("n/a: the baseline recorded no per-stage floors (no analytic model or no profiled pass).")
        return
    best = record.best or "best rung"
    rows: list[Row] = []
    for base, top in pairs:
        rows.append(_floor_rows("baseline", base))
        if top is not None:
            rows += [_floor_rows(best, top), _removed_row(base, top)]
    doc.table(
        ["stage", "rung", "speed of light (ms)", "summed kernels (ms)", "GPU busy (ms)", "wall (ms)",
         "speed of light / wall", "kernels / wall", "busy / wall"],
        rows,
    )  # fmt: skip
    if record.best is not None and all(top is None for _, top in pairs):
        doc.para(f"The best rung ({record.best}) recorded no floors: the baseline alone is shown.")
    doc.para(
        "Per decode step and per prefill, from the floor up: speed of light (analytic bytes over peak bandwidth, or "
        "FLOPs over peak compute, whichever is longer), the kernels' summed durations and the GPU-busy time (one "
        "profiled pass), and the wall time (p50 over the timed passes). Wall − busy is launch and host overhead; "
        "busy − speed of light is what faster kernels could still win."
    )


def _held(doc: Doc, record: WhatIfRecord, rung_folders: Collection[str] | None) -> None:
    """What holds the best rung (else the baseline) by module: per stage, the modules furthest above their floor;
    `rung_folders`: see `whatif_md`."""
    shown = record.rung(record.best) if record.best is not None else record.baseline
    if shown is None or shown.held is None:
        return
    held = shown.held
    floors = f" ({held.floors})" if held.floors else ""
    where = ""
    if shown.folder and (rung_folders is None or shown.folder in rung_folders):
        where = f" ({link(shown.folder, f'{shown.folder}/modules.md')})"
    doc.h2(f"What holds the rest: {shown.name}, by module")
    doc.para(
        f"The {shown.name} rung's own time by module ({held.time_kind} in its profiled pass), beside each module's "
        f"floor{floors}: per stage the modules furthest above their floor, where faster kernels or fewer of them could "
        f"still win; every module is in the rung's `modules.md`{where}."
    )
    for stage in held.stages:
        doc.h3(stage.stage)
        doc.para(stage_summary(stage, held.time_kind))
        if stage.rows:
            module_table(doc, stage.rows)


def _verdicts(doc: Doc, record: WhatIfRecord) -> None:
    doc.h2("Verdicts")
    unjudged = set(record.unjudged_levers())
    sections = {
        "Helped": [v.line for v in record.verdicts if v.helped],
        "Did not help": [v.line for v in record.verdicts if v.judged and not v.helped],
        "Not judged: too few passes": [v.line for v in record.verdicts if v.lever in unjudged],
        "Not measured in full": [f"{r.name} ({r.phase}) {_state_line(r)}" for r in record.rungs if r.state != MEASURED],
    }
    for title, lines in sections.items():
        if lines:
            doc.h3(title)
            doc.bullets(lines)
    if not any(sections.values()):
        doc.para("No lever was judged.")


def _levers(doc: Doc, record: WhatIfRecord) -> None:
    doc.h2("Levers")
    doc.table(
        ["lever", "overrides", "what it may change", "needs", "about"],
        [
            [
                lever.name,
                ", ".join(f"`{o}`" for o in lever.overrides),
                CHANGES_WORKLOAD if lever.changes == WORKLOAD else "latency only",
                lever.needs or "—",
                lever.about or "—",
            ]
            for lever in record.levers
        ],
    )


MODULE_MOVES = 5  # modules listed per rung and stage in "Which modules each lever moved"


# A vision stage's module moves are listed when the lever moved its kernel time by this share and this much or more.
VISION_MOVE = 0.10
VISION_MOVE_MS = 0.1


def _shows_moves(stage: StageModuleChanges, same_pages: bool) -> bool:
    """The decode step and prefill always; a vision stage when the lever moved its kernel time by ≥ VISION_MOVE of
    it and ≥ VISION_MOVE_MS, per pass of as many pages as the baseline's (`same_pages`: a batch's vision runs once per
    page, so its pass holds more vision work)."""
    if stage.stage in (vocab.DECODE_STEP, vocab.PREFILL):
        return True
    moved = abs(stage.other_ms - stage.base_ms)
    return same_pages and moved >= VISION_MOVE_MS and moved >= VISION_MOVE * stage.base_ms


def _batch_size(record: WhatIfRecord, rung: Rung | None) -> int | None:
    figures = None if rung is None else record.figures_of(rung)
    return None if figures is None else figures.batch_size


def _module_moves(doc: Doc, record: WhatIfRecord, plot: str | None) -> None:
    """Per measured rung, the decode step's and prefill's change by module against the baseline, and each vision
    stage's where the lever moved it."""
    rungs = [r for r in ranked_rungs(record) if r.modules and r.state == MEASURED and r.reused is None]
    if not rungs:
        return
    doc.h2("Which modules each lever moved")
    doc.para(
        "Against the baseline, from both runs' module attribution (the profiled pass's kernel time by module): the "
        f"{MODULE_MOVES} largest moves per stage, the rest summed; negative is saved. In compiled code a kernel fused "
        "across modules goes to their common ancestor, so a lever that fuses shows time leaving the leaves and some "
        "arriving at a parent."
    )
    base_pages = _batch_size(record, record.baseline)
    for rung in rungs:
        doc.h3(rung.name)
        same_pages = _batch_size(record, rung) == base_pages
        for stage in rung.modules:
            if _shows_moves(stage, same_pages):
                rest = stage.rest_delta_ms + sum(c.delta_ms for c in stage.changes[MODULE_MOVES:])
                changes_table(doc, attrs.evolve(stage, changes=stage.changes[:MODULE_MOVES], rest_delta_ms=rest))
    if plot:
        plotted = module_waterfall_stage(record)
        shown = "decode step" if plotted is None or plotted.stage == vocab.DECODE_STEP else plotted.stage
        doc.image(f"The best rung's {shown} against the baseline's, by module", plot)


def whatif_md(
    record: WhatIfRecord,
    plots: dict[str, str] | None = None,
    files: Sequence[str] = (),
    rung_folders: Collection[str] | None = None,
) -> str:
    """`whatif.md`: verdict first, then the ranked rungs, the attribution, the floor, the verdicts and notes;
    `rung_folders`: the rung folders to link (those holding a report; default: every rung's)."""
    plots = plots or {}
    doc = Doc(f"What-if report: {record.model} on {record.device or 'device not recorded'}")
    _header(doc, record)
    if (how := launcher_text(record)) is not None:
        doc.para(how)
    doc.h2("Verdict")
    doc.para(verdict_paragraph(record))
    _goals(doc, record)
    goodput_section(doc, record, plots.get("pages_latency"))
    advised = record.advised_from
    predictions_section(doc, record, "" if advised is None else clean_paths(advised.folder))
    if "waterfall" in plots:
        shown = "Time to first token" if ranks_first_token(record) else "Decode ms/token"
        doc.image(f"{shown} from the baseline to the best rung", plots["waterfall"])
    doc.h2("Rungs, ranked")
    _ranked_table(doc, record)
    _objectives_table(doc, record)
    _attribution_table(doc, record)
    _module_moves(doc, record, plots.get("module_waterfall"))
    _floor_table(doc, record)
    if "floor" in plots:
        doc.image("Distance to the floor, baseline vs best rung", plots["floor"])
    _held(doc, record, rung_folders)
    _verdicts(doc, record)
    _levers(doc, record)
    if record.notes:
        doc.h2("Notes")
        doc.bullets([clean_paths(note) for note in record.notes])
    folders = [
        f"{r.name}: " + link(r.folder, f"{r.folder}/{REPORT_FILE}")
        for r in record.rungs
        if r.folder and (rung_folders is None or r.folder in rung_folders)
    ]
    if folders:
        doc.h2("Rung folders")
        doc.bullets(folders)
    if files:
        doc.h2("Files")
        doc.bullets([link(f, f) for f in sorted(set(files))])
    return doc.text()


def write_all(art: ArtifactsManager, record: WhatIfRecord) -> None:
    """The plots (`plots/*.png`) and `whatif.md` of a what-if folder, from its record alone (the record itself,
    `whatif.json`, is the runner's to save)."""
    write_report(art, record, write_plots(art, record))


def write_plots(art: ArtifactsManager, record: WhatIfRecord) -> dict[str, str]:
    """The plots of a what-if folder (name -> path in the folder)."""
    written = write_whatif_plots(record, art.run_dir)
    for path in written.values():
        art.record(str(path.relative_to(art.run_dir)))
    return {name: str(path.relative_to(art.run_dir)) for name, path in written.items()}


def write_report(art: ArtifactsManager, record: WhatIfRecord, plots: dict[str, str]) -> None:
    """`whatif.md`, with the plots written before it (`write_plots`)."""
    files = present(art.run_dir, [f for f in art.written if f.endswith((".md", ".json", ".png"))])
    reported = [r.folder for r in record.rungs if r.folder and (art.run_dir / r.folder / REPORT_FILE).is_file()]
    write_markdown(art, WHATIF_REPORT, whatif_md(record, plots, [*files, WHATIF_REPORT], reported))

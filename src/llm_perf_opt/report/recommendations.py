"""Findings and "What to try", rendered from the measured numbers (no fixed text without a number behind it).
"What to try" ranks the advice of `measure.advice.advise` in a table, after what a given `perf-whatif` run of the
same model measured (the best rung's gain, the levers that did not help), which the advice leaves out."""

from __future__ import annotations

from collections.abc import Sequence

from llm_perf_opt.measure.advice import DecodeRemainder, decode_remainder
from llm_perf_opt.override_text import override_key
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.advice import THROUGHPUT, Advice
from llm_perf_opt.records.stage1 import ModelFamily, Stage1Metrics
from llm_perf_opt.records.whatif import BASELINE, MEASURED, WhatIfRecord
from llm_perf_opt.report.batches import batch_run
from llm_perf_opt.report.markdown import Doc
from llm_perf_opt.report.whatif_report import single_pass_text

NOISY_CV = 0.10  # median CV over one image's passes above which a stage is called noisy
VISION_DOMINANT = 0.6  # vision share of prefill above which the notes say how the workload could cut it
SAM_BIAS_MB_PER_BYTE = 200  # SAM's relative-position bias for a 1024-px view: ~200 MB per byte of element
TOP_ADVICE = 5  # rows of the "What to try" table
GUIDE = "docs/guide/stage1.md#what-to-try"  # where each rule and prediction is explained


def _p50(m: Stage1Metrics, stage: str) -> float | None:
    return next((s.summary.p50 for s in m.stages if s.stage == stage), None)


def _mean(m: Stage1Metrics, stage: str) -> float | None:
    """A stage's mean time per pass: means add up (e2e = preprocess + prefill + decode pass by pass), medians don't."""
    return next((s.summary.mean for s in m.stages if s.stage == stage), None)


def _mfu(m: Stage1Metrics, stage: str) -> float | None:
    return next((r.mfu for r in m.mfu if r.stage == stage), None)


def _tflops(m: Stage1Metrics, stage: str) -> float | None:
    return next((r.achieved_tflops for r in m.mfu if r.stage == stage), None)


def _vision_means(m: Stage1Metrics) -> dict[str, float]:
    """Each vision sub-stage's mean time per pass."""
    return {s.stage: _mean(m, s.stage) or 0.0 for s in m.stages if vocab.is_vision(s.stage)}


def key_findings(m: Stage1Metrics) -> list[str]:
    """Where the time goes and how efficient it is, in two or three sentences with numbers."""
    e2e = _mean(m, vocab.E2E) or 0.0
    pre, prefill, decode = _mean(m, vocab.PREPROCESS), _mean(m, vocab.PREFILL), _mean(m, vocab.DECODE) or 0.0
    step = _p50(m, vocab.DECODE_STEP)
    out: list[str] = []
    if e2e and prefill is not None and pre is not None:
        parts = [
            f"decode {decode / e2e:.0%} ({decode:,.1f} ms" + (f", {step:,.2f} ms/token" if step else "") + ")",
            f"prefill {prefill / e2e:.0%} ({prefill:,.1f} ms)",
            f"preprocess {pre / e2e:.0%} ({pre:,.1f} ms)",
        ]
        parts.sort(key=lambda p: -float(p.split()[1].rstrip("%")))
        unit = "prompt" if m.settings.input_kind == "text" else "image"
        median = _p50(m, vocab.E2E) or 0.0
        out.append(
            f"Where time goes: {e2e:,.1f} ms end to end per {unit} (mean over passes; median {median:,.1f} ms) — "
            + ", ".join(parts)
            + "."
        )
        vision = _vision_means(m)
        if prefill and vision:
            inner = ", ".join(f"{s.split('/', 1)[1]} {v / prefill:.0%}" for s, v in vision.items())
            out.append(
                f"Inside prefill, vision takes {sum(vision.values()) / prefill:.0%} ({inner}); the language model "
                f"and merging take the other {1 - sum(vision.values()) / prefill:.0%}."
            )
    pf_mfu, dec_mfu = _mfu(m, vocab.PREFILL), _mfu(m, vocab.DECODE)
    dec_eff = m.efficiency_of(vocab.DECODE)
    if pf_mfu is not None and dec_eff is not None and dec_eff.mbu is not None and dec_eff.gap is not None:
        out.append(
            f"How efficient: prefill runs at {_tflops(m, vocab.PREFILL):,.1f} TFLOP/s = {pf_mfu:.1%} MFU; "
            f"batch-{batch_run(m)} decode, judged by memory bandwidth, reaches {dec_eff.mbu:.1%} MBU and "
            f"takes {dec_eff.gap:,.0f}× its speed-of-light time."
        )
    elif pf_mfu is not None:
        out.append(
            f"How efficient: prefill runs at {_tflops(m, vocab.PREFILL):,.1f} TFLOP/s = {pf_mfu:.1%} MFU; decode at "
            f"{_tflops(m, vocab.DECODE) or 0:,.2f} TFLOP/s = {(dec_mfu or 0):.2%} MFU "
            f"(batch-{batch_run(m)} decode is judged by memory bandwidth, not FLOPs)."
        )
    else:
        out.append(
            f"How efficient: MFU is n/a on {m.device.name} (no dense peak known); prefill achieved "
            f"{_tflops(m, vocab.PREFILL) or 0:,.3f} TFLOP/s."
        )
    if (act := m.profiler.activity if m.profiler else None) is not None:
        out.append(
            f"Per decode step the GPU ran {act.kernels_mean:,.0f} kernels and was busy {act.busy_fraction:.0%} of the "
            f"{act.wall_ms_mean:,.2f} ms step (profiled pass)."
        )
    return out


# The overrides Stage 2's launch-bound advice names: a what-if record that measured all of them replaces it.
DECODE_LEVERS = frozenset({"runtime.kv_cache", "runtime.compile", "run.batch_size"})


def measured_override_keys(w: WhatIfRecord) -> frozenset[str]:
    """The config keys the what-if run's measured rungs set."""
    return frozenset(override_key(o) for o in w.measured_overrides())


def measured_lever_lines(w: WhatIfRecord, device: str, model: str) -> list[str]:
    """What a what-if run measured, one line each: the best rung against the baseline (with its interval's verdict
    and the outputs check), the levers that did not help, the rungs that could not run. `device` and `model`: the
    citing run's, named when the what-if run's differ."""
    where = w.device_phrase if w.device == device else f"{w.device or 'another device'} (not this run's {device})"
    source = f"measured on {where} by what-if run `{w.run_id}` (preset {w.preset}"
    source += ")" if w.model == model else f", model {w.model}, not this run's {model})"
    lead = source[0].upper() + source[1:]
    o = w.objective
    base, best = w.baseline, w.best_rung
    base_f = None if base is None else w.figures_of(base)
    best_f = None if best is None else w.figures_of(best)
    lines: list[str] = []
    if base_f is None:
        lines.append(f"The what-if run `{w.run_id}` has no measured baseline, so none of its levers can be cited.")
    elif (best is None or best_f is None) and w.unjudged_levers() and not any(v.judged for v in w.verdicts):
        lines.append(
            f"{lead}: no lever could be judged against the baseline's {base_f.objective.p50:,.2f} {o.unit} ({o.label})."
        )
    elif best is None or best_f is None or best.phase == BASELINE:
        lines.append(
            f"{lead}: no lever beat the baseline's {base_f.objective.p50:,.2f} {o.unit} ({o.label}) with its outputs "
            "checked."
        )
    else:
        verb = "raised" if o.higher_is_better else "cut"
        gain = f"{best.speedup.value:.1f}×, {best.speedup.verdict}" if best.speedup else "no ratio recorded"
        line = (
            f"{lead}: {' + '.join(best.levers)} {verb} {o.label} from "
            f"{base_f.objective.p50:,.2f} to {best_f.objective.p50:,.2f} {o.unit} ({gain})"
        )
        out = best.outputs
        if out is None:
            line += "; outputs not compared"
        elif out.identical:
            line += f"; outputs identical for {out.compared_tokens} tokens"
        else:
            line += f"; outputs depart at token {out.first_departure} of {out.compared_tokens}"
        if best.changes_workload:
            line += "; it changes the workload, so judge its outputs before adopting it"
        overrides = " ".join(best.overrides)
        lines.append(line + (f". Set: `{overrides}`." if overrides else "."))
    helped = [v.line for v in w.verdicts if v.helped]
    if len(helped) > 1:
        lines.append("Levers that helped (what-if verdicts): " + "; ".join(helped) + ".")
    not_helped = [v.line for v in w.verdicts if v.judged and not v.helped]
    if not_helped:
        lines.append("Did not help (measured): " + "; ".join(not_helped) + ".")
    if unjudged := w.unjudged_levers():
        lines.append(f"Not judged: {single_pass_text(w, unjudged)}.")
    not_run = [f"{r.name} {r.state} ({r.reason or 'no reason recorded'})" for r in w.rungs if r.state != MEASURED]
    if not_run:
        lines.append("Not measured in the what-if run: " + "; ".join(not_run) + ".")
    return lines


def _vision_note(m: Stage1Metrics) -> str | None:
    """How a smaller workload would cut vision, when it dominates prefill: fewer tiles or views (levers that change
    the outputs, so the table does not rank them)."""
    prefill = _mean(m, vocab.PREFILL) or 0.0
    vision = _vision_means(m)
    total = sum(vision.values())
    if not prefill or total / prefill <= VISION_DOMINANT:
        return None
    msg = f"Vision is {total / prefill:.0%} of prefill"
    sam = _mean(m, vocab.VISION_SAM) or 0.0
    if sam and sam / total > 0.5:
        bias_mb = SAM_BIAS_MB_PER_BYTE * (vocab.dtype_bytes(m.model.dtype) or 2)
        msg += (
            f", mostly SAM ({sam / total:.0%} of vision): each global-attention block materialises a "
            f"relative-position bias of heads × N² elements (about {bias_mb:,.0f} MB in {m.model.dtype} for a "
            "1024-px view), so SAM moves far more bytes than its FLOPs need"
        )
    family = m.model.family_facts()
    if family.tiled_views:  # tiled preprocessing: each tile is another vision pass
        msg += _fewer_views_hint(family, any(r.tiles for r in m.records))
    else:
        msg += ": fewer image tokens (a smaller input resolution in the processor) cut it in proportion"
    return msg + ". Each changes the workload (its outputs differ), so the table does not rank it."


def _fewer_views_hint(family: ModelFamily, tiled: bool) -> str:
    """How to cut a tiled family's vision work: fewer tiles, or (a family with modes, one view) a smaller mode."""
    if family.tiling and tiled:
        tile = family.tile_px
        return (
            f". Fewer tiles (model.preprocess.max_tiles) cut it in proportion: each {f'{tile}-px ' if tile else ''}"
            f"tile adds a full SAM + {family.encoder} pass"
            + ("; model.mode=base runs the global view alone" if family.has_modes else "")
        )
    if family.has_modes and family.mode not in (None, "tiny"):
        return f". A smaller mode than model.mode={family.mode} cuts it: SAM's work grows with the view's area"
    return ". The pages ran as one global view each (no tiles), so only a smaller view would cut it further"


def notes(m: Stage1Metrics) -> list[str]:
    """What the table cannot say: a CPU run's figures are not a GPU's; how a smaller workload cuts vision; stages
    too noisy to judge a saving on."""
    out = []
    if m.device.type == "cpu":
        out.append(
            "This is a CPU run: its figures show the pipeline's shape, not GPU behaviour, and no floor is priced "
            "without a GPU's peaks. Run on a GPU (device=cuda) for the levers, kernel-level timings and Stage 2."
        )
    if vision := _vision_note(m):
        out.append(vision)
    noisy = [v.stage for v in m.variation if (v.within_image_cv_median or 0.0) > NOISY_CV]
    if noisy:
        out.append(
            f"Run-to-run variation is high in {', '.join(noisy)}: a saving smaller than that spread cannot be told "
            "from noise; add warm-up passes (run.warmup), more repeats, and keep other work off the device."
        )
    return out


def _times(a: Advice) -> str:
    if a.speedup is None:
        return "all of it"
    low, high = a.speedup_low, a.speedup_high
    interval = f"{low:,.2f}–{high:,.2f}×" if low is not None and high is not None else f"from {low or 1:,.2f}×"
    return f"{a.speedup:,.2f}× ({interval})"


def _advice_row(rank: int, a: Advice) -> list[str]:
    return [
        str(rank),
        f"`{a.lever}`" if a.overrides else f"code change: {a.lever}",
        ", ".join(a.acts_on),
        f"{a.saving_ms:,.1f} ms ({a.saving_low_ms:,.1f}–{a.saving_high_ms:,.1f}); {_times(a)}",
        f"{a.objective} (time per page {a.objective_ms:,.1f} ms)"
        if a.objective == THROUGHPUT
        else f"{a.objective} {a.objective_ms:,.1f} ms",
        f"{a.basis}: {a.because}" if a.because else a.basis,
        f"`{a.command}`" if a.command else "a code change: measure before and after",
    ]


ADVICE_HEADER = ("#", "lever", "acts on", "saves per page (interval); ×", "objective now", "basis", "verify with")


def what_to_try(doc: Doc, m: Stage1Metrics, advice: Sequence[Advice], whatif: WhatIfRecord | None = None) -> None:
    """The levers a what-if run measured (when given), then the advised levers as a ranked table (the first
    TOP_ADVICE), then what the table cannot say."""
    if whatif is not None:
        doc.bullets(measured_lever_lines(whatif, m.device.name, m.model.name))
    if advice:
        doc.table(list(ADVICE_HEADER), [_advice_row(i, a) for i, a in enumerate(advice[:TOP_ADVICE], 1)])
        more = advice[TOP_ADVICE:]
        doc.para(
            "Predicted: the time the lever can remove per page (its basis) times the share levers of its kind have "
            f"saved when measured; the rules and the calibration are explained in the guide ({GUIDE}). Each command "
            "runs this workload with the lever; `perf-compare` of this folder and its folder measures the saving."
            + (f" Also advised: {'; '.join(f'`{a.lever}`' for a in more)}." if more else "")
        )
    elif whatif is None and m.device.type != "cpu":  # a CPU run's note says why
        doc.para("No lever stands out against this run's floors and settings; compare modes or GPUs for the next one.")
    if (held := decode_remainder(m)) is not None:
        doc.para(decode_remainder_line(held))
    if extra := notes(m):
        doc.bullets(extra)


def decode_remainder_line(d: DecodeRemainder) -> str:
    """What the levers leave in a graph-replayed decode step, by module, with the lever each needs."""
    parts = "; ".join(
        f"`{r.module}` {r.above_ms:,.3f} ms above its floor ({r.ratio:,.1f}×): {r.needs}" for r in d.modules
    )
    return (
        f"Past the launch floor: the decode step replays from CUDA graphs and its kernels take {d.step_ms:,.3f} ms "
        f"(profiled pass) against a {d.floor_ms:,.3f} ms floor (analytic, at the GPU's peaks) "
        f"({d.step_ms / d.floor_ms:,.1f}×). What holds the rest, per step: "
        f"{parts} (modules.md)."
    )

"""Findings and recommendations derived from the measured numbers (no fixed text without a number behind it).

Given a `perf-whatif` record of the same model, "What to try" starts with what its levers measured (the gain of the
best rung, which levers did not help) and drops the generic advice whose every lever it measured.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llm_perf_opt.override_text import override_key
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import ModuleAttribution
from llm_perf_opt.records.stage1 import ModelFamily, Stage1Metrics, StageEfficiency
from llm_perf_opt.records.whatif import BASELINE, MEASURED, WhatIfRecord
from llm_perf_opt.report.batches import batch_run
from llm_perf_opt.report.markdown import pct
from llm_perf_opt.report.whatif_report import single_pass_text

# Thresholds that trigger a recommendation; named so the report's logic can be read and tuned in one place.
DECODE_DOMINANT = 0.5  # decode share of end-to-end
VISION_DOMINANT = 0.6  # vision share of prefill
PREPROCESS_NOTABLE = 0.10  # preprocess share of time to first token
LOW_PREFILL_MFU = 0.30
LOW_DECODE_MFU = 0.02
FAR_FROM_SOL = 5.0  # measured / speed-of-light time above which a stage is overhead-bound


SAM_BIAS_MB_PER_BYTE = 200  # SAM's relative-position bias for a 1024-px view: ~200 MB per byte of element
NOISY_CV = 0.10  # median CV over one image's passes above which a stage is called noisy


def _p50(m: Stage1Metrics, stage: str) -> float | None:
    return next((s.summary.p50 for s in m.stages if s.stage == stage), None)


def _mean(m: Stage1Metrics, stage: str) -> float | None:
    """A stage's mean time per pass: means add up (e2e = preprocess + prefill + decode pass by pass), medians don't."""
    return next((s.summary.mean for s in m.stages if s.stage == stage), None)


def _mfu(m: Stage1Metrics, stage: str) -> float | None:
    return next((r.mfu for r in m.mfu if r.stage == stage), None)


def _tflops(m: Stage1Metrics, stage: str) -> float | None:
    return next((r.achieved_tflops for r in m.mfu if r.stage == stage), None)


def _vision_stages(m: Stage1Metrics) -> list[str]:
    return [s.stage for s in m.stages if vocab.is_vision(s.stage)]


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
        vision = {s: _mean(m, s) or 0.0 for s in _vision_stages(m)}
        if prefill and vision:
            inner = ", ".join(f"{s.split('/', 1)[1]} {v / prefill:.0%}" for s, v in vision.items())
            out.append(
                f"Inside prefill, vision takes {sum(vision.values()) / prefill:.0%} ({inner}); the language model "
                f"and merging take the other {1 - sum(vision.values()) / prefill:.0%}."
            )
    pf_mfu, dec_mfu = _mfu(m, vocab.PREFILL), _mfu(m, vocab.DECODE)
    dec_eff = next((e for e in m.efficiency if e.stage == vocab.DECODE), None)
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


# The overrides each generic rule advises: a what-if record that measured all of them replaces the rule.
DECODE_LEVERS = frozenset({"runtime.kv_cache", "runtime.compile", "run.batch_size"})
EXPERTS_LEVERS = frozenset({"model.experts_implementation"})
ATTENTION_LEVERS = frozenset({"model.attn_implementation"})
COMPILE_LEVERS = frozenset({"runtime.compile"})


def recommendations(m: Stage1Metrics, whatif: WhatIfRecord | None = None) -> list[str]:
    """What to try next: the levers a what-if run measured (when given), then each generic rule triggered by a
    measured figure whose levers it did not measure."""
    measured = measured_lever_lines(whatif, m.device.name, m.model.name) if whatif is not None else []
    tried = measured_override_keys(whatif) if whatif is not None else frozenset()
    generic = [text for text, levers in _generic(m) if not (levers and levers <= tried)]
    if not generic and not measured:
        return ["No stage stands out against the thresholds; compare modes or GPUs to find the next lever."]
    return [*measured, *generic]


def measured_override_keys(w: WhatIfRecord) -> frozenset[str]:
    """The config keys the what-if run's measured rungs set."""
    return frozenset(override_key(o) for r in w.rungs if r.state == MEASURED for o in r.overrides)


def measured_lever_lines(w: WhatIfRecord, device: str, model: str) -> list[str]:
    """What a what-if run measured, one line each: the best rung against the baseline (with its interval's verdict
    and the outputs check), the levers that did not help, the rungs that could not run. `device` and `model`: the
    citing run's, named when the what-if run's differ."""
    where = w.device_phrase if w.device == device else f"{w.device or 'another device'} (not this run's {device})"
    source = f"measured on {where} by what-if run `{w.run_id}` (preset {w.preset}"
    source += ")" if w.model == model else f", model {w.model}, not this run's {model})"
    o = w.objective
    base, best = w.baseline, w.best_rung
    base_f = None if base is None else w.figures_of(base)
    best_f = None if best is None else w.figures_of(best)
    lines: list[str] = []
    if base_f is None:
        lines.append(f"The what-if run `{w.run_id}` has no measured baseline, so none of its levers can be cited.")
    elif (best is None or best_f is None) and w.unjudged_levers() and not any(v.judged for v in w.verdicts):
        lines.append(
            f"{source[0].upper()}{source[1:]}: no lever could be judged against the baseline's "
            f"{base_f.objective.p50:,.2f} {o.unit} ({o.label})."
        )
    elif best is None or best_f is None or best.phase == BASELINE:
        lines.append(
            f"{source[0].upper()}{source[1:]}: no lever beat the baseline's {base_f.objective.p50:,.2f} {o.unit} "
            f"({o.label}) with its outputs checked."
        )
    else:
        verb = "raised" if o.higher_is_better else "cut"
        gain = f"{best.speedup.value:.1f}×, {best.speedup.verdict}" if best.speedup else "no ratio recorded"
        line = (
            f"{source[0].upper()}{source[1:]}: {' + '.join(best.levers)} {verb} {o.label} from "
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


# Module attribution (Stage1Metrics.modules): a module row that a module rule may cite.
MODULE_FAR = 3.0  # measured / floor above which a module is far from its speed of light
MODULE_NOTABLE = 0.05  # its time above the floor, as a share of its stage's time, for a rule to name it
MODULE_FACTS = 3  # rows per stage (largest time above floor first)
EXPERTS_WORDS = ("experts", "moe")
ATTENTION_WORDS = ("attn", "attention")
COPY_WORDS = ("copy", "contiguous", "aten::cat", "clone", "transpose", "permute", "constant_pad")  # in the top kernel
ELEMENTWISE_WORDS = (
    "elementwise",
    "functor",
    "reduce",
    "norm",
    "softmax",
    "gelu",
    "silu",
    "sigmoid",
    "aten::add",
    "aten::mul",
    "aten::sub",
    "aten::div",
    "triton_poi",  # inductor's pointwise kernels
)


@attrs.frozen
class ModuleFact:
    """One module (folded across layers) far above its floor, from the profiled pass's module attribution."""

    stage: str
    module: str
    module_type: str
    ms: float  # per forward of the stage
    floor_ms: float
    stage_ms: float  # the stage's kernel time per forward
    top_kernel: str | None  # "kernel (operator)"

    @property
    def ratio(self) -> float:
        return self.ms / self.floor_ms if self.floor_ms > 0 else float("inf")

    @property
    def above_ms(self) -> float:
        return max(self.ms - self.floor_ms, 0.0)

    @property
    def kind(self) -> str:
        """Which lever fits: "experts", "attention", "copies", "elementwise" or "other" (the first that matches)."""
        where, top = f"{self.module} {self.module_type}".lower(), (self.top_kernel or "").lower()
        if any(w in where for w in EXPERTS_WORDS):
            return "experts"
        if any(w in where for w in ATTENTION_WORDS):
            return "attention"
        if any(w in top for w in COPY_WORDS):
            return "copies"
        return "elementwise" if any(w in top for w in ELEMENTWISE_WORDS) else "other"

    def cite(self) -> str:
        """`module` (stage): X ms per forward, R× its floor of F ms (A ms above it, S% of the stage), top kernel."""
        per = "step" if self.stage == vocab.DECODE_STEP else "pass"
        text = (
            f"`{self.module}` ({self.stage}) takes {self.ms:,.3f} ms per {per}, {self.ratio:,.1f}× its floor of "
            f"{self.floor_ms:,.3f} ms ({self.above_ms:,.3f} ms above it, {self.above_ms / self.stage_ms:.0%} of the "
            "stage)"
        )
        return text + (f", mostly `{self.top_kernel}`" if self.top_kernel else "")


def module_facts(a: ModuleAttribution | None) -> tuple[ModuleFact, ...]:
    """Per stage, the modules furthest above their floor (at most MODULE_FACTS each) that are MODULE_FAR× above it
    and whose distance to it is at least MODULE_NOTABLE of the stage; largest distance first."""
    out = []
    for stage in a.stages if a is not None else ():
        rows = [r for r in stage.rows if r.floor_ms is not None and r.above_floor_ms is not None]
        rows.sort(key=lambda r: -(r.above_floor_ms or 0.0))
        for r in rows[:MODULE_FACTS]:
            fact = ModuleFact(
                stage.stage, r.module, r.module_type, r.ms, r.floor_ms or 0.0, stage.total_ms, r.top_kernel
            )
            if stage.total_ms > 0 and fact.ratio >= MODULE_FAR and fact.above_ms / stage.total_ms >= MODULE_NOTABLE:
                out.append(fact)
    return tuple(sorted(out, key=lambda f: -f.above_ms / f.stage_ms))


@attrs.frozen
class Facts:
    """The measured figures the generic rules read, computed once from a run's metrics."""

    device: str  # "cuda" | "cpu"
    e2e: float  # mean ms per pass (0.0 when not measured), likewise the three stages
    decode: float
    prefill: float
    preprocess: float
    step: float | None  # median ms per decode step
    decode_mfu: float | None
    prefill_mfu: float | None
    decode_efficiency: StageEfficiency | None
    vision: float  # the vision sub-stages' mean ms, summed
    sam: float
    batch: int
    inputs: str  # what a batch holds: "pages" or "prompts"
    experts: str | None  # the MoE experts implementation; None for a dense model
    dtype: str
    family: ModelFamily
    tiled: bool  # some input was cut into tiles
    noisy: tuple[str, ...]  # stages whose within-input variation is above NOISY_CV
    # where the views were made (model.preprocess.device); None: the adapter offers no choice (or did not record it)
    preprocess_device: str | None = None
    modules: tuple[ModuleFact, ...] = ()  # modules far above their floor (module_facts), largest share first

    def modules_of(self, kind: str) -> tuple[ModuleFact, ...]:
        """The far-above-floor modules whose lever is `kind` (ModuleFact.kind)."""
        return tuple(f for f in self.modules if f.kind == kind)

    @property
    def ttft(self) -> float:
        """Mean time to first token: preprocess + prefill."""
        return self.preprocess + self.prefill

    @classmethod
    def of(cls, m: Stage1Metrics) -> Facts:
        return cls(
            device=m.device.type,
            e2e=_mean(m, vocab.E2E) or 0.0,
            decode=_mean(m, vocab.DECODE) or 0.0,
            prefill=_mean(m, vocab.PREFILL) or 0.0,
            preprocess=_mean(m, vocab.PREPROCESS) or 0.0,
            step=_p50(m, vocab.DECODE_STEP),
            decode_mfu=_mfu(m, vocab.DECODE),
            prefill_mfu=_mfu(m, vocab.PREFILL),
            decode_efficiency=next((e for e in m.efficiency if e.stage == vocab.DECODE), None),
            vision=sum(_mean(m, s) or 0.0 for s in _vision_stages(m)),
            sam=_mean(m, vocab.VISION_SAM) or 0.0,
            batch=batch_run(m),
            inputs="prompts" if m.settings.input_kind == "text" else "pages",
            experts=m.model.experts_implementation,
            dtype=m.model.dtype,
            family=m.model.family_facts(),
            tiled=any(r.tiles for r in m.records),
            noisy=tuple(v.stage for v in m.variation if (v.within_image_cv_median or 0.0) > NOISY_CV),
            preprocess_device=(m.model.preprocess or {}).get("device"),
            modules=module_facts(m.modules),
        )


def _no_levers(f: Facts) -> frozenset[str]:
    return frozenset()


@attrs.frozen
class Rule:
    """One piece of generic advice: when it applies, what it says, and the override keys it advises (a what-if
    record that measured all of them replaces it)."""

    name: str
    when: Callable[[Facts], bool]
    text: Callable[[Facts], str]
    levers: Callable[[Facts], frozenset[str]] = _no_levers


def _decode_text(f: Facts) -> str:
    msg = f"Decode is {f.decode / f.e2e:.0%} of end-to-end time"
    if f.step:
        msg += f" at {f.step:,.2f} ms/token"
    eff = f.decode_efficiency
    if f.device == "cuda" and eff is not None and eff.gap is not None and eff.gap > FAR_FROM_SOL:
        msg += (
            f", {eff.gap:,.0f}× its speed of light with {pct(eff.mbu)} MBU: the weights and KV cache "
            "it reads would take a fraction of the step, so the step is bound by kernel launches and Python, not "
            "by memory bandwidth. Capture it in a CUDA graph or compile it (static KV cache), "
            + ("fuse the per-expert work, " if f.experts is not None else "")
            + f"and batch {f.inputs}; Stage 2 shows the GPU-busy fraction per step"
        )
    elif f.device == "cuda" and f.decode_mfu is not None and f.decode_mfu < LOW_DECODE_MFU:
        msg += (
            f" and only {f.decode_mfu:.2%} MFU: batch-{f.batch} decode is bound by weight reads or, "
            "when a step takes far longer than its bytes need, by kernel-launch/CPU overhead. Try CUDA graphs or "
            f"torch.compile (static KV cache), and batch several {f.inputs} per step; Stage 2 shows the GPU-busy "
            "fraction per step"
        )
    else:
        msg += f": fewer generated tokens or batching several {f.inputs} per decode step pay off most"
    return msg + "."


def _vision_text(f: Facts) -> str:
    msg = f"Vision is {f.vision / f.prefill:.0%} of prefill"
    if f.sam and f.sam / f.vision > 0.5:
        bias_mb = SAM_BIAS_MB_PER_BYTE * (vocab.dtype_bytes(f.dtype) or 2)
        msg += (
            f", mostly SAM ({f.sam / f.vision:.0%} of vision): each global-attention block materialises a "
            f"relative-position bias of heads × N² elements (about {bias_mb:,.0f} MB in {f.dtype} for a "
            "1024-px view), so SAM moves far more bytes than its FLOPs need"
        )
    if f.family.tiled_views:  # tiled preprocessing: each tile is another vision pass
        msg += _fewer_views_hint(f.family, f.tiled)
    else:
        msg += ": fewer image tokens (a smaller input resolution in the processor) cut it in proportion"
    return msg + "."


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


def _cited(facts: tuple[ModuleFact, ...]) -> str:
    """The first module in full, a second one briefly."""
    text = facts[0].cite()
    if len(facts) > 1:
        f = facts[1]
        text += f"; also `{f.module}` ({f.stage}, {f.ratio:,.1f}× its floor, {f.above_ms:,.3f} ms above it)"
    return text


def _compile_levers(f: Facts, kind: str) -> frozenset[str]:
    """runtime.compile where a cited module is the decoder's (what-if's compile levers leave vision eager), else
    none: a what-if run cannot have measured fusing a vision module."""
    return COMPILE_LEVERS if any(not vocab.is_vision(x.stage) for x in f.modules_of(kind)) else frozenset()


def _elementwise_text(f: Facts) -> str:
    return (
        f"Many small elementwise kernels: {_cited(f.modules_of('elementwise'))}. Each reads and writes its whole "
        "tensor for one operation, so the module moves its bytes several times: fuse them — torch.compile of that "
        "part (runtime.compile: decode or prefill_decode for the decoder; a fused kernel or a compiled region for "
        "an encoder block), or a fused op (fused norm / activation) in its forward."
    )


def _attention_text(f: Facts) -> str:
    facts = f.modules_of("attention")
    sam = any("sam" in x.module.lower() for x in facts)
    return (
        f"Attention far above its floor: {_cited(facts)}. An attention backend that fuses the softmax and the "
        "matmuls (model.attn_implementation=sdpa with the flash or cuDNN backend, or flash_attention_2 where the "
        "model takes it) avoids materialising the scores"
        + (
            "; SAM's relative-position bias is built and added outside the kernel (heads × N² elements per global "
            "block): fusing it (an additive mask inside SDPA, or computing it once per view) removes those bytes"
            if sam
            else ""
        )
        + "."
    )


def _experts_text(f: Facts) -> str:
    facts = f.modules_of("experts")
    impl = f"model.experts_implementation={f.experts}" if f.experts else "the experts' implementation"
    return (
        f"MoE experts far above their byte floor at batch {f.batch}: {_cited(facts)}. With {impl} each routed "
        "expert runs its own small GEMMs; a grouped GEMM backend (model.experts_implementation=grouped_mm or "
        f"batched_mm) runs them in one launch, and batching several {f.inputs} (run.batch_size) gives each "
        "expert more rows per weight read."
    )


def _preprocess_text(f: Facts) -> str:
    share = f"Preprocessing is {f.preprocess / f.ttft:.0%} of time to first token ({f.preprocess:,.1f} ms"
    device = f.preprocess_device or "cpu"
    where = {"cpu": "the CPU", "cuda": "the GPU"}.get(device, device)
    gpu = " model.preprocess.device=cuda makes the views on the GPU; else" if f.preprocess_device == "cpu" else ""
    return f"{share} on {where}):{gpu} overlap it with GPU work (a data-loader worker) or preprocess ahead of time."


def _copies_text(f: Facts) -> str:
    return (
        f"Copies far above the floor: {_cited(f.modules_of('copies'))}. Layout copies (copy_, contiguous, cat, "
        "transpose) move bytes the analytic floor does not need: keep tensors in the layout the next kernel reads "
        "(no .contiguous() after a transpose, preallocate instead of cat, fuse the split/merge of heads into the "
        "projection), or let torch.compile fuse the copy into its consumer."
    )


# The generic advice, in the order "What to try" lists it: each rule whose condition the measured facts meet.
RULES: tuple[Rule, ...] = (
    Rule(
        "cpu run",
        lambda f: f.device == "cpu",
        lambda f: (
            "This is a CPU run: its figures show the pipeline's shape, not GPU behaviour. Run on a GPU "
            "(device=cuda) for kernel-level timings, MFU against a datasheet peak, and Stage 2."
        ),
    ),
    Rule(
        "decode dominates",
        lambda f: bool(f.e2e) and f.decode / f.e2e > DECODE_DOMINANT,
        _decode_text,
        lambda f: DECODE_LEVERS | (EXPERTS_LEVERS if f.experts is not None else frozenset()),
    ),
    Rule(
        "vision dominates prefill", lambda f: bool(f.prefill) and f.vision / f.prefill > VISION_DOMINANT, _vision_text
    ),
    Rule(
        "low prefill MFU",
        lambda f: f.device == "cuda" and f.prefill_mfu is not None and f.prefill_mfu < LOW_PREFILL_MFU,
        lambda f: (
            f"Prefill reaches {f.prefill_mfu:.1%} MFU (< {LOW_PREFILL_MFU:.0%}): the operator table shows which "
            "kernels hold it back (attention backend, small GEMMs, elementwise work); Stage 2 gives their roofline."
        ),
    ),
    Rule(
        "preprocess notable",
        lambda f: bool(f.ttft) and f.preprocess / f.ttft > PREPROCESS_NOTABLE,
        _preprocess_text,
    ),
    Rule(
        "eager MoE experts",
        lambda f: f.device == "cuda" and f.experts == "eager",
        lambda f: "The MoE experts run the eager per-expert loop: try model.experts_implementation=grouped_mm.",
        lambda f: EXPERTS_LEVERS,
    ),
    Rule(
        "module: MoE experts far above floor",
        lambda f: bool(f.modules_of("experts")),
        _experts_text,
        lambda f: EXPERTS_LEVERS | frozenset({"run.batch_size"}),
    ),
    Rule(
        "module: attention far above floor",
        lambda f: bool(f.modules_of("attention")),
        _attention_text,
        lambda f: ATTENTION_LEVERS,
    ),
    Rule(
        "module: copies far above floor",
        lambda f: bool(f.modules_of("copies")),
        _copies_text,
        lambda f: _compile_levers(f, "copies"),
    ),
    Rule(
        "module: elementwise kernels far above floor",
        lambda f: bool(f.modules_of("elementwise")),
        _elementwise_text,
        lambda f: _compile_levers(f, "elementwise"),
    ),
    Rule(
        "noisy",
        lambda f: bool(f.noisy),
        lambda f: (
            f"Run-to-run variation is high in {', '.join(f.noisy)}: add warm-up passes (run.warmup), more "
            "repeats, and keep other work off the device."
        ),
    ),
)


def _generic(m: Stage1Metrics) -> list[tuple[str, frozenset[str]]]:
    """Each rule (`RULES`) the run's measured facts trigger, with the override keys it advises (empty: none)."""
    facts = Facts.of(m)
    return [(rule.text(facts), rule.levers(facts)) for rule in RULES if rule.when(facts)]

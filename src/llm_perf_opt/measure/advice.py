"""What to try next, as data: rules over a Stage 1 run's records, each proposing one lever with a predicted saving
per page (`records.advice.Advice`), ranked. Pure functions of the records (no torch): `advise(m, whatif)`.

A lever whose every override the run already had is never advised, nor one a what-if run of the same model measured
(its report cites the measurement instead). The prediction is the lever's bound times its kind's calibration
(`records.advice`); the guide (docs/guide/stage1.md, "What to try") explains each rule.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files

import attrs

from llm_perf_opt.kernel_names import COPY, ELEMENTWISE, kernel_kind
from llm_perf_opt.measure.throughput import part_values, run_pages
from llm_perf_opt.measure.whatif import ratio_interval_95
from llm_perf_opt.override_text import override_key, override_value
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records import whatif as whatif_goals
from llm_perf_opt.records.advice import (
    BASIS_FLOOR,
    BASIS_IDLE,
    BASIS_MEMORY,
    FIRST_TOKEN,
    PAGE_LATENCY,
    THROUGHPUT,
    Advice,
    Calibration,
    calibrated,
    shipped_calibration,
)
from llm_perf_opt.records.modules import ModuleAttribution
from llm_perf_opt.records.stage1 import (
    CUDA_GRAPH_MODES,
    PAGE_DECODE,
    PAGE_LM_PREFILL,
    PAGE_PREPROCESS,
    PAGE_VISION,
    ModelInfo,
    PagePart,
    Stage1Metrics,
)
from llm_perf_opt.records.whatif import Lever, PredictionCheck, WhatIfRecord

NOTABLE = 0.05  # a lever whose bound is below this share of its objective's time per page is not advised
MODULE_FAR = 3.0  # measured / floor above which a module is far from its speed of light
MODULE_NOTABLE = 0.05  # its time above the floor, as a share of its stage's time, for a rule to name it
MODULE_FACTS = 3  # rows per stage (largest time above floor first)
DEFAULT_BATCH = 8  # pages per forward advised where the memory pass did not say how many fit
MAX_ADVISED_BATCH = 64
EXPERTS_WORDS = ("experts", "moe")
ATTENTION_WORDS = ("attn", "attention")
GRAPHS_MODE = CUDA_GRAPH_MODES[0]  # reduce-overhead
FILL_KEYS = frozenset({"run.fill_batches"})  # fills a batch with copies of the inputs: no lever of its own


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
    def kernel_kind(self) -> str:
        """GEMM, attention, elementwise, copy or other: what its largest kernel does (`kernel_names.kernel_kind`)."""
        return kernel_kind(self.top_kernel or "")

    @property
    def role(self) -> str:
        """ "experts" or "attention" by the module's name, else its largest kernel's kind."""
        where = f"{self.module} {self.module_type}".lower()
        if any(w in where for w in EXPERTS_WORDS):
            return "experts"
        return "attention" if any(w in where for w in ATTENTION_WORDS) else self.kernel_kind


def module_facts(a: ModuleAttribution | None) -> tuple[ModuleFact, ...]:
    """Per stage, at most MODULE_FACTS modules MODULE_FAR× above their floor and MODULE_NOTABLE of the stage
    above it, largest share of the stage first."""
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


def setting_of(m: Stage1Metrics, key: str) -> str | None:
    """The value a run had for an override's key, as an override writes it; None where the run did not record it."""
    r, model = m.settings.runtime, m.model
    recorded: dict[str, object] = {
        "runtime.kv_cache": r.kv_cache,
        "runtime.compile": r.compile,
        "runtime.compile_mode": r.compile_mode if r.compile != "none" else None,  # a mode compiles nothing alone
        "runtime.compile_vision": r.compile_vision,
        "runtime.batch_vision": r.batch_vision,
        "runtime.preprocess_workers": r.preprocess_workers,
        "runtime.prefetch_pages": r.prefetch_pages,
        "runtime.quantize": r.quantize,
        "run.batch_size": m.settings.batch_size,
        "run.fill_batches": m.settings.fill_batches,
        "model.experts_implementation": model.experts_implementation,
        "model.attn_implementation": model.attn_implementation,
    }
    if key.startswith("model.preprocess."):
        recorded[key] = (model.preprocess or {}).get(key.removeprefix("model.preprocess."))
    value = recorded.get(key)
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def in_force(m: Stage1Metrics, override: str) -> bool:
    """Whether the run already ran with this override (`key=value`)."""
    return setting_of(m, override_key(override)) == override_value(override)


# Keys a verifying run repeats from this run (when not at their default), so only the lever differs.
_KEPT = {
    "runtime.kv_cache": "dynamic",
    "runtime.compile": "none",
    "runtime.compile_mode": GRAPHS_MODE,
    "runtime.compile_vision": "none",
    "runtime.batch_vision": "false",
    "runtime.preprocess_workers": "0",
    "runtime.prefetch_pages": "false",
    "runtime.quantize": "none",
    "run.batch_size": "1",
    "run.fill_batches": "false",
    "model.preprocess.device": "cpu",
}


def run_workload(m: Stage1Metrics, changes: Sequence[str] = ()) -> tuple[str, ...]:
    """The `stage1-run` overrides that repeat this run: its model (where it is a shipped config), named workload,
    decode length and the runtime settings it had off their defaults, but those `changes` set."""
    shipped = files("llm_perf_opt").joinpath("conf", "model", f"{m.model.name}.yaml").is_file()
    kept = [f"model={m.model.name}"] if shipped else []
    if m.settings.workload_profile:
        kept.append(f"workload={m.settings.workload_profile['name']}")
    kept.append(f"infer.max_new_tokens={m.settings.max_new_tokens}")
    changed = {override_key(c) for c in changes}
    for key, default in _KEPT.items():
        value = setting_of(m, key)
        if key not in changed and value is not None and value != default:
            kept.append(f"{key}={value}")
    return tuple(kept)


def verify_command(m: Stage1Metrics, changes: Sequence[str]) -> str:
    """`stage1-run` on this run's model, workload and settings with the lever's overrides on top: its folder
    against this one (`perf-compare`) measures the saving; `perf-whatif whatif=advised` measures them all."""
    return " ".join(["stage1-run", *run_workload(m, changes), *changes])


@attrs.frozen
class RunFacts:
    """What the rules read, computed once from a run's records: its settings, the time per page split into parts
    beside their floors, the GPU's busy share of a decode step, the modules far above their floor."""

    m: Stage1Metrics
    batch: int
    parts: Mapping[str, PagePart]
    busy_fraction: float | None  # decode steps, profiled pass (CUDA)
    modules: tuple[ModuleFact, ...]
    bound_by: str | None  # the part holding the most time per page

    @classmethod
    def of(cls, m: Stage1Metrics) -> RunFacts:
        pages = run_pages(m)
        activity = m.profiler.activity if m.profiler else None
        return cls(
            m=m,
            batch=pages.batch_size if pages else max(m.settings.batch_size, 1),
            parts={p.part: p for p in pages.parts} if pages else {},
            busy_fraction=activity.busy_fraction if activity is not None and activity.wall_ms_mean > 0 else None,
            modules=module_facts(m.modules),
            bound_by=bound.part if pages and (bound := pages.bound_by) else None,
        )

    @property
    def cuda(self) -> bool:
        return self.m.device.type == "cuda"

    @property
    def vision(self) -> tuple[str, ...]:
        """What a vision lever acts on: the run's vision stages."""
        return tuple(self.m.vision_stages) or (PAGE_VISION,)

    def ms(self, part: str) -> float:
        p = self.parts.get(part)
        return p.ms_per_page if p else 0.0

    def above_floor(self, part: str) -> float | None:
        """A part's time per page above its floor; None where the floor is not priced."""
        p = self.parts.get(part)
        if p is None or p.floor_ms_per_page is None:
            return None
        return max(p.ms_per_page - p.floor_ms_per_page, 0.0)

    def objective(self, parts: Sequence[str], objective: str | None = None) -> tuple[str, float]:
        """The figure a lever acting on `parts` serves (unless `objective` names it) and its time per page: throughput
        at a batch above 1; at batch 1 the first token before decode, the page's latency for a lever on decode."""
        whole = sum(p.ms_per_page for p in self.parts.values())
        if objective == THROUGHPUT or self.batch > 1:
            return THROUGHPUT, whole
        if PAGE_DECODE in parts:
            return PAGE_LATENCY, whole
        return FIRST_TOKEN, whole - self.ms(PAGE_DECODE)

    def per_page(self, fact: ModuleFact) -> float:
        """A module's time above its floor per page: per decode step times the steps of a pass, per pass otherwise,
        over the pages of the profiled forward."""
        steps = max(self.m.settings.max_new_tokens - 1, 1) if fact.stage == vocab.DECODE_STEP else 1
        return fact.above_ms * steps / self.batch

    def modules_of(self, role: str) -> tuple[ModuleFact, ...]:
        return tuple(f for f in self.modules if f.role == role)


@attrs.frozen
class Proposal:
    """What a rule proposes, before it is priced: the lever (overrides, or a code change in words), what it acts on,
    the page parts whose objective it serves, its basis and bound per page."""

    kind: str
    acts_on: tuple[str, ...]
    parts: tuple[str, ...]
    basis: str
    bound_ms: float
    because: str
    overrides: tuple[str, ...] = ()
    code_change: str = ""
    objective: str | None = None  # None: the one its parts serve (`RunFacts.objective`)


def _priced(f: RunFacts, p: Proposal, calibration: Calibration) -> Advice | None:
    """The proposal as advice: only the overrides not already in force, its saving from the calibration; None
    when none is left or the bound is too small to matter."""
    changes = tuple(o for o in p.overrides if not in_force(f.m, o))
    if p.overrides and not changes:
        return None
    objective, objective_ms = f.objective(p.parts, p.objective)
    if p.bound_ms <= 0 or objective_ms <= 0 or p.bound_ms < NOTABLE * objective_ms:
        return None
    saving, low, high = calibration.of(p.kind).saving(min(p.bound_ms, objective_ms))
    return Advice(
        lever=" ".join(changes) or p.code_change,
        overrides=changes,
        kind=p.kind,
        acts_on=p.acts_on,
        objective=objective,
        objective_ms=objective_ms,
        basis=p.basis,
        bound_ms=p.bound_ms,
        saving_ms=saving,
        saving_low_ms=low,
        saving_high_ms=high,
        because=p.because,
        command=verify_command(f.m, changes) if changes else "",
        parts=p.parts,
    )


def _floor_proposal(
    f: RunFacts, kind: str, acts_on: tuple[str, ...], part: str, overrides: tuple[str, ...], note: str = ""
) -> Proposal | None:
    """A lever bound by one part's time per page above its floor; None where that floor is not priced."""
    above = f.above_floor(part)
    if above is None:
        return None
    p = f.parts[part]
    because = f"{part} {p.ms_per_page:,.1f} ms/page, floor {p.floor_ms_per_page or 0.0:,.1f} ms{note}"
    return Proposal(kind, acts_on, (part,), BASIS_FLOOR, above, because, overrides)


def _compile_overrides(f: RunFacts, compile_value: str) -> tuple[str, ...]:
    """A compiled decoder (`compile_value`) on a static cache, in CUDA graphs on a GPU (the run's own mode kept
    where it already compiled)."""
    r = f.m.settings.runtime
    mode = r.compile_mode if r.compile != "none" else (GRAPHS_MODE if f.cuda else "default")
    return ("runtime.kv_cache=static", f"runtime.compile={compile_value}", f"runtime.compile_mode={mode}")


def decode_graphs(f: RunFacts) -> Proposal | None:
    """Decode launch-bound: the step replayed from CUDA graphs removes up to the GPU's idle time between its
    kernels (the profiled pass's busy share of a step); without a profiled pass, up to decode's time above floor."""
    r = f.m.settings.runtime
    if not f.cuda or r.uses_cuda_graphs or PAGE_DECODE not in f.parts:
        return None
    compile_value = r.compile if r.compile != "none" else "decode"
    overrides = ("runtime.kv_cache=static", f"runtime.compile={compile_value}", f"runtime.compile_mode={GRAPHS_MODE}")
    if f.busy_fraction is None:
        return _floor_proposal(f, "cuda_graphs", (vocab.DECODE,), PAGE_DECODE, overrides)
    decode = f.ms(PAGE_DECODE)
    idle = decode * (1 - f.busy_fraction)
    because = f"decode {decode:,.1f} ms/page, GPU busy {f.busy_fraction:.0%} of each step"
    return Proposal("cuda_graphs", (vocab.DECODE,), (PAGE_DECODE,), BASIS_IDLE, idle, because, overrides)


def compile_prefill(f: RunFacts) -> Proposal | None:
    """The language model's prefill above its floor: compiled with decode (`runtime.compile=prefill_decode`)."""
    if f.m.settings.runtime.compile == "prefill_decode":
        return None
    acts_on = (vocab.PREFILL + " (language model)",)
    return _floor_proposal(f, "compile_prefill", acts_on, PAGE_LM_PREFILL, _compile_overrides(f, "prefill_decode"))


def batch_vision(f: RunFacts) -> Proposal | None:
    """At a batch above 1 bound by vision: the batch's views through vision together (`runtime.batch_vision=true`)."""
    if f.batch < 2 or f.bound_by != PAGE_VISION:
        return None
    note = f"; it bounds the batch of {f.batch}"
    return _floor_proposal(f, "batch_vision", f.vision, PAGE_VISION, ("runtime.batch_vision=true",), note)


def compile_vision(f: RunFacts) -> Proposal | None:
    """Vision above its floor on a GPU: its modules compiled in CUDA graphs (`runtime.compile_vision`)."""
    if not f.cuda:
        return None
    return _floor_proposal(f, "compile_vision", f.vision, PAGE_VISION, (f"runtime.compile_vision={GRAPHS_MODE}",))


def preprocess_on_gpu(f: RunFacts) -> Proposal | None:
    """Host preprocessing where the model offers it on the GPU (`model.preprocess.device=cuda`); all of it counts."""
    pre = f.ms(PAGE_PREPROCESS)
    if not f.cuda or (f.m.model.preprocess or {}).get("device") != "cpu" or pre <= 0:
        return None
    because = f"preprocess {pre:,.1f} ms/page on the host, no floor priced"
    overrides = ("model.preprocess.device=cuda",)
    return Proposal("gpu_preprocess", (vocab.PREPROCESS,), (PAGE_PREPROCESS,), BASIS_FLOOR, pre, because, overrides)


def prefetch_pages(f: RunFacts) -> Proposal | None:
    """Page images preprocessed in each pass on a GPU: the next pass's page files decoded on threads while the GPU
    runs this one (`runtime.prefetch_pages=true`), off the path of a stream of pages; up to the whole preprocessing
    (no floor priced), for throughput. Text prompts have nothing to decode ahead."""
    pre = f.ms(PAGE_PREPROCESS)
    if not f.cuda or f.m.settings.input_kind != "image" or pre <= 0:
        return None
    on_gpu = (f.m.model.preprocess or {}).get("device") == "cuda"
    where = "its page files decoded on the host, the rest on the GPU" if on_gpu else "all on the host, decoding in it"
    return Proposal(
        "overlap_preprocess",
        (vocab.PREPROCESS,),
        (PAGE_PREPROCESS,),
        BASIS_FLOOR,
        pre,
        f"preprocess {pre:,.1f} ms/page in each pass, no floor priced ({where})",
        ("runtime.prefetch_pages=true",),
        objective=THROUGHPUT,  # the pages behind it wait less; a page's own first token does not move
    )


def larger_batch(f: RunFacts) -> Proposal | None:
    """Batch 1 on a GPU: B pages per forward read the weights once per step for all of them, so decode's time per
    page falls toward 1/B of it (B: the most the memory pass says fit, at most MAX_ADVISED_BATCH, else
    DEFAULT_BATCH); up to decode × (1 − 1/B) per page, for throughput."""
    if not f.cuda or f.batch != 1 or PAGE_DECODE not in f.parts:
        return None
    fit = f.m.memory.fit if f.m.memory is not None else None
    fits = fit.max_batch if fit is not None and fit.max_batch else None
    size = min(fits, MAX_ADVISED_BATCH) if fits else DEFAULT_BATCH
    if size < 2:
        return None
    decode = f.ms(PAGE_DECODE)
    room = f"{fits} fit in memory" if fits else "the memory pass did not say how many fit"
    fill = ("run.fill_batches=true",) if len(f.m.images) < size else ()  # copies of the inputs fill the batch
    because = f"decode {decode:,.1f} ms/page at batch 1; {room}"
    overrides = (f"run.batch_size={size}", *fill)
    bound = decode * (1 - 1 / size)
    return Proposal(
        "batch", (vocab.DECODE,), (PAGE_DECODE,), BASIS_MEMORY, bound, because, overrides, objective=THROUGHPUT
    )


def _module_proposal(f: RunFacts, role: str, kind: str, overrides: tuple[str, ...], code: str) -> Proposal | None:
    facts = f.modules_of(role)
    if not facts:
        return None
    top = facts[0]
    parts = (PAGE_DECODE,) if any(x.stage == vocab.DECODE_STEP for x in facts) else (PAGE_VISION, PAGE_LM_PREFILL)
    kernels = f", mostly {top.kernel_kind} kernels" if top.top_kernel else ""
    because = f"`{top.module}` ({top.stage}) {top.ratio:,.1f}× its floor{kernels}"
    acts_on = tuple(dict.fromkeys(x.module for x in facts))
    return Proposal(kind, acts_on, parts, BASIS_FLOOR, sum(f.per_page(x) for x in facts), because, overrides, code)


GROUPED_EXPERTS = "model.experts_implementation=grouped_mm"  # the experts' grouped GEMM backend
SDPA_ATTENTION = "model.attn_implementation=sdpa"  # the fused attention backend
FUSED_EXPERTS = "a fused routed-experts kernel"  # the code change past the grouped GEMM


def experts_backend(f: RunFacts) -> Proposal | None:
    """MoE experts far above their floor running the eager per-expert loop: a grouped GEMM runs them in one launch."""
    if not f.cuda or f.m.model.experts_implementation != "eager":
        return None
    return _module_proposal(f, "experts", "experts_backend", (GROUPED_EXPERTS,), "")


def fused_experts(f: RunFacts) -> Proposal | None:
    """MoE experts far above their floor under a grouped GEMM backend: the routing around it (sort, gather, scatter)
    and the gate/up, activation and down launches, run by one fused kernel (as vLLM's fused_moe): a code change."""
    if not f.cuda or f.m.model.experts_implementation == "eager":
        return None
    facts = f.modules_of("experts")
    if not facts:
        return None
    code = f"{FUSED_EXPERTS} for `{facts[0].module}` (routing, gate/up, activation, down in one)"
    return _module_proposal(f, "experts", "fused_experts", (), code)


def attention_backend(f: RunFacts) -> Proposal | None:
    """Attention far above its floor with eager attention: a fused backend (SDPA) avoids materialising the scores."""
    if f.m.model.attn_implementation != "eager":
        return None
    return _module_proposal(f, "attention", "attention_backend", (SDPA_ATTENTION,), "")


def fuse(f: RunFacts, role: str) -> Proposal | None:
    """Modules far above their floor whose largest kernels are elementwise or copies, where compiling is already in
    force for their stage (else the compile levers above cover them): fuse them in the module's code."""
    r = f.m.settings.runtime
    facts = f.modules_of(role)
    decoder = any(not vocab.is_vision(x.stage) for x in facts)
    if not facts or (r.compile == "none" if decoder else r.compile_vision == "none"):
        return None
    what = "elementwise kernels" if role == ELEMENTWISE else "layout copies"
    return _module_proposal(f, role, f"fuse_{role}", (), f"fuse the {what} of `{facts[0].module}` in its forward")


@attrs.frozen
class Remainder:
    """A module of the decode step far above its floor once the step replays from CUDA graphs, and what it needs."""

    module: str
    above_ms: float  # per decode step
    ratio: float  # its time over its floor
    needs: str  # the lever, or the code change that no setting runs


@attrs.frozen
class DecodeRemainder:
    """What holds a graph-replayed decode step above its floor: its GPU kernel time, the floor, the modules."""

    step_ms: float
    floor_ms: float
    modules: tuple[Remainder, ...]


def _needs(model: ModelInfo, fact: ModuleFact, moe: bool) -> str:
    """The lever a decode-step module far above its floor needs, in words: a setting where one exists, else the
    kernel no setting runs (`moe`: experts are among the modules far above their floor, so an `.mlp` is their block)."""
    where = f"{fact.module} {fact.module_type}".lower()
    if fact.role == "experts":
        return f"`{GROUPED_EXPERTS}`" if model.experts_implementation == "eager" else f"{FUSED_EXPERTS} (a code change)"
    if fact.role == "attention":
        if model.attn_implementation == "eager":
            return f"`{SDPA_ATTENTION}`"
        return "a decode attention kernel for one query token, split over the cache (a code change)"
    if "router" in where or fact.module.endswith(".gate") or (moe and fact.module.endswith(".mlp")):
        return "the routing (top-k, sort, gather, scatter) fused into the experts kernel (a code change)"
    return f"fewer, fused {fact.kernel_kind} kernels in its forward (a code change)"


def decode_remainder(m: Stage1Metrics) -> DecodeRemainder | None:
    """Past the launch floor: a graph-replayed decode step's kernel time against its floor and the modules holding
    most of the rest (`module_facts`), each with the lever it needs; None without graphs, a profiled step or floor."""
    step = next((s for s in m.modules.stages if s.stage == vocab.DECODE_STEP), None) if m.modules else None
    if m.device.type != "cuda" or not m.settings.runtime.uses_cuda_graphs or step is None or not step.floor_ms:
        return None
    facts = module_facts(m.modules)
    moe = any(x.role == "experts" for x in facts)
    held = tuple(
        Remainder(x.module, x.above_ms, x.ratio, _needs(m.model, x, moe)) for x in facts if x.stage == step.stage
    )
    return DecodeRemainder(step.total_ms, step.floor_ms, held) if held else None


RULES: tuple[Callable[[RunFacts], Proposal | None], ...] = (
    decode_graphs,
    compile_prefill,
    batch_vision,
    compile_vision,
    preprocess_on_gpu,
    prefetch_pages,
    larger_batch,
    experts_backend,
    fused_experts,
    attention_backend,
    lambda f: fuse(f, ELEMENTWISE),
    lambda f: fuse(f, COPY),
)


def advise(
    m: Stage1Metrics, whatif: WhatIfRecord | None = None, calibration: Calibration | None = None
) -> tuple[Advice, ...]:
    """Every lever the rules propose for the run, priced, best predicted speed-up first; none the run already had,
    none whose every key a what-if run measured (`whatif`: its report cites the measurement), none predicted to save
    nothing (its kind's calibrated share is 0: where measured, it saved nothing or cost time)."""
    facts = RunFacts.of(m)
    calibration = calibration or shipped_calibration()
    tried = {override_key(o) for o in whatif.measured_overrides()} if whatif is not None else set()
    out = []
    for rule in RULES:
        proposal = rule(facts)
        advice = None if proposal is None else _priced(facts, proposal, calibration)
        keys = {override_key(o) for o in advice.overrides} - FILL_KEYS if advice is not None else set()
        if advice is not None and advice.saving_ms > 0 and not (keys and keys <= tried):
            out.append(advice)
    return tuple(sorted(out, key=lambda a: -(a.speedup or 0.0)))


# ---- the advice measured: `perf-whatif whatif=advised` -----------------------------------------------------------

ADVISED_LEVERS = 5  # the most advised levers one what-if run takes (best predicted first)
# The what-if goal each advice objective is ranked by (`records.whatif` goals).
WHATIF_GOALS = {
    PAGE_LATENCY: whatif_goals.PAGE_LATENCY,
    FIRST_TOKEN: whatif_goals.FIRST_TOKEN,
    THROUGHPUT: whatif_goals.THROUGHPUT,
}
_WHOLE = (PAGE_PREPROCESS, PAGE_VISION, PAGE_LM_PREFILL, PAGE_DECODE)
# The parts of the time per page each objective is the sum of (`RunFacts.objective`): the first token's, all but decode.
OBJECTIVE_PARTS = {PAGE_LATENCY: _WHOLE, THROUGHPUT: _WHOLE, FIRST_TOKEN: _WHOLE[:-1]}
SAME_WORKLOAD = 0.25  # a baseline's objective per page within this share of the advised run's: the same workload


def needs_cuda(overrides: Sequence[str]) -> bool:
    """Whether a lever runs only on a GPU: a compile mode that captures CUDA graphs (for the decoder or the vision
    stages), or a stage placed on CUDA (`model.preprocess.device=cuda`)."""
    for override in overrides:
        key, value = override_key(override), override_value(override) or ""
        if key in ("runtime.compile_mode", "runtime.compile_vision") and value in CUDA_GRAPH_MODES:
            return True
        if key.endswith(".device") and value.startswith("cuda"):
            return True
    return False


def advised_levers(
    advice: Sequence[Advice], most: int = ADVISED_LEVERS
) -> tuple[tuple[Lever, ...], tuple[Advice, ...]]:
    """The levers a what-if run measures (the first `most` pieces of advice that set overrides, each named by its
    kind and carrying its prediction), and the advice left out (code changes, and levers past `most`)."""
    runnable = [a for a in advice if a.overrides]
    levers = tuple(
        Lever(
            name=a.kind,
            overrides=a.overrides,
            about=f"advised ({a.basis}: {a.because}): {a.saving_ms:,.1f} ms/page predicted off {a.objective}",
            needs="cuda" if needs_cuda(a.overrides) else None,
            advice=a,
        )
        for a in runnable[:most]
    )
    return levers, tuple(a for a in advice if a.code_change or a in runnable[most:])


def whatif_goal(advice: Sequence[Advice]) -> str:
    """The what-if goal an advised run ranks by: the best advice's objective (page latency without any)."""
    return WHATIF_GOALS[advice[0].objective] if advice else whatif_goals.PAGE_LATENCY


@attrs.frozen
class _Saving:
    """The time per page of some parts at the baseline less at a rung (p50 over the timed forwards), with its 95%
    interval (the ratio of geometric means, `measure.whatif.ratio_interval_95`, scaled by the baseline's)."""

    ms: float
    low: float | None
    high: float | None


def objective_ms(m: Stage1Metrics, objective: str) -> float | None:
    """An advice objective's time per page in a run, as the advice reads it (its parts' p50s summed)."""
    pages = run_pages(m)
    parts = {p.part: p.ms_per_page for p in pages.parts} if pages else {}
    return sum(parts.get(part, 0.0) for part in OBJECTIVE_PARTS[objective]) if parts else None


def measured_saving(base: Stage1Metrics, rung: Stage1Metrics, parts: Sequence[str]) -> _Saving | None:
    """How much less time per page `parts` took in `rung` than in `base`; None where either has no timed forward."""
    before, after = part_values(base, parts), part_values(rung, parts)
    if not before or not after:
        return None
    base_ms = statistics.median(before)
    interval = ratio_interval_95(before, after)
    low, high = (None, None) if interval is None else (base_ms * (1 - interval[1]), base_ms * (1 - interval[0]))
    return _Saving(base_ms - statistics.median(after), low, high)


def prediction_check(
    name: str,
    advice: Advice,
    base: Stage1Metrics | None = None,
    rung: Stage1Metrics | None = None,
    why_not: str | None = None,
) -> PredictionCheck:
    """One piece of advice, predicted against measured: the saving on the parts its bound lies in (the whole
    objective where it names none), and on the whole objective, of `rung` against `base` (both measured)."""
    whole = OBJECTIVE_PARTS[advice.objective]
    check = PredictionCheck(
        lever=name,
        kind=advice.kind,
        objective=advice.objective,
        parts=advice.parts or whole,
        bound_ms=advice.bound_ms,
        predicted_ms=advice.saving_ms,
        predicted_low_ms=advice.saving_low_ms,
        predicted_high_ms=advice.saving_high_ms,
        advised_ms=advice.objective_ms,
        baseline_ms=None if base is None else objective_ms(base, advice.objective),
        why_not=why_not,
    )
    if base is None or rung is None or (on_parts := measured_saving(base, rung, check.parts)) is None:
        return check
    on_whole = measured_saving(base, rung, whole)
    return attrs.evolve(
        check,
        measured_ms=on_parts.ms,
        measured_low_ms=on_parts.low,
        measured_high_ms=on_parts.high,
        objective_saving_ms=None if on_whole is None else on_whole.ms,
    )


def same_workload(check: PredictionCheck) -> bool:
    """Whether the baseline measured the advised run's workload: its objective per page within SAME_WORKLOAD of the
    advised run's (another model, decode length or host moves it further)."""
    if check.baseline_ms is None or check.advised_ms <= 0:
        return False
    return abs(check.baseline_ms / check.advised_ms - 1) <= SAME_WORKLOAD


def calibration_from(calibration: Calibration, record: WhatIfRecord) -> tuple[Calibration, tuple[str, ...]]:
    """The calibration with an advised what-if run's measured savings folded in (`records.advice.calibrated`, the
    run's id, device and date as its source), and one line per prediction: folded in, or left out and why (not
    measured, a baseline of another workload than the advised run's, already folded in)."""
    lines = []
    source = f"{record.run_id} ({record.device or 'device not recorded'}, {record.created[:10]})"
    for check in record.predictions:
        where = f"{record.run_id} {check.lever} ({check.kind})"
        if check.measured_ms is None:
            lines.append(f"{where}: left out, not measured ({check.why_not or 'no saving measured'})")
        elif not same_workload(check):
            baseline = "not measured" if check.baseline_ms is None else f"{check.baseline_ms:,.1f}"
            lines.append(
                f"{where}: left out, the baseline's {check.objective} ({baseline} ms/page) is not the advised run's "
                f"({check.advised_ms:,.1f} ms/page) within {SAME_WORKLOAD:.0%}: another workload or host"
            )
        elif source in calibration.of(check.kind).sources:
            lines.append(f"{where}: left out, already folded in")
        else:
            calibration = calibrated(calibration, check.kind, check.bound_ms, check.measured_ms, source=source)
            share = max(check.measured_ms, 0.0) / check.bound_ms if check.bound_ms > 0 else 0.0
            lines.append(
                f"{where}: folded in, {check.measured_ms:,.1f} of a {check.bound_ms:,.1f} ms/page bound "
                f"(share {share:.2f}); factor now {calibration.of(check.kind).factor:.3f}"
            )
    return calibration, tuple(lines)

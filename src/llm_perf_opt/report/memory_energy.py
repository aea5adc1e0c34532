"""report.md's "Memory by stage" and "Energy" sections, from `Stage1Metrics.memory` and `.energy`."""

from __future__ import annotations

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import (
    IDLE_SLEEP,
    EnergyPass,
    EnergyReport,
    FitPrediction,
    MemoryBreakdown,
    MemoryPass,
    MemoryReport,
    StageEnergy,
)
from llm_perf_opt.report.markdown import Doc, flops, link, num_bytes, number

_ORDER = (vocab.E2E, vocab.PREPROCESS, vocab.PREFILL, vocab.DECODE, vocab.DECODE_STEP)


def _label(stage: str) -> str:
    if stage == vocab.E2E:
        return "whole pass"
    if vocab.is_vision(stage) or stage == vocab.DECODE_STEP:
        return f"↳ {stage}" + (" (largest step)" if stage == vocab.DECODE_STEP else "")
    return stage


def _ordered(parts: tuple[MemoryBreakdown, ...]) -> list[MemoryBreakdown]:
    """The whole pass first, then the stages in pass order (vision under prefill)."""

    def rank(b: MemoryBreakdown) -> tuple[int, int]:
        if vocab.is_vision(b.stage):
            return (_ORDER.index(vocab.PREFILL), 1)
        return (_ORDER.index(b.stage) if b.stage in _ORDER else len(_ORDER), 0 if b.stage != vocab.DECODE_STEP else 2)

    return sorted(parts, key=rank)


def _row(b: MemoryBreakdown) -> dict[str, str]:
    activations = b.activations_bytes
    return {
        "stage": _label(b.stage),
        "peak allocated": num_bytes(b.peak_allocated_bytes),
        "weights": num_bytes(b.weights_bytes),
        "KV cache": num_bytes(b.kv_cache_bytes),
        "other resident": num_bytes(b.resident_other_bytes),
        "activations / workspace": ("−" + num_bytes(-activations)) if activations < 0 else num_bytes(activations),
        "reserved (peak)": num_bytes(b.reserved_bytes),
        "allocator slack": num_bytes(b.allocator_slack_bytes),
    }


def _opened(doc: Doc, title: str, available: bool, reason: str | None) -> bool:
    """The section's heading; when its pass gave nothing, the reason under it and False."""
    doc.h2(title)
    if not available:
        doc.para(f"Not available: {reason}.")
    return available


def memory_section(doc: Doc, memory: MemoryReport | None, timeline: str | None) -> None:
    """The memory pass: peaks per stage in parts, the analytic expectation, graph pools, snapshot, what fits. A
    folder written before the memory pass existed (`memory` None) gets no section, so its report rebuilds as it
    was."""
    if memory is None or not _opened(
        doc, "Memory by stage", memory.available and memory.measured is not None, memory.reason
    ):
        return
    p = memory.measured
    assert p is not None
    doc.para(
        f"One untimed pass over {p.input} after the timed passes (batch {p.batch_size}, {p.new_tokens} new tokens, "
        f"{p.context_tokens} KV positions per sequence at the end). Peak allocated = torch.cuda.max_memory_allocated "
        "between stage boundaries (the peak counters are reset at each boundary and folded into every open stage). "
        "Parts sum to the peak: weights (parameters + buffers) + KV cache (the cache's tensors at the boundary after "
        "the peak) + other resident (allocated before the pass besides both) + activations / workspace (the rest). "
        "Allocator slack = reserved − allocated at the peak, on top of it."
    )
    doc.keyed_table([_row(b) for b in _ordered(memory.breakdown)])
    doc.bullets(_memory_notes(memory, p))
    if timeline:
        doc.image("Allocated and reserved memory over the memory pass", timeline)
    if memory.fit is not None:
        doc.h3("Fits on this GPU")
        doc.bullets(fit_lines(memory.fit, p))


def _memory_notes(memory: MemoryReport, p: MemoryPass) -> list[str]:
    """The analytic expectation, the CUDA-graph pools and the snapshot."""
    out = []
    a = memory.analytic
    if a is not None:
        ratio = "n/a" if a.ratio is None else f"{a.ratio:,.2f}×"
        out.append(
            f"Analytic expectation: {num_bytes(a.weights_bytes)} weights + {num_bytes(a.kv_bytes)} KV cache + "
            f"{num_bytes(a.largest_activation_bytes)} largest activation = {num_bytes(a.expected_bytes)}; measured "
            f"peak {num_bytes(a.measured_bytes)} = {ratio} of it ({a.method})."
        )
    out.append(f"KV cache per token (one sequence): {num_bytes(p.kv_bytes_per_token)} — {p.kv_per_token_source}.")
    if p.graph_pools is not None and p.graph_pools.segments:
        g = p.graph_pools
        out.append(
            f"CUDA-graph private pools: {g.segments} segment(s), {num_bytes(g.reserved_bytes)} reserved, "
            f"{num_bytes(g.allocated_bytes)} allocated ({p.graph_pools_note}); counted in reserved and, where "
            "allocated before the pass, in other resident."
        )
    elif p.graph_pools is not None:
        out.append("CUDA-graph private pools: none in the allocator snapshot.")
    else:
        out.append(f"CUDA-graph private pools: {p.graph_pools_note or 'not identified; included in reserved'}.")
    if p.snapshot is not None:
        out.append(f"Allocator snapshot: {link(p.snapshot, p.snapshot)} ({p.snapshot_note}).")
    else:
        out.append(f"Allocator snapshot: {p.snapshot_note or 'not saved'}.")
    return out


def vision_peak_caveat(p: MemoryPass) -> str:
    """Where the whole pass peaks inside a vision stage: the vision encoder runs one image at a time, so that peak
    does not grow with the batch and the per-page figure (hence the bound) is conservative."""
    whole = next((s for s in p.peaks if s.stage == vocab.E2E), None)
    vision = [s for s in p.peaks if vocab.is_vision(s.stage)]
    at = next((s for s in vision if whole is not None and s.peak_allocated_bytes == whole.peak_allocated_bytes), None)
    if at is None:
        return ""
    return (
        f" The peak is in {at.stage}, which encodes one image at a time and does not grow with the batch: this "
        "bound is conservative (a batch holds more pages, up to the decoder's own per-page growth)."
    )


def fit_lines(f: FitPrediction, p: MemoryPass) -> list[str]:
    """The fit prediction with its arithmetic."""
    room = f.total_bytes - f.fixed_bytes
    out = [
        f"GPU memory {num_bytes(f.total_bytes)}; fixed {num_bytes(f.fixed_bytes)} (outside PyTorch's allocator "
        f"{num_bytes(p.outside_allocator_bytes)} + weights + other resident + allocator slack); room "
        f"{num_bytes(room)}.",
    ]
    if f.max_batch is None:
        out.append("Largest batch: n/a (no activations or KV cache above the weights were measured).")
    else:
        out.append(
            f"Largest batch of pages: ⌊{num_bytes(room)} / {num_bytes(f.per_page_bytes)} per page⌋ = {f.max_batch} "
            f"(activations + KV cache at the peak / batch {p.batch_size}, which grow with the batch; the weights "
            "do not)." + vision_peak_caveat(p)
        )
    if f.max_context_tokens is None or f.kv_bytes_per_token is None:
        out.append("Longest context: n/a (no KV bytes per token).")
    else:
        out.append(
            f"Longest context at batch {p.batch_size}: ⌊({num_bytes(room)} − activations) / "
            f"{num_bytes(f.kv_bytes_per_token)} per position⌋ = {f.max_context_tokens:,} tokens (the measured "
            "activations kept, the KV cache grown; a longer prompt's prefill activations would grow too)"
            + (
                f"; the model itself takes at most {p.max_positions:,} positions (max_position_embeddings)."
                if p.max_positions is not None
                else "."
            )
        )
    return out


def _energy_row(s: StageEnergy) -> dict[str, str]:
    return {
        "stage": s.stage,
        "J per pass": number(s.joules, 3),
        "ms per pass": number(None if s.seconds is None else s.seconds * 1e3, 1),
        "mean W": number(s.watts, 1),
        "J above idle": number(s.above_idle_joules, 3),
        "FLOPs per pass": flops(s.flops),
        "GFLOP/J": "n/a" if s.flop_per_joule is None else f"{s.flop_per_joule / 1e9:,.1f}",
        "note": s.note,
    }


def _decode_power(energy: EnergyReport) -> str:
    """The decode loop's mean power: the steady figure where J per token follows a host-paced step's time."""
    decode = next((s for s in energy.stages if s.stage == vocab.DECODE and s.watts is not None), None)
    if decode is None or decode.watts is None:
        return ""
    return (
        f"; mean power while decoding {decode.watts:,.1f} W (steadier between runs than J per token when the "
        "host sets the step's pace: compare J per token at equal step times)"
    )


def _idle_source(source: str) -> str:
    return "a sleep" if source == IDLE_SLEEP else f"during {source}, the GPU idle"


def _loops(e: EnergyPass) -> str:
    """What each energy loop repeated, or why it did not run."""
    parts = []
    if e.prefill is not None:
        parts.append(f"{e.prefill.iterations} prefill-only passes in {e.prefill.seconds:,.2f} s")
    elif e.prefill_note:
        parts.append(f"no prefill-only loop ({e.prefill_note})")
    if e.decode is not None:
        parts.append(
            f"the pass's decode steps {e.decode.iterations} times over in {e.decode.seconds:,.2f} s (the KV cache "
            "rewound to the prompt each time)"
        )
    elif e.decode_note:
        parts.append(f"no decode-only loop ({e.decode_note})")
    if e.whole is not None:
        parts.append(f"{e.whole.iterations} whole passes in {e.whole.seconds:,.2f} s")
    return "; ".join(parts)


def energy_section(doc: Doc, energy: EnergyReport | None) -> None:
    """Energy per stage, page and token from the NVML counter, or why it is not available (no section for a folder
    written before the energy pass existed)."""
    if energy is None or not _opened(doc, "Energy", energy.available and energy.measured is not None, energy.reason):
        return
    e = energy.measured
    assert e is not None
    doc.para(
        f"{energy.method}. Input {e.input} ({e.pages} page(s) per pass, {e.new_tokens} new tokens each); "
        f"idle {number(energy.idle_watts, 1)} W over {e.idle.seconds:,.2f} s ({_idle_source(e.idle_source)}). "
        f"Loops: {_loops(e)}. GPU energy only (preprocessing runs on the host before the loops)."
    )
    doc.keyed_table([_energy_row(s) for s in energy.stages])
    doc.bullets(
        [
            f"Energy per page: {number(energy.joules_per_page, 3)} J",
            f"Energy per decode token: {number(energy.joules_per_decode_token, 4)} J, of which "
            f"{number(energy.joules_per_decode_token_above_idle, 4)} J above idle (the GPU's work; the rest is idle "
            "power over the step's time, which moves with the host on a launch-bound step)" + _decode_power(energy),
            f"Tokens per joule: {number(energy.tokens_per_joule, 2)} tokens/J (new tokens, the first included, "
            "over the whole pass's energy)",
        ]
    )

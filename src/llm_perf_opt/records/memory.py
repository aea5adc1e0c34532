"""Memory and energy records of a Stage 1 run (`metrics.json`'s `memory` and `energy`): the dedicated memory pass
(peaks per stage, their breakdown, the timeline, what fits on the GPU) and the NVML energy pass (joules per page and
token, watts per stage, FLOP per joule). Both say "not available" with the reason where they could not be measured.
"""

from __future__ import annotations

from typing import TypeVar

import attrs

from llm_perf_opt.records.common import InconsistentRecord

T = TypeVar("T")


def _measured_when_available(report: MemoryReport | EnergyReport, _: attrs.Attribute[T], measured: T) -> None:
    """attrs validator of a pass's report: a measurement when `available`, a reason when not (never "Not available:
    None" in a report)."""
    if report.available and measured is None:
        raise InconsistentRecord(f"{type(report).__name__} says available: true but holds no measurement")
    if not report.available and not report.reason:
        raise InconsistentRecord(f"{type(report).__name__} says available: false but gives no reason")


@attrs.frozen
class MemorySample:
    """The allocator's state at one stage boundary of the memory pass."""

    t_ms: float  # host time since the pass began
    event: str  # "begin" | "end"
    stage: str
    allocated_bytes: int
    reserved_bytes: int
    kv_bytes: int  # bytes of the KV-cache tensors at this boundary


@attrs.frozen
class StagePeak:
    """What the memory pass saw of one stage (the largest over the stage's spans)."""

    stage: str
    spans: int
    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated over the stage (peak stats reset at each boundary)
    peak_reserved_bytes: int  # torch.cuda.max_memory_reserved over the same span
    kv_bytes: int  # KV-cache tensors at the boundary closing the interval that held the peak


@attrs.frozen
class GraphPools:
    """CUDA-graph private memory pools, from the allocator snapshot's segments (`segment_pool_id` ≠ (0, 0))."""

    segments: int
    reserved_bytes: int
    allocated_bytes: int


@attrs.frozen
class MemoryPass:
    """What the memory pass measured (one input or the first batch, after the timed passes; never timed)."""

    input: str  # the input's key (or the batch's)
    batch_size: int
    new_tokens: int
    context_tokens: int  # positions the KV cache held at the end of the pass (per sequence)
    weights_bytes: int  # parameters + buffers of the model on the device
    baseline_allocated_bytes: int  # allocated before the pass (weights, kept static caches, graph pools, …)
    preexisting_kv_bytes: int  # of the pass's own KV cache, allocated before the pass (a reused static cache)
    total_memory_bytes: int  # torch.cuda.get_device_properties(dev).total_memory
    outside_allocator_bytes: int  # total − free − reserved at the end (CUDA context, other processes)
    kv_bytes_per_token: float | None  # one sequence, every layer, K and V
    kv_per_token_source: str
    peaks: tuple[StagePeak, ...]
    samples: tuple[MemorySample, ...]
    graph_pools: GraphPools | None = None
    graph_pools_note: str = ""
    snapshot: str | None = None  # the run-folder path of the allocator snapshot (memory/snapshot.pickle)
    snapshot_note: str | None = None  # why no snapshot was saved, or what it holds
    max_positions: int | None = None  # the decoder config's max_position_embeddings (None: not stated)


@attrs.frozen
class MemoryBreakdown:
    """One stage's peak allocated memory in parts that sum to it exactly, and the allocator slack above it."""

    stage: str
    peak_allocated_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    resident_other_bytes: int  # allocated before the pass besides weights and this pass's KV cache
    activations_bytes: int  # peak − weights − KV − other resident: activations and workspace
    reserved_bytes: int
    allocator_slack_bytes: int  # reserved − allocated at the peak

    @property
    def parts_sum(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.resident_other_bytes + self.activations_bytes


@attrs.frozen
class AnalyticMemory:
    """The expected peak: weights + KV cache for the context + the largest activation, beside the measured."""

    weights_bytes: int
    kv_bytes: float | None  # KV bytes per token × context positions × batch
    largest_activation_bytes: float | None  # the analytic model's largest module activation (None without one)
    expected_bytes: float
    measured_bytes: int
    ratio: float | None  # measured / expected
    method: str


@attrs.frozen
class FitPrediction:
    """What fits in this GPU's memory, from the breakdown (activations and KV scale with the batch, weights do not;
    the longest context keeps the measured batch and activations and grows the KV cache only)."""

    total_bytes: int
    fixed_bytes: int  # outside the allocator + weights + other resident + allocator slack
    per_page_bytes: float  # (activations + KV at the peak) / batch
    max_batch: int | None
    kv_bytes_per_token: float | None  # per position of the whole measured batch
    max_context_tokens: int | None
    note: str = ""


@attrs.frozen
class MemoryReport:
    """`metrics.json` `memory`: the memory pass and what follows from it, or why it is not available."""

    available: bool
    reason: str | None = None  # when not available
    measured: MemoryPass | None = attrs.field(default=None, validator=_measured_when_available)
    breakdown: tuple[MemoryBreakdown, ...] = ()
    analytic: AnalyticMemory | None = None
    fit: FitPrediction | None = None


IDLE_SLEEP = "sleep"  # EnergyPass.idle_source of an idle window that was a sleep of its own


@attrs.frozen
class EnergyWindow:
    """One NVML energy-counter window: repeated work (or idle) between two reads of the counter."""

    what: str  # "idle" | "prefill" | "decode" | "pass"
    iterations: int
    seconds: float  # between the two counter updates that open and close the window
    millijoules: int
    tail_seconds: float = 0.0  # idle wait after the work for the closing update (0 for the idle window)

    @property
    def watts(self) -> float:
        return self.millijoules / 1e3 / self.seconds if self.seconds > 0 else 0.0

    def per_iteration(self, idle_watts: float) -> tuple[float, float]:
        """Joules and seconds of one repetition of the work: the window less its idle tail (at `idle_watts`)."""
        joules = self.millijoules / 1e3 - idle_watts * self.tail_seconds
        return joules / self.iterations, (self.seconds - self.tail_seconds) / self.iterations


@attrs.frozen
class EnergyPass:
    """What the energy pass measured: idle, a prefill-only loop and a decode-only loop (the decode steps of one
    pass repeated over the same prompt), each when it can run; a whole-pass loop where either cannot."""

    input: str
    pages: int  # inputs per pass (the batch)
    new_tokens: int  # per input, the first from prefill
    idle: EnergyWindow
    whole: EnergyWindow | None = None
    prefill: EnergyWindow | None = None
    prefill_note: str | None = None  # why the prefill-only loop did not run
    idle_source: str = IDLE_SLEEP  # what the idle window ran over: a sleep, or CPU-only work the run did anyway
    decode: EnergyWindow | None = None  # one repetition = the pass's decode steps (new_tokens - 1 per input)
    decode_note: str | None = None  # why the decode-only loop did not run


@attrs.frozen
class StageEnergy:
    """Energy of one stage per pass (None where it cannot be told)."""

    stage: str  # "prefill" | "decode" | "pass"
    joules: float | None
    seconds: float | None
    watts: float | None
    above_idle_joules: float | None
    flops: float | None  # counted FLOPs of the stage per pass
    flop_per_joule: float | None
    note: str = ""


@attrs.frozen
class EnergyReport:
    """`metrics.json` `energy`: NVML energy per stage, page and token, or why it is not available."""

    available: bool
    reason: str | None = None
    measured: EnergyPass | None = attrs.field(default=None, validator=_measured_when_available)
    idle_watts: float | None = None
    stages: tuple[StageEnergy, ...] = ()
    joules_per_page: float | None = None
    joules_per_decode_token: float | None = None
    # The decode token's energy above the idle power: the GPU's own work, steady where an eager, launch-bound step's
    # total (idle power x a host-paced step time) moves with the host
    joules_per_decode_token_above_idle: float | None = None
    tokens_per_joule: float | None = None
    method: str = ""

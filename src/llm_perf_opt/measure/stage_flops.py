"""A run's executed FLOPs per stage as figures (`StageFlops`: counted by `instruments.flops`, or priced by the
analytic model), and where a run's FLOPs came from. Pure: no torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import FLOP_SOURCE

# `StageFlops.by_operator` key of transformers' fallback grouped matmul: present when the experts ran through it.
GROUPED_MM_FALLBACK_OP = "transformers.grouped_mm_fallback"


@attrs.frozen
class StageFlops:
    """FLOPs of one image's workload by stage. Decode FLOPs per step are affine in the context length (weights are
    constant per token; attention grows with the keys attended), so two counted steps give every step exactly."""

    prefill: float  # whole prefill forward, vision included
    vision: Mapping[str, float]  # vision sub-stage -> FLOPs (inside prefill)
    decode_step_base: float
    decode_step_per_ctx: float
    prompt_tokens: int
    by_operator: Mapping[str, float]  # aten op -> FLOPs in the prefill
    source: str = FLOP_SOURCE

    def scaled(self, factor: int) -> StageFlops:
        """`factor` copies of this workload as one batch of equal prompts (no padding): every matmul, attention and
        routed-expert row is `factor` times as many, the prompt length the same."""
        return attrs.evolve(
            self,
            prefill=self.prefill * factor,
            vision={stage: value * factor for stage, value in self.vision.items()},
            decode_step_base=self.decode_step_base * factor,
            decode_step_per_ctx=self.decode_step_per_ctx * factor,
            by_operator={op: value * factor for op, value in self.by_operator.items()},
        )

    def decode_step(self, context: int) -> float:
        """FLOPs of the decode step whose query attends to `context` keys."""
        return self.decode_step_base + self.decode_step_per_ctx * context

    def decode_total(self, new_tokens: int) -> float:
        """FLOPs of the new_tokens - 1 decode steps after prefill (step i attends prompt + i keys)."""
        return sum(self.decode_step(self.prompt_tokens + i) for i in range(1, new_tokens))

    def stage_total(self, stage: str, new_tokens: int) -> float | None:
        """FLOPs for a stage name of :mod:`stages`; None where nothing is counted (preprocess)."""
        if stage == vocab.PREFILL:
            return self.prefill
        if stage == vocab.DECODE:
            return self.decode_total(new_tokens)
        if stage == vocab.DECODE_STEP:
            return self.decode_total(new_tokens) / max(new_tokens - 1, 1)
        return self.vision.get(stage)


ANALYTIC_SOURCE = (
    "priced by the analytic model (llm_perf_opt.analytic), which agreed within a millionth with the FLOPs counted "
    "with torch FlopCounterMode on this run's first input; 1 MAC = 2 FLOPs; matmul/conv/attention only"
)


def run_flops_source(counts: Iterable[StageFlops]) -> str:
    """Where a run's FLOPs come from: counted, or counted for the first input and priced for the other shapes."""
    if any(c.source == ANALYTIC_SOURCE for c in counts):
        return (
            f"{FLOP_SOURCE}; the other input shapes priced by the analytic model, which agreed within a millionth "
            "with the count of the run's first input"
        )
    return FLOP_SOURCE

"""Do a run's outputs match the eager dynamic-cache reference of the same input?

A static cache, a compiled step or a batch changes the order of floating-point operations; in bf16 greedy decoding
may then take another token after a near-tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from llm_perf_opt.measure.outputs import first_departure
from llm_perf_opt.records.stage1 import OutputCheck


@attrs.frozen
class ReferenceOutput:
    """The eager dynamic-cache reference of one input."""

    token_ids: tuple[int, ...]
    prefill_logits: torch.Tensor  # (vocab,) float32 on the CPU: the last prompt position


def compare_outputs(tokens: Sequence[int], prefill_logits: torch.Tensor, reference: ReferenceOutput) -> OutputCheck:
    """`tokens` and the (vocab,) `prefill_logits` of a run against `reference`."""
    diff = (prefill_logits.float().cpu() - reference.prefill_logits).abs().max()
    return OutputCheck(
        first_departure=first_departure(tokens, reference.token_ids),
        compared_tokens=min(len(tokens), len(reference.token_ids)),
        prefill_logits_max_abs_diff=float(diff),
    )


class ReferenceOutputs:
    """Reference outputs by input, each computed once and kept."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int], ReferenceOutput] = {}

    def get(self, key: tuple[str, int], run_reference: Callable[[], ReferenceOutput]) -> ReferenceOutput:
        """The reference of input `key` (its name and the number of new tokens), run on first use."""
        if key not in self._kept:
            self._kept[key] = run_reference()
        return self._kept[key]

    def __len__(self) -> int:
        return len(self._kept)

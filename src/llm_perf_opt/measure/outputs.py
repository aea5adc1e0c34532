"""Generated outputs set against each other: where two token sequences depart, and the prefill logits a run keeps
(`run.save_prefill_logits`) so that runs in separate processes can be compared (`perf-whatif`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from llm_perf_opt.records.folders import PREFILL_LOGITS_FILE


def first_departure(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first index where `tokens` and `reference` differ (or where one ends early); None when equal."""
    for index, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def save_prefill_logits(path: Path, logits: Mapping[str, torch.Tensor]) -> None:
    """Input key -> (vocab,) float32 logits at the last prompt position, saved with torch.save."""
    torch.save({key: value.detach().float().cpu() for key, value in logits.items()}, path)


def load_prefill_logits(run_dir: Path) -> dict[str, torch.Tensor]:
    """The prefill logits a run folder kept, by input key; empty when it kept none."""
    path = Path(run_dir) / PREFILL_LOGITS_FILE
    if not path.is_file():
        return {}
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    return {str(k): v for k, v in loaded.items()} if isinstance(loaded, dict) else {}

"""Generated outputs set against each other: where two token sequences depart, whether they depart at a near-tie of
the reference's own logits, and what a run keeps so that runs in separate processes can be compared (`perf-whatif`):
the prefill logits (`run.save_prefill_logits`) and the top two logits behind each token (`run.save_top2_logits`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.folders import PREFILL_LOGITS_FILE, TOP2_LOGITS_FILE
from llm_perf_opt.records.io import RecordError, load_file, save
from llm_perf_opt.records.stage1 import TopTwoLogits, TopTwoRecord
from llm_perf_opt.records.whatif import NearTie

if TYPE_CHECKING:  # torch is imported where tensors are saved or loaded: perf-whatif's parent starts without it
    import torch

log = logging.getLogger("llm_perf_opt.whatif")


def first_departure(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first index where `tokens` and `reference` differ (or where one ends early); None when equal."""
    for index, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def save_prefill_logits(path: Path, logits: Mapping[str, torch.Tensor]) -> None:
    """Input key -> (vocab,) float32 logits at the last prompt position, saved with torch.save."""
    import torch

    torch.save({key: value.detach().float().cpu() for key, value in logits.items()}, path)


def load_prefill_logits(run_dir: Path) -> dict[str, torch.Tensor]:
    """The prefill logits a run folder kept, by input key; empty when it kept none."""
    path = Path(run_dir) / PREFILL_LOGITS_FILE
    if not path.is_file():
        return {}
    import torch

    loaded = torch.load(path, map_location="cpu", weights_only=True)
    return {str(k): v for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def save_top_two(path: Path, by_input: Mapping[str, TopTwoLogits]) -> None:
    """Each input's top-two pass (`run.save_top2_logits`) as `top2_logits.json`."""
    save(TopTwoRecord(schema_version=SCHEMA_VERSION, inputs=dict(by_input)), path)


def load_top_two(run_dir: Path) -> dict[str, TopTwoLogits]:
    """The top-two passes a run folder kept, by input key; empty when it kept none."""
    path = Path(run_dir) / TOP2_LOGITS_FILE
    if not path.is_file():
        return {}
    try:
        return dict(load_file(path, TopTwoRecord).inputs)
    except RecordError as exc:
        log.warning("%s; output departures are judged without the baseline's top two logits (none is a near-tie)", exc)
        return {}


def near_tie(
    tokens: Sequence[int], reference: Sequence[int], top2: TopTwoLogits | None, tolerance: float | None
) -> NearTie | None:
    """Where `tokens` first depart from `reference`, when the two tokens there were the reference's own top two
    (its top-two pass `top2` generated the same tokens before that point): their logits' gap against `tolerance` (a
    fraction of the top logit). None when they do not depart there, or `top2` is missing or saw another context."""
    at = first_departure(tokens, reference)
    if top2 is None or at is None or at >= min(len(tokens), len(reference), len(top2.ids)):
        return None
    if tuple(top2.tokens[:at]) != tuple(reference[:at]) or {tokens[at], reference[at]} != set(top2.ids[at]):
        return None
    high, low = top2.logits[at]
    return NearTie(token=at, gap=high - low, top_logit=high, tolerance=tolerance)


def near_tie_text(tie: NearTie) -> str:
    """A near-tie in a few words: "a near-tie: the baseline's top two logits there 0.012 apart, 0.4% of the top
    logit (tolerance 1%)"."""
    limit = "no tolerance set" if tie.tolerance is None else f"tolerance {share_text(tie.tolerance)}"
    kind = "a near-tie" if tie.within else "a close call beyond the tolerance"
    share = f"{share_text(tie.relative_gap)} of the top logit"
    return f"{kind}: the baseline's top two logits there {tie.gap:.3g} apart, {share} ({limit})"


def share_text(fraction: float) -> str:
    """A fraction as a percentage with the digits it needs: 0.01 -> "1%", 0.0042 -> "0.42%"."""
    return f"{fraction:.2%}".replace(".00%", "%")

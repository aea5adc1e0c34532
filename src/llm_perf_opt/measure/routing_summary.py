"""The experts each decode step's MoE routers picked (`RoutingTrace`, recorded by `instruments.routing`), pooled
over passes into a `RoutingSummary` beside the count uniform routing would hit. Pure: no torch."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records.stage1 import LayerRouting, RoutingSummary


def expected_unique_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts hit in one layer by `tokens` tokens each choosing `top_k` of `experts` uniformly
    and independently: E·(1 − (1 − k/E)^B)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@attrs.frozen
class RoutingTrace:
    """The experts hit by every decode step of one pass."""

    layers: tuple[int, ...]  # decoder layer index of each MoE layer
    experts: int  # routed experts per MoE layer (E)
    top_k: int  # experts chosen per token (k)
    tokens_per_step: int  # tokens routed per decode step (the batch size)
    hits: tuple[tuple[tuple[int, ...], ...], ...]  # step -> MoE layer -> sorted distinct experts hit

    @property
    def steps(self) -> int:
        return len(self.hits)


def mean_unique_experts(traces: Sequence[RoutingTrace]) -> float | None:
    """Distinct experts per decode step and MoE layer, averaged; None without a decode step."""
    counts = [len(experts) for trace in traces for step in trace.hits for experts in step]
    return float(np.mean(counts)) if counts else None


def summarize_routing(traces: Sequence[RoutingTrace]) -> RoutingSummary | None:
    """Pool `traces` (passes of one configuration); None when no trace has a decode step."""
    traces = [t for t in traces if t.steps]
    if not traces:
        return None
    first = traces[0]
    shape = (first.layers, first.experts, first.top_k, first.tokens_per_step)
    if any((t.layers, t.experts, t.top_k, t.tokens_per_step) != shape for t in traces):
        raise ValueError("routing traces of different models or batch sizes cannot be pooled")
    counts = np.zeros((len(first.layers), first.experts), dtype=np.int64)
    unique: list[list[int]] = [[] for _ in first.layers]
    for trace in traces:
        for step in trace.hits:
            for index, experts in enumerate(step):
                unique[index].append(len(experts))
                counts[index, list(experts)] += 1
    return RoutingSummary(
        experts=first.experts,
        top_k=first.top_k,
        tokens_per_step=first.tokens_per_step,
        steps=sum(t.steps for t in traces),
        per_layer=tuple(
            LayerRouting(layer=layer, unique_per_step=summarize(values, "experts"))
            for layer, values in zip(first.layers, unique, strict=True)
        ),
        overall=summarize([n for values in unique for n in values], "experts"),
        expected_unique=expected_unique_experts(first.experts, first.top_k, first.tokens_per_step),
        hit_histogram=tuple(tuple(int(c) for c in row) for row in counts),
    )

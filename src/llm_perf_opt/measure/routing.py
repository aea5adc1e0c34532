"""Which experts each decode step's MoE routers picked, per layer.

Forward hooks on the routers (transformers' DeepSeek-V2-style ``*TopkRouter`` modules, whose output ends with the
top-k expert indices) keep the indices on the device while decode steps run; :meth:`RoutingRecorder.end_pass`
copies them to the host once. Inside a compiled decode step the hooks are traced into the graph and the indices
come out as graph outputs, stacked right after the step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records.stage1 import LayerRouting, RoutingSummary

#: Class-name endings of transformers' MoE routers whose output is (logits, weights, top-k indices).
ROUTER_CLASS_SUFFIXES = ("TopkRouter", "TopKRouter")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, router module) of every MoE router in `model`, in layer order."""
    found = []
    for path, module in model.named_modules():
        if type(module).__name__.endswith(ROUTER_CLASS_SUFFIXES) and hasattr(module, "top_k"):
            match = _LAYER.search(path)
            if match:
                found.append((int(match.group(1)), module))
    return sorted(found, key=lambda item: item[0])


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
    """Distinct experts per decode step and MoE layer, averaged over every step and layer of `traces`; None when
    they hold no decode step."""
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


class RoutingRecorder:
    """Hooks on a model's MoE routers that record the top-k indices of decode steps (see the module doc)."""

    def __init__(self, routers: Sequence[tuple[int, nn.Module]]) -> None:
        if not routers:
            raise ValueError("no MoE routers to record")
        self.layers = tuple(layer for layer, _ in routers)
        first: Any = routers[0][1]
        self.top_k = int(first.top_k)
        self.experts = int(getattr(first, "num_experts", 0) or getattr(first, "n_routed_experts", 0))
        self.recording = False
        self._pending: list[torch.Tensor] = []  # this step's indices, one tensor per MoE layer
        self._steps: list[torch.Tensor] = []  # (layers, tokens, k) per decode step, on the device
        self._routers = [module for _, module in routers]
        self._handles: list[RemovableHandle] = []
        self.attach()

    @classmethod
    def install(cls, model: nn.Module) -> RoutingRecorder | None:
        """A recorder on `model`'s routers, or None for a model without MoE routers."""
        routers = find_routers(model)
        return cls(routers) if routers else None

    def _hook(self, _module: nn.Module, _args: tuple[object, ...], out: tuple[torch.Tensor, ...]) -> None:
        if self.recording:
            self._pending.append(out[-1])

    def attach(self) -> None:
        """Attach the hooks (done when the recorder is made; again after :meth:`remove`)."""
        if not self._handles:
            self._handles = [module.register_forward_hook(self._hook) for module in self._routers]

    def remove(self) -> None:
        """Detach the hooks (nothing is recorded until :meth:`attach`)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def begin_pass(self) -> None:
        """Forget what an earlier pass recorded."""
        self._steps.clear()
        self._pending.clear()

    def end_step(self) -> None:
        """Keep the indices of the step that just ran (one stack on the device, no copy to the host)."""
        if self._pending:
            self._steps.append(torch.stack(self._pending))
            self._pending.clear()  # the same list object: a compiled step's guards see it empty again

    def end_pass(self) -> RoutingTrace:
        """The pass's decode steps, copied to the host once."""
        self.recording = False
        self._pending.clear()
        if not self._steps:
            return RoutingTrace(self.layers, self.experts, self.top_k, 0, ())
        indices = torch.stack(self._steps).cpu().numpy()  # (steps, layers, tokens, k)
        self._steps.clear()
        tokens = int(indices.shape[2])
        hits = tuple(tuple(tuple(int(e) for e in np.unique(layer)) for layer in step) for step in indices)
        return RoutingTrace(self.layers, self.experts, self.top_k, tokens, hits)

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

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from llm_perf_opt.measure.routing_summary import RoutingTrace

#: Class-name endings of transformers' MoE routers whose output is (logits, weights, top-k indices).
ROUTER_CLASS_SUFFIXES = ("TopkRouter", "TopKRouter")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, router module) of every MoE router in `model`, in layer order."""
    found = []
    for path, module in model.named_modules():
        is_router = type(module).__name__.endswith(ROUTER_CLASS_SUFFIXES) and hasattr(module, "top_k")
        if is_router and (match := _LAYER.search(path)):
            found.append((int(match.group(1)), module))
    return sorted(found, key=lambda item: item[0])


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

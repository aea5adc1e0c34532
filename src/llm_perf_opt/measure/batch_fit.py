"""Whether a batch fits in the device's memory, estimated before its first pass (to refuse one that cannot; the memory
pass, `measure.memory_figures.fit_prediction`, measures what fits once a batch has run): the weights (measured on the
device) + the KV cache + the activations, against the memory free beside the weights.

* KV cache: `measure.memory_figures.kv_bytes_per_token` × (the longest prompt + new tokens) × batch: a static cache
  holds that from the start, a dynamic one reaches it at the last step.
* Activations: the analytic model's largest module activation (inputs and outputs, live together, as in
  `AnalyticMemory`) × ACTIVATION_MARGIN. The decoder runs the whole batch at once, so its term grows with the batch;
  vision runs one page at a time, so its term does not. Without an analytic model: FALLBACK_WIDTH × prompt tokens ×
  hidden size × dtype bytes per page (a decoder MLP's input, widened intermediate and output), × the margin."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from llm_perf_opt.records import vocabulary as vocab

ACTIVATION_MARGIN = 2.0  # × the largest module activation: its neighbours' temporaries and the allocator's rounding
FALLBACK_WIDTH = 8  # no analytic model: a decoder MLP's input + intermediate (~4-6× hidden) + output, per token
VISION_MODULES = ("global/", "tiles/")  # the analytic prefill's vision modules (run one page at a time)


@attrs.frozen
class BatchFit:
    """The estimate for a batch of `batch_size` pages and the largest batch that fits (bytes)."""

    batch_size: int
    free_bytes: int  # free beside the loaded weights: the device's free memory + the allocator's cached blocks
    weights_bytes: int  # resident already
    kv_bytes_per_token: int  # one sequence
    context_tokens: int  # the longest prompt + new tokens
    decoder_activation_bytes: float  # per page, margin included (grows with the batch)
    vision_activation_bytes: float  # one page at a time, margin included (does not grow)
    activation_source: str  # how the activation terms were estimated

    @property
    def kv_bytes_per_page(self) -> float:
        return float(self.kv_bytes_per_token * self.context_tokens)

    def activation_bytes(self, batch: int) -> float:
        """The larger of the batched decoder's activations and one page's vision activations."""
        return max(batch * self.decoder_activation_bytes, self.vision_activation_bytes)

    def needed_bytes(self, batch: int) -> float:
        """Weights + KV cache + activations for `batch` pages."""
        return self.weights_bytes + batch * self.kv_bytes_per_page + self.activation_bytes(batch)

    @property
    def available_bytes(self) -> int:
        """What the run may hold: the loaded weights and the memory free beside them."""
        return self.weights_bytes + self.free_bytes

    @property
    def max_batch(self) -> int:
        """The largest batch whose estimate fits in `available_bytes` (0: not even one page)."""
        kv, decoder, vision = self.kv_bytes_per_page, self.decoder_activation_bytes, self.vision_activation_bytes
        free = float(self.free_bytes)
        if free < vision:
            return 0
        limits = [math.floor(free / (kv + decoder)) if kv + decoder > 0 else math.inf]
        if kv > 0:
            limits.append(math.floor((free - vision) / kv))
        found = min(limits)
        return max(0, int(found)) if math.isfinite(found) else 1 << 31

    @property
    def fits(self) -> bool:
        return self.batch_size <= self.max_batch


def activation_terms(costs: Iterable[Mapping[str, Any]]) -> tuple[float, float]:
    """(decoder, vision) largest module activation bytes of the inputs' analytic prefill (decode steps' activations
    are one token each), before the margin; vision modules are the prefill's `global/…` and `tiles/…`."""
    decoder = vision = 0.0
    for stages in costs:
        prefill = stages.get(vocab.PREFILL)
        for module in getattr(prefill, "modules", ()):
            size = float(module.activation_bytes)
            if str(module.name).startswith(VISION_MODULES):
                vision = max(vision, size)
            else:
                decoder = max(decoder, size)
    return decoder, vision


def fallback_activation(prompt_tokens: int, hidden_size: int, dtype_bytes: int) -> float:
    """One page's largest decoder activation without an analytic model (before the margin)."""
    return float(FALLBACK_WIDTH * prompt_tokens * hidden_size * dtype_bytes)

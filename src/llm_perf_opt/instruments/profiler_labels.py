"""The names of the profiler ranges the toolkit opens in the profiled pass (one place for both prefixes)."""

from __future__ import annotations

from typing import Final

STAGE_LABEL_PREFIX: Final = "stage:"  # a stage range, e.g. "stage:decode/step" (instruments.torch_profiler)
MODULE_LABEL_PREFIX: Final = "module:"  # a module's forward, e.g. "module:model.layers.3.mlp" (module_ranges)
LABEL_PREFIXES: Final = (STAGE_LABEL_PREFIX, MODULE_LABEL_PREFIX)  # annotations: neither operators nor kernels

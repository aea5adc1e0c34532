"""The names of the profiler ranges the toolkit opens in the profiled pass (one place for both prefixes), and of the
host calls that launch kernels (one rule for every reader that ties a kernel to its launch)."""

from __future__ import annotations

import re
from typing import Final

from torch.autograd.profiler_util import FunctionEvent

STAGE_LABEL_PREFIX: Final = "stage:"  # a stage range, e.g. "stage:decode/step" (instruments.torch_profiler)
MODULE_LABEL_PREFIX: Final = "module:"  # a module's forward, e.g. "module:model.layers.3.mlp" (module_ranges)
LABEL_PREFIXES: Final = (STAGE_LABEL_PREFIX, MODULE_LABEL_PREFIX)  # annotations: neither operators nor kernels

# Host calls that launch kernels: by their activity type, or by name in torch builds without
# `FunctionEvent.activity_type` (before 2.12), which still list the CUDA runtime and driver calls among the CPU events.
_LAUNCH_ACTIVITIES: Final = ("cuda_runtime", "cuda_driver")
_LAUNCH_NAME: Final = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")


def is_launch(ev: FunctionEvent) -> bool:
    """Whether `ev` is a host call that launched a kernel (its id is the kernel's correlation id)."""
    kind = getattr(ev, "activity_type", None)
    if kind:
        return kind in _LAUNCH_ACTIVITIES
    return bool(_LAUNCH_NAME.match(ev.name))

"""What measure/'s passes need of the session they drive (the memory and the energy pass), as a Protocol:
`session.session.InferenceSession` is one, and measure/ sits below session/, so it names this type, never the class.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from llm_perf_opt.measure.routing import RoutingRecorder
from llm_perf_opt.measure.timing import StageRecorder


class DecodeNotRepeatable(Exception):
    """The decode section cannot run again over the same prompt; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MeasuredSession(Protocol):
    """A loaded model that prepares inputs and runs passes over them."""

    @property
    def device(self) -> torch.device: ...

    @property
    def routing(self) -> RoutingRecorder | None:
        """The MoE routing recorder (None: not recorded); a pass outside the timed ones makes it forget itself."""
        ...

    def prepare(self, input_path: Path) -> Any:
        """One input, preprocessed and on the device (its `prompt_tokens`: the prompt's length)."""
        ...

    def generate_batch(self, batch: Sequence[Any], max_new_tokens: int, recorder: StageRecorder) -> object:
        """One pass over the prepared inputs, its stages recorded by `recorder`."""
        ...

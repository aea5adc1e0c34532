"""What measure/'s passes need of the session they drive (the memory and the energy pass), as a Protocol:
`session.session.InferenceSession` is one, and measure/ sits below session/, so it names this type, never the class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import torch

from llm_perf_opt.instruments.routing import RoutingRecorder
from llm_perf_opt.instruments.timing import StageRecorder


class DecodeNotRepeatable(Exception):
    """The decode section cannot run again over the same prompt; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PreparedInput(Protocol):
    """One input as a session prepared it (`session.adapters.base.PreparedInputs`)."""

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt's length (text and image placeholders)."""

    @property
    def model_inputs(self) -> Mapping[str, object]:
        """The model's keyword inputs (tensors, and plain values such as the crop grid)."""


P = TypeVar("P", bound=PreparedInput)  # the prepared input of one kind of session


class MeasuredSession(Protocol[P]):
    """A loaded model that prepares inputs and runs passes over them."""

    @property
    def device(self) -> torch.device: ...

    @property
    def routing(self) -> RoutingRecorder | None:
        """The MoE routing recorder (None: not recorded); a pass outside the timed ones makes it forget itself."""

    def prepare(self, input_path: Path) -> P:
        """One input, preprocessed and on the device (its `prompt_tokens`: the prompt's length)."""

    def generate_batch(self, batch: Sequence[P], max_new_tokens: int, recorder: StageRecorder) -> object:
        """One pass over the prepared inputs, its stages recorded by `recorder`."""

"""Where an adapter makes a page's views (`model.preprocess.device`): PIL on the host, or torch ops on the model's
GPU. One parser and one check for every adapter that offers both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llm_perf_opt.errors import UserError

PREPROCESS_DEVICES = ("cpu", "cuda")


def preprocess_device(table: Mapping[str, Any]) -> str:
    """`model.preprocess.device` of a model's table: "cpu" (the default) or "cuda"; a UserError otherwise."""
    device = str(table.get("device") or "cpu").strip().lower()
    if device not in PREPROCESS_DEVICES:
        raise UserError(
            f"model.preprocess.device={table.get('device')} is not a place to preprocess pages",
            "Use model.preprocess.device=cpu (PIL on the host, the default) or cuda (resize, pad, tile and "
            "normalise on the model's GPU)",
        )
    return device


Target = tuple[torch.device, torch.dtype]  # where, and in which dtype, the views are made


def preprocess_target(setting: str, device: torch.device, dtype: torch.dtype) -> Target | None:
    """Where `prepare` makes the views for the run's `device` and `dtype` (None: PIL on the host)."""
    if setting == "cpu":
        return None
    if device.type != "cuda":
        raise UserError(
            f"model.preprocess.device=cuda preprocesses pages on the model's GPU, but this run's device is {device}",
            "Run on a GPU (device=cuda), or leave model.preprocess.device=cpu",
        )
    return device, dtype

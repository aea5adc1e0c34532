"""Model adapters by name (`model.adapter` in the Hydra model config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_perf_opt.errors import UserError
from llm_perf_opt.session.adapters.base import ModelAdapter
from llm_perf_opt.session.adapters.deepseek_ocr import DeepseekOcrAdapter
from llm_perf_opt.session.adapters.deepseek_ocr2 import DeepseekOcr2Adapter
from llm_perf_opt.session.adapters.hf import HfAdapter

ADAPTERS: dict[str, type[ModelAdapter]] = {
    "deepseek_ocr": DeepseekOcrAdapter,
    "deepseek_ocr2": DeepseekOcr2Adapter,
    "hf": HfAdapter,
}


def make_adapter(model_cfg: Mapping[str, Any]) -> ModelAdapter:
    """The adapter that `model_cfg['adapter']` names."""
    name = str(model_cfg.get("adapter"))
    try:
        return ADAPTERS[name](model_cfg)
    except KeyError:
        raise UserError(
            f"model.adapter={name} is not a known model adapter (known: {', '.join(sorted(ADAPTERS))})",
            "Pick a model config with model=<name> from conf/model/ (e.g. model=deepseek_ocr2)",
        ) from None

"""Model adapters by name (`model.adapter` in the Hydra model config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_perf_opt.errors import UserError
from llm_perf_opt.session.adapters.base import ModelAdapter
from llm_perf_opt.session.adapters.deepseek_ocr import DeepseekOcrAdapter
from llm_perf_opt.session.adapters.deepseek_ocr2 import DeepseekOcr2Adapter
from llm_perf_opt.session.adapters.hf import HfAdapter
from llm_perf_opt.session.model_settings import ModelSettings

ADAPTERS: dict[str, type[ModelAdapter]] = {
    "deepseek_ocr": DeepseekOcrAdapter,
    "deepseek_ocr2": DeepseekOcr2Adapter,
    "hf": HfAdapter,
}


def make_adapter(model: ModelSettings | Mapping[str, Any]) -> ModelAdapter:
    """The adapter that the model settings name (`model.adapter`); a `model` node is read into settings first."""
    settings = ModelSettings.of(model)
    name = settings.adapter
    try:
        return ADAPTERS[name](settings)
    except KeyError:
        raise UserError(
            f"model.adapter={name} is not a known model adapter (known: {', '.join(sorted(ADAPTERS))})",
            "Pick a model config with model=<name> from conf/model/ (e.g. model=deepseek_ocr2)",
        ) from None

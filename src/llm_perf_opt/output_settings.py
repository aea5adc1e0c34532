"""What a run writes besides its measurements: predictions, the gallery, and their model-specific knobs.

The settings live at `pipeline.torch_profiler.output` (typed: `config_schema.OutputSchema`). The legacy keys under
`outputs.` are read until they are removed on LEGACY_REMOVAL (2027-03-01): a legacy key that is set wins over its new
key and logs one INFO line naming the new key and the removal date.
"""

from __future__ import annotations

import functools
import logging

from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.config_schema import OutputsSchema
from llm_perf_opt.errors import UserError, require_bool, require_whole
from llm_perf_opt.records.stage1 import (
    DeepSeekOCROutput,
    OutputExtra,
    OutputSettings,
    PredictionOutput,
    VisualizationOutput,
)

log = logging.getLogger("llm_perf_opt.output")

OUTPUT = "pipeline.torch_profiler.output"
_EXTRA = f"{OUTPUT}.extra.deepseek_ocr"

#: The day the legacy `outputs.` keys stop being read (delete LEGACY_KEYS and the reading below then; the docs'
#: configuration guide states the same date).
LEGACY_REMOVAL = "2027-03-01"

#: legacy key -> the key that replaces it
LEGACY_KEYS: dict[str, str] = {
    "outputs.save_predictions": f"{OUTPUT}.prediction.enable",
    "outputs.visualization.enable": f"{OUTPUT}.visualization.enable",
    "outputs.predictions.strip_special_tokens": f"{_EXTRA}.prediction.strip_special_tokens",
    "outputs.visualization.max_images": f"{_EXTRA}.visualization.max_images",
    "outputs.visualization.thumbnail_width": f"{_EXTRA}.visualization.thumbnail_width",
}


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def output_settings(cfg: DictConfig, outputs: OutputsSchema) -> OutputSettings:
    """The run's output settings from `cfg` (a composed stage1/stage2 config) and its typed legacy `outputs` node;
    UserError for a bad value."""
    given: dict[str, tuple[str, object]] = {new: (new, OmegaConf.select(cfg, new)) for new in LEGACY_KEYS.values()}
    for legacy, new in LEGACY_KEYS.items():
        value = functools.reduce(getattr, legacy.split(".")[1:], outputs)  # from the typed node; None: not set
        if value is not None:
            log.info(
                "%s is a legacy key (read until its removal on %s): use %s=%s",
                legacy,
                LEGACY_REMOVAL,
                new,
                _shown(value),
            )
            given[new] = (legacy, value)

    def flag(new: str) -> bool:
        return require_bool(*given[f"{OUTPUT}.{new}"])

    def whole(new: str, minimum: int) -> int:
        return require_whole(*given[f"{OUTPUT}.{new}"], minimum)

    def folder(new: str) -> str:
        key = f"{OUTPUT}.{new}"
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{key}={value} is not a folder", f"Set {key} to a folder name, relative or absolute")
        return value

    return OutputSettings(
        prediction=PredictionOutput(enable=flag("prediction.enable"), save_dir=folder("prediction.save_dir")),
        visualization=VisualizationOutput(
            enable=flag("visualization.enable"), save_dir=folder("visualization.save_dir")
        ),
        extra=OutputExtra(
            deepseek_ocr=DeepSeekOCROutput(
                strip_special_tokens=flag("extra.deepseek_ocr.prediction.strip_special_tokens"),
                max_images=whole("extra.deepseek_ocr.visualization.max_images", 1),
                thumbnail_width=whole("extra.deepseek_ocr.visualization.thumbnail_width", 16),
            )
        ),
    )

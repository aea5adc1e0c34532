"""What the analytic model is told by the config (`model.*`, `workload_profile`, `analytic.*`), checked once into
frozen records, as :class:`llm_perf_opt.session.runtime.RuntimeSettings` does.

The constructors take plain data or typed nodes; the model node comes parsed (`session.model_settings.ModelSettings`),
read through the `ModelNode` Protocol since analytic/ sits below session/. Every bad value is a UserError naming the
setting. Nothing else below `pipeline/` reads a config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from llm_perf_opt.config_schema import AnalyticSchema, WorkloadProfile
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, mode_from_config
from llm_perf_opt.records.vocabulary import SUPPORTED_DTYPES_TEXT, dtype_bytes


class PromptTokens(Protocol):
    """The prompt's stand-in token count (`model.prompt.text_tokens`)."""

    @property
    def text_tokens(self) -> int | None: ...


class ModelNode(Protocol):
    """What `PricedModel.from_settings` reads of the parsed `model:` node (`session.model_settings.ModelSettings`)."""

    @property
    def name(self) -> str: ...
    @property
    def adapter(self) -> str: ...
    @property
    def architecture(self) -> Mapping[str, Any]: ...
    @property
    def prompt(self) -> PromptTokens: ...
    @property
    def preprocess(self) -> Mapping[str, Any]: ...
    @property
    def mode(self) -> str | None: ...
    @property
    def modes(self) -> Mapping[str, Mapping[str, Any]]: ...


def crop_grid_from(value: Any, name: str = "analytic.crop_grid") -> tuple[int, int]:
    """A (tiles across, tiles down) pair from the config, or a UserError naming the setting."""
    if value is None or isinstance(value, str | int) or len(value) != 2:
        raise UserError(f"{name}={value} is not a crop grid", f"Set {name} to [tiles across, tiles down], e.g. [2, 3]")
    return require_whole(f"{name}[0]", value[0], 1), require_whole(f"{name}[1]", value[1], 1)


@attrs.frozen
class PricedModel:
    """A model config as the analytic model prices it.

    DeepSeek-OCR v1 (`model.modes`) is priced by resolution mode: `mode` is `model.mode` and `modes` the model's
    table; DeepSeek-OCR-2 by tile count, at its preprocessing's `global_size` and `tile_size`.
    """

    name: str
    adapter: str | None
    architecture: Mapping[str, Any]  # plain data: `model.architecture`
    prompt_text_tokens: Any  # `model.prompt.text_tokens` (checked where a page is priced from the config)
    modes: Mapping[str, Mapping[str, Any]] | None = None
    mode: Mode | None = None
    global_size: int | None = None
    tile_size: int | None = None

    @classmethod
    def from_settings(cls, model: ModelNode) -> PricedModel:
        """From the parsed `model:` node (the pipeline's, or a saved config.yaml's)."""
        if not model.architecture:  # a DeepSeek-OCR node always has one; the key is what a saved config lacks
            raise KeyError("architecture")
        common: dict[str, Any] = {
            "name": model.name,
            "adapter": model.adapter,
            "architecture": model.architecture,
            "prompt_text_tokens": model.prompt.text_tokens,
        }
        if model.modes:
            return cls(**common, modes=model.modes, mode=mode_from_config(str(model.mode), model.modes))
        pre = model.preprocess
        return cls(**common, global_size=int(pre["global_size"]), tile_size=int(pre["tile_size"]))

    @property
    def mode_name(self) -> str | None:
        """The v1 mode priced (`model.mode`); None for a model priced by tile count."""
        return None if self.mode is None else self.mode.name


@attrs.frozen(kw_only=True)
class AnalyticSettings:
    """The `analytic.*` node: the page a config report prices, the GPUs it prices on, and the view what-if (v1:
    modes and crop grids; OCR-2: tile counts), with the model and the named workload they belong to."""

    model: PricedModel
    profile: WorkloadProfile | None = None
    dtype: str
    dtype_bytes: int
    text_tokens: int
    new_tokens: int
    gpus: tuple[str, ...]
    reference_gpu: str
    crop_grid: tuple[int, int] | None = None  # v1
    sweep_modes: tuple[Mode, ...] = ()  # v1
    grid_sweep: tuple[tuple[int, int], ...] = ()  # v1
    tiles: int = 0  # OCR-2
    tile_sweep: tuple[int, ...] = ()  # OCR-2

    @classmethod
    def from_config(
        cls, analytic: AnalyticSchema, model: PricedModel, profile: WorkloadProfile | None = None
    ) -> AnalyticSettings:
        """From the typed `analytic` node, for `model`; a named workload must be written for the model."""
        if profile is not None:
            profile.check_model(model.name)
        given = analytic.text_tokens
        text = require_whole("analytic.text_tokens", given if given is not None else model.prompt_text_tokens, 0)
        new = require_whole("analytic.new_tokens", analytic.new_tokens, 1)
        size = dtype_bytes(analytic.dtype)
        if size is None:
            raise UserError(
                f"analytic.dtype={analytic.dtype} is not supported", f"Use analytic.dtype={SUPPORTED_DTYPES_TEXT}"
            )
        common: dict[str, Any] = {
            "model": model,
            "profile": profile,
            "dtype": analytic.dtype,
            "dtype_bytes": size,
            "text_tokens": text,
            "new_tokens": new,
            "gpus": tuple(analytic.gpus),
            "reference_gpu": analytic.reference_gpu,
        }
        if model.modes is not None:
            return cls(
                **common,
                crop_grid=crop_grid_from(analytic.crop_grid),
                sweep_modes=tuple(mode_from_config(str(name), model.modes) for name in analytic.mode_sweep),
                grid_sweep=tuple(crop_grid_from(g, "analytic.grid_sweep[]") for g in analytic.grid_sweep),
            )
        return cls(
            **common,
            tiles=require_whole("analytic.tiles", analytic.tiles, 0),
            tile_sweep=tuple(analytic.tile_sweep),
        )

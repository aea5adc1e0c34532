"""The workloads the analytic model prices: a page described by the config (`analytic.*`, the model's mode or
preprocessing, its prompt), or the inputs a Stage 1 run measured (:class:`RunWorkload`).

Named workloads (`conf/workload/*.yaml`) select their model and list the model configs they are written for in
`workload_profile.models`; :func:`check_workload_model` refuses any other `model=`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
from omegaconf import DictConfig

from llm_perf_opt.analytic.spec import ModelSpec, Workload, as_crop_grid
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, mode_from_config
from llm_perf_opt.records.analytic import WorkloadRow
from llm_perf_opt.records.stage1 import ImageRecord
from llm_perf_opt.records.vocabulary import SUPPORTED_DTYPES_TEXT, dtype_bytes


def has_modes(model_cfg: DictConfig) -> bool:
    """True for a model priced by resolution mode (DeepSeek-OCR v1: `model.modes`), not by tile count (OCR-2)."""
    return "modes" in model_cfg


def model_mode(model_cfg: DictConfig, name: str | None = None) -> Mode:
    """The mode `name` (default: `model.mode`) from the model's `modes` table."""
    return mode_from_config(str(name or model_cfg.mode), model_cfg.modes)


def crop_grid_from(value: Any, name: str = "analytic.crop_grid") -> tuple[int, int]:
    """A (tiles across, tiles down) pair from the config, or a UserError naming the setting."""
    if value is None or isinstance(value, str | int) or len(value) != 2:
        raise UserError(f"{name}={value} is not a crop grid", f"Set {name} to [tiles across, tiles down], e.g. [2, 3]")
    return require_whole(f"{name}[0]", value[0], 1), require_whole(f"{name}[1]", value[1], 1)


def check_workload_model(cfg: DictConfig) -> None:
    """Refuse a named workload with a model it is not written for (`workload_profile.models`), in one paragraph.

    A workload file selects its own model; `model=` on the command line wins over it and must be one of the
    workload's models (the full-size model and its tiny variant of the same classes).
    """
    profile = cfg.get("workload_profile")
    if not profile or not profile.get("models"):
        return
    models = [str(m) for m in profile.models]
    model = str(cfg.model.name)
    if model not in models:
        raise UserError(
            f"workload={profile.name} is written for model={' or model='.join(models)} (its page, views and decode "
            f"length are that model's), but this command runs model={model}",
            f"Leave model= out to run the workload's own model ({models[0]}), or choose a workload of conf/workload/ "
            f"whose workload_profile.models lists {model}",
        )


def config_dtype_bytes(cfg: DictConfig) -> int:
    """Bytes per element of `analytic.dtype`, or a UserError naming the setting."""
    size = dtype_bytes(str(cfg.analytic.dtype))
    if size is None:
        raise UserError(
            f"analytic.dtype={cfg.analytic.dtype} is not supported", f"Use analytic.dtype={SUPPORTED_DTYPES_TEXT}"
        )
    return size


def workload_from(cfg: DictConfig) -> Workload:
    """The analytic workload the config describes (`analytic.*` and the model's preprocessing or mode, and prompt).
    A named workload must be written for the configured model (:func:`check_workload_model`)."""
    check_workload_model(cfg)
    a = cfg.analytic
    text = a.text_tokens if a.text_tokens is not None else cfg.model.prompt.text_tokens
    base = Workload(
        text_tokens=require_whole("analytic.text_tokens", text, 0),
        new_tokens=require_whole("analytic.new_tokens", a.new_tokens, 1),
        dtype_bytes=config_dtype_bytes(cfg),
    )
    if has_modes(cfg.model):
        return base.with_mode(model_mode(cfg.model), crop_grid_from(a.crop_grid))
    pre = cfg.model.preprocess
    return attrs.evolve(
        base,
        global_size=int(pre.global_size),
        tile_size=int(pre.tile_size),
        tiles=require_whole("analytic.tiles", a.tiles, 0),
    )


def workload_row(spec: ModelSpec, workload: Workload, mode: str | None, dtype: str) -> WorkloadRow:
    """The report's description of one priced page (v1: `mode` and the crop grid too)."""
    return WorkloadRow(
        mode=mode,
        global_size=workload.global_size,
        tile_size=workload.tile_size,
        tiles=workload.tiles,
        crop_grid=workload.crop_grid,
        text_tokens=workload.text_tokens,
        new_tokens=workload.new_tokens,
        dtype=dtype,
        image_tokens=workload.image_tokens(spec),
        prompt_tokens=workload.prompt_tokens(spec),
    )


def configured_mode(cfg: DictConfig) -> str | None:
    """The v1 mode the config prices (`model.mode`); None for a model priced by tile count."""
    return model_mode(cfg.model).name if has_modes(cfg.model) else None


# ---- a Stage 1 run's inputs -----------------------------------------------------------------------------------
@attrs.frozen
class MeasuredInput:
    """One input as a Stage 1 run measured it: what the analytic model needs to price it as it ran."""

    image: str
    tiles: int
    image_tokens: int
    prompt_tokens: int
    new_tokens: int
    # DeepSeek-OCR v1 in a crop mode: the (tiles across, tiles down) grid its preprocessing chose (the adapter's
    # `crop_grid` model input); None for OCR-2 and for v1 without tiles.
    crop_grid: tuple[int, int] | None = attrs.field(default=None, converter=as_crop_grid)


@attrs.frozen
class RunWorkload:
    """The inputs of a Stage 1 run (one entry per input) and the dtype it computed in."""

    inputs: tuple[MeasuredInput, ...]
    dtype: str  # the run's compute dtype (metrics.json model.dtype), e.g. "float32"

    @classmethod
    def from_records(cls, records: Iterable[ImageRecord], dtype: str) -> RunWorkload:
        """One input per image of `records` (its first timed pass), with the crop grid it recorded."""
        first: dict[str, ImageRecord] = {}
        for record in records:
            first.setdefault(record.image, record)
        return cls(
            inputs=tuple(
                MeasuredInput(
                    image=r.image,
                    tiles=r.tiles,
                    image_tokens=r.image_tokens,
                    prompt_tokens=r.prompt_tokens,
                    new_tokens=r.new_tokens,
                    crop_grid=r.crop_grid,
                )
                for r in first.values()
            ),
            dtype=dtype,
        )


def input_workload(cfg: DictConfig, spec: ModelSpec, measured: MeasuredInput, size: int) -> Workload:
    """The analytic workload of one measured input: the model's views for its tiles (v1: its mode and crop grid),
    its prompt and new tokens. Raises ValueError when the priced views give other token counts than were measured
    (the analytic model and the run disagree: a bug, not bad input)."""
    base = Workload(
        text_tokens=measured.prompt_tokens - 1 - measured.image_tokens,
        new_tokens=measured.new_tokens,
        dtype_bytes=size,
    )
    if has_modes(cfg.model):
        mode = model_mode(cfg.model)
        if mode.crop_mode and measured.tiles and measured.crop_grid is None:
            raise ValueError(f"{measured.image}: {measured.tiles} tiles in mode {mode.name} need their crop grid")
        workload = base.with_mode(mode, measured.crop_grid or (1, 1))
    else:
        pre = cfg.model.preprocess
        workload = attrs.evolve(
            base, global_size=int(pre.global_size), tile_size=int(pre.tile_size), tiles=measured.tiles
        )
    priced = (workload.tiles, workload.image_tokens(spec))
    if priced != (measured.tiles, measured.image_tokens):
        raise ValueError(
            f"{measured.image}: the analytic model prices {priced[0]} tiles and {priced[1]} image tokens, the run "
            f"measured {measured.tiles} and {measured.image_tokens}"
        )
    return workload


def run_workloads(cfg: DictConfig, spec: ModelSpec, run: RunWorkload) -> tuple[tuple[str, Workload], ...]:
    """Each measured input with its analytic workload, in run order."""
    if not run.inputs:
        raise ValueError("a run with no measured inputs has nothing to price")
    size = dtype_bytes(run.dtype)
    if size is None:
        raise ValueError(f"the run's dtype {run.dtype!r} is not one of {SUPPORTED_DTYPES_TEXT}")
    return tuple((m.image, input_workload(cfg, spec, m, size)) for m in run.inputs)

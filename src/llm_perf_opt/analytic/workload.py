"""The workloads the analytic model prices: the page the analytic settings describe (`analytic.*`, the model's mode
or preprocessing, its prompt: :func:`configured_workload`), or the inputs a Stage 1 run measured
(:class:`RunWorkload`)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llm_perf_opt.analytic.settings import AnalyticSettings, PricedModel
from llm_perf_opt.analytic.spec import ModelSpec, Workload, as_crop_grid
from llm_perf_opt.records.analytic import WorkloadRow
from llm_perf_opt.records.stage1 import ImageRecord
from llm_perf_opt.records.vocabulary import SUPPORTED_DTYPES_TEXT, dtype_bytes


def configured_workload(settings: AnalyticSettings) -> Workload:
    """The page a config report prices: `analytic.*` with the model's mode (v1) or preprocessing (OCR-2)."""
    base = Workload(text_tokens=settings.text_tokens, new_tokens=settings.new_tokens, dtype_bytes=settings.dtype_bytes)
    return _at_views(base, settings.model, settings.crop_grid, settings.tiles)


def _at_views(base: Workload, model: PricedModel, crop_grid: tuple[int, int] | None, tiles: int) -> Workload:
    """`base` at the model's views: a v1 mode's with `crop_grid`, or OCR-2's view sizes with `tiles` tiles."""
    if model.mode is not None:
        return base.with_mode(model.mode, crop_grid)
    assert model.global_size is not None and model.tile_size is not None
    return attrs.evolve(base, global_size=model.global_size, tile_size=model.tile_size, tiles=tiles)


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
                MeasuredInput(r.image, r.tiles, r.image_tokens, r.prompt_tokens, r.new_tokens, r.crop_grid)
                for r in first.values()
            ),
            dtype=dtype,
        )


def input_workload(model: PricedModel, spec: ModelSpec, measured: MeasuredInput, size: int) -> Workload:
    """The analytic workload of one measured input: the model's views for its tiles (v1: its mode and crop grid),
    its prompt and new tokens. Raises ValueError when the priced views give other token counts than were measured
    (the analytic model and the run disagree: a bug, not bad input)."""
    base = Workload(
        text_tokens=measured.prompt_tokens - 1 - measured.image_tokens, new_tokens=measured.new_tokens, dtype_bytes=size
    )
    mode = model.mode
    if mode is not None and mode.crop_mode and measured.tiles and measured.crop_grid is None:
        raise ValueError(f"{measured.image}: {measured.tiles} tiles in mode {mode.name} need their crop grid")
    workload = _at_views(base, model, measured.crop_grid or (1, 1), measured.tiles)
    priced = (workload.tiles, workload.image_tokens(spec))
    if priced != (measured.tiles, measured.image_tokens):
        raise ValueError(
            f"{measured.image}: the analytic model prices {priced[0]} tiles and {priced[1]} image tokens, the run "
            f"measured {measured.tiles} and {measured.image_tokens}"
        )
    return workload


def run_workloads(model: PricedModel, spec: ModelSpec, run: RunWorkload) -> tuple[tuple[str, Workload], ...]:
    """Each measured input with its analytic workload, in run order."""
    if not run.inputs:
        raise ValueError("a run with no measured inputs has nothing to price")
    size = dtype_bytes(run.dtype)
    if size is None:
        raise ValueError(f"the run's dtype {run.dtype!r} is not one of {SUPPORTED_DTYPES_TEXT}")
    return tuple((m.image, input_workload(model, spec, m, size)) for m in run.inputs)

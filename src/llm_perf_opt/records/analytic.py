"""Analytic report records: what `analytic-report` (and Stage 1's `static_analysis/` step) priced, written as
`static_analysis/analytic_model/report.json` (`AnalyticReport`). The JSON keeps the flat rows the file has always
had: a sweep row's priced figures are written inline, and absent sweep or run sections are left out, not null.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from llm_perf_opt.records.io import converter, load_file

ANALYTIC_DIR = "static_analysis/analytic_model"
REPORT_FILE = f"{ANALYTIC_DIR}/report.json"


@attrs.frozen
class WorkloadRow:
    """One page as priced: its views (v1: mode and crop grid), prompt, decode length and dtype."""

    mode: str | None  # v1 resolution mode; None for a model priced by tile count (OCR-2)
    global_size: int
    tile_size: int
    tiles: int
    crop_grid: tuple[int, int] | None  # v1 crop modes: (tiles across, tiles down); None otherwise
    text_tokens: int
    new_tokens: int
    dtype: str
    image_tokens: int
    prompt_tokens: int


@attrs.frozen
class StageCostRow:
    """FLOPs and bytes of one stage. `matmul_flops` is the counted figure (what FlopCounterMode counts)."""

    flops: float
    matmul_flops: float
    non_matmul_flops: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes: float
    bytes: float

    @property
    def intensity(self) -> float | None:
        """Counted FLOPs per byte moved; None when the stage moves no bytes."""
        return self.matmul_flops / self.bytes if self.bytes else None


@attrs.frozen
class CategoryRow:
    """FLOPs and bytes of one operator category in a stage, with its shares of the stage."""

    category: str
    flops: float
    bytes: float
    share_of_flops: float
    share_of_bytes: float


@attrs.frozen
class ModuleRow:
    """A module of a stage summed over its calls, layers grouped (`.layers.*.`)."""

    module: str
    category: str
    calls: int
    flops: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes: float
    share_of_flops: float


@attrs.frozen
class StageBound:
    """A stage's lower-bound time on one GPU and the roof that sets it."""

    speed_of_light_ms: float
    bound: str  # "compute" | "memory"


@attrs.frozen
class GpuWhatIf:
    """Every stage's lower-bound time on one GPU of the hardware table."""

    gpu: str  # display name
    key: str  # hardware/gpus.yaml key
    dense_tflops: float
    bandwidth_gbps: float
    stages: Mapping[str, StageBound]


@attrs.frozen
class ViewsPrice:
    """What one choice of views costs: tokens, vision and prefill work, and prefill's lower bound on the sweep's GPU."""

    image_tokens: int
    prompt_tokens: int
    vision_flops: float
    prefill_flops: float  # counted (matmul) FLOPs
    prefill_bytes: float
    prefill_speed_of_light_ms: float


@attrs.frozen
class TileSweepRow:
    """DeepSeek-OCR-2: one tile count."""

    tiles: int
    price: ViewsPrice


@attrs.frozen
class ModeSweepRow:
    """DeepSeek-OCR v1: one resolution mode (a crop mode once per crop grid)."""

    label: str  # "base", "gundam 2x3"
    mode: str
    global_size: int
    tile_size: int | None  # None without tiles
    crop_grid: tuple[int, int] | None
    tiles: int
    configured: bool  # the report's own workload
    price: ViewsPrice


@attrs.frozen
class TileSweep:
    gpu: str
    rows: tuple[TileSweepRow, ...]


@attrs.frozen
class ModeSweep:
    gpu: str
    rows: tuple[ModeSweepRow, ...]


@attrs.frozen
class InputCost:
    """One input of a Stage 1 run, priced as it ran (its views, prompt, new tokens and dtype)."""

    image: str
    workload: WorkloadRow
    stages: Mapping[str, StageCostRow]
    bounds: Mapping[str, StageBound]  # on the run section's GPU


@attrs.frozen
class RunInputs:
    """The inputs of the Stage 1 run a report prices; the report's tables are their sum, one pass each."""

    gpu: str  # the GPU of every input's `bounds`
    inputs: tuple[InputCost, ...]


@attrs.frozen
class AnalyticReport:
    """`static_analysis/analytic_model/report.json`. A config report prices one page (`workload`); one written into
    a Stage 1 run (`run` set) prices the inputs the run measured: `stages`, `categories`, `modules` and `what_if` are
    their sum over one pass each, `workload` is the first input (where the view sweep starts), `run.inputs` each."""

    schema_version: str
    model: str
    weights: str
    workload_profile: Mapping[str, Any] | None
    conventions: str
    workload: WorkloadRow
    stages: Mapping[str, StageCostRow]
    categories: Mapping[str, tuple[CategoryRow, ...]]
    modules: Mapping[str, tuple[ModuleRow, ...]]
    what_if: tuple[GpuWhatIf, ...]
    tile_sweep: TileSweep | None = None  # DeepSeek-OCR-2
    mode_sweep: ModeSweep | None = None  # DeepSeek-OCR v1
    run: RunInputs | None = None


def load_analytic_report(path: Path) -> AnalyticReport:
    """A written `report.json` as its record (RecordError when missing, damaged or of another schema version)."""
    return load_file(path, AnalyticReport)


# ---- JSON shape --------------------------------------------------------------------------------------------------
_PRICE_KEYS = tuple(f.name for f in attrs.fields(ViewsPrice))


def _inline_price(cls: type[Any]) -> None:
    """Write `cls.price` inline after the row's own fields (and read it back from there)."""
    unstructure_row = make_dict_unstructure_fn(cls, converter)
    structure_row = make_dict_structure_fn(cls, converter)

    def unstructure(row: Any) -> dict[str, Any]:
        data = unstructure_row(row)
        data.update(data.pop("price"))
        return data

    def structure(data: Mapping[str, Any], _: Any) -> Any:
        own = {k: v for k, v in data.items() if k not in _PRICE_KEYS}
        return structure_row({**own, "price": {k: data[k] for k in _PRICE_KEYS}}, cls)

    converter.register_unstructure_hook(cls, unstructure)
    converter.register_structure_hook(cls, structure)


_inline_price(TileSweepRow)
_inline_price(ModeSweepRow)
converter.register_unstructure_hook(
    AnalyticReport,
    make_dict_unstructure_fn(
        AnalyticReport,
        converter,
        tile_sweep=override(omit_if_default=True),
        mode_sweep=override(omit_if_default=True),
        run=override(omit_if_default=True),
    ),
)

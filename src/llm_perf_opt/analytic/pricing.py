"""What the analytic costs mean on hardware and across views, as records of :mod:`llm_perf_opt.records.analytic`:
per-stage rows, operator categories, modules, each stage's lower-bound time on each GPU (the counted FLOPs over the
dense datasheet peak and the bytes over the bandwidth, by :func:`llm_perf_opt.measure.efficiency.speed_of_light`),
and the what-if over a page's views (OCR-2 tile counts, v1 modes and crop grids).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from llm_perf_opt.analytic.model import ModuleCost, StageCost, prefill
from llm_perf_opt.analytic.settings import AnalyticSettings
from llm_perf_opt.analytic.spec import ModelSpec, Workload
from llm_perf_opt.errors import UserError
from llm_perf_opt.hardware.table import GpuSpec, compute_dtype_key
from llm_perf_opt.measure.efficiency import speed_of_light
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode
from llm_perf_opt.records.analytic import (
    CategoryRow,
    GpuWhatIf,
    ModeSweep,
    ModeSweepRow,
    ModuleRow,
    StageBound,
    StageCostRow,
    TileSweep,
    TileSweepRow,
    ViewsPrice,
)
from llm_perf_opt.records.vocabulary import PREFILL

_LAYER_INDEX = re.compile(r"\.layers\.\d+\.")


def stage_row(cost: StageCost) -> StageCostRow:
    """A stage's FLOPs and bytes: each field of the row is the stage's property of the same name."""
    return StageCostRow(**{f.name: getattr(cost, f.name) for f in attrs.fields(StageCostRow)})


def category_table(cost: StageCost) -> tuple[CategoryRow, ...]:
    """FLOPs and bytes per operator category (matmul, attention, ...) with shares, largest FLOPs first."""
    sums: dict[str, list[float]] = {}
    for m in cost.modules:
        total = sums.setdefault(m.category, [0.0, 0.0])
        total[0] += m.flops
        total[1] += m.bytes
    ranked = sorted(sums.items(), key=lambda item: item[1][0], reverse=True)
    return tuple(
        CategoryRow(
            category=category,
            flops=f,
            bytes=b,
            share_of_flops=f / cost.flops if cost.flops else 0.0,
            share_of_bytes=b / cost.bytes if cost.bytes else 0.0,
        )
        for category, (f, b) in ranked
    )


def module_table(cost: StageCost) -> tuple[ModuleRow, ...]:
    """Modules of a stage grouped across layers (`.layers.N.` -> `.layers.*.`; each group summed as a StageCost),
    largest FLOPs first."""
    groups: dict[str, list[ModuleCost]] = {}
    for m in cost.modules:
        groups.setdefault(_LAYER_INDEX.sub(".layers.*.", m.name), []).append(m)
    sums = sorted((StageCost(name, tuple(ms)) for name, ms in groups.items()), key=lambda g: g.flops, reverse=True)
    total = cost.flops or 1.0
    return tuple(
        ModuleRow(
            module=g.stage,
            category=g.modules[0].category,
            calls=len(g.modules),
            flops=g.flops,
            weight_bytes=g.weight_bytes,
            activation_bytes=g.activation_bytes,
            kv_bytes=g.kv_bytes,
            share_of_flops=g.flops / total,
        )
        for g in sums
    )


def dense_peak(gpu: GpuSpec, dtype: str) -> float | None:
    """The GPU's dense datasheet TFLOP/s for `dtype` (float32 without TF32), or None when the table has none."""
    return gpu.dense_tflops.get(compute_dtype_key(dtype, tf32_matmul=False))


def stage_bound(cost: StageCost, dense_tflops: float, bandwidth_gbps: float) -> StageBound:
    """Lower-bound time of a stage: max(matmul FLOPs / dense peak, bytes / bandwidth), and which bound it is."""
    seconds, bound = speed_of_light(cost.matmul_flops, cost.bytes, dense_tflops * 1e12, bandwidth_gbps * 1e9)
    return StageBound(speed_of_light_ms=seconds * 1e3, bound=bound)


def stage_bounds(costs: Mapping[str, StageCost], gpu: GpuSpec, dtype: str) -> dict[str, StageBound]:
    """Every stage's lower bound on `gpu` (a UserError when the table has no dense `dtype` peak for it)."""
    peak = dense_peak(gpu, dtype)
    if peak is None:
        raise UserError(
            f"the hardware table has no dense {compute_dtype_key(dtype, tf32_matmul=False)} peak for {gpu.key}, "
            "the GPU the analytic report prices its what-ifs on",
            "Set analytic.reference_gpu to a GPU of hardware/gpus.yaml with that peak, e.g. h100_sxm",
        )
    return {stage: stage_bound(cost, peak, gpu.bandwidth_gbps) for stage, cost in costs.items()}


def what_if(costs: Mapping[str, StageCost], gpus: Sequence[GpuSpec], dtype: str) -> tuple[GpuWhatIf, ...]:
    """Lower-bound time per stage on each GPU that has a dense peak for `dtype`."""
    return tuple(
        GpuWhatIf(
            gpu=gpu.display_name,
            key=gpu.key,
            dense_tflops=peak,
            bandwidth_gbps=gpu.bandwidth_gbps,
            stages={stage: stage_bound(cost, peak, gpu.bandwidth_gbps) for stage, cost in costs.items()},
        )
        for gpu in gpus
        if (peak := dense_peak(gpu, dtype)) is not None
    )


def priced_views(spec: ModelSpec, workload: Workload, gpu: GpuSpec, dtype: str) -> ViewsPrice:
    """One what-if row: the image and prompt tokens, the vision and prefill cost, and prefill's bound on `gpu`."""
    costs = prefill(spec, workload)
    pre = costs[PREFILL]
    return ViewsPrice(
        image_tokens=workload.image_tokens(spec),
        prompt_tokens=workload.prompt_tokens(spec),
        vision_flops=sum(costs[stage].matmul_flops for stage in spec.vision_stages),
        prefill_flops=pre.matmul_flops,
        prefill_bytes=pre.bytes,
        prefill_speed_of_light_ms=stage_bounds({PREFILL: pre}, gpu, dtype)[PREFILL].speed_of_light_ms,
    )


def tile_sweep(
    spec: ModelSpec, base: Workload, tiles: Sequence[int], gpu: GpuSpec, dtype: str
) -> tuple[TileSweepRow, ...]:
    """DeepSeek-OCR-2: prefill cost and lower-bound time on `gpu` for each tile count."""
    return tuple(
        TileSweepRow(tiles=int(n), price=priced_views(spec, attrs.evolve(base, tiles=int(n)), gpu, dtype))
        for n in tiles
    )


def mode_sweep(
    spec: ModelSpec, base: Workload, modes: Sequence[Mode], grids: Sequence[tuple[int, int]], gpu: GpuSpec, dtype: str
) -> tuple[ModeSweepRow, ...]:
    """DeepSeek-OCR v1: prefill cost and lower-bound time on `gpu` for each mode; a crop mode (Gundam) once per
    crop grid of `grids`. `configured` marks the row of `base` itself."""
    rows = []
    for mode in modes:
        for grid in grids if mode.crop_mode else [(1, 1)]:
            w = base.with_mode(mode, grid)
            rows.append(
                ModeSweepRow(
                    label=f"{mode.name} {grid[0]}x{grid[1]}" if mode.crop_mode else mode.name,
                    mode=mode.name,
                    global_size=w.global_size,
                    tile_size=w.tile_size if w.tiles else None,
                    crop_grid=w.crop_grid if w.tiles and w.crop_grid else None,
                    tiles=w.tiles,
                    configured=w == base,
                    price=priced_views(spec, w, gpu, dtype),
                )
            )
    return tuple(rows)


def view_sweep(
    settings: AnalyticSettings, spec: ModelSpec, base: Workload, gpu: GpuSpec, dtype: str
) -> TileSweep | ModeSweep:
    """The what-if over the page's views from `base`: the modes and crop grids of `analytic.mode_sweep` and
    `analytic.grid_sweep` for v1, the tile counts of `analytic.tile_sweep` for OCR-2."""
    if settings.model.mode is not None:
        rows = mode_sweep(spec, base, settings.sweep_modes, settings.grid_sweep, gpu, dtype)
        return ModeSweep(gpu=gpu.display_name, rows=rows)
    return TileSweep(gpu=gpu.display_name, rows=tile_sweep(spec, base, settings.tile_sweep, gpu, dtype))

"""`analytic-report`: a workload priced from the model config alone (no weights, no GPU), with what-ifs across GPUs
and across the page's views: tile counts for DeepSeek-OCR-2, resolution modes and Gundam crop grids for DeepSeek-OCR
(v1). Writes `static_analysis/analytic_model/report.json` and `report.md` under the run folder."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.analytic.model import StageCost, prefill, stage_costs
from llm_perf_opt.analytic.spec import ModelSpec, Workload
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.hardware.table import GpuSpec, compute_dtype_key, load_gpu_table
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, mode_from_config
from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.report.markdown import Doc, flops, ms, num_bytes, pct

OUTPUT_DIR = "static_analysis/analytic_model"
_LAYER_INDEX = re.compile(r"\.layers\.\d+\.")
_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}


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


def workload_from(cfg: DictConfig) -> Workload:
    """The analytic workload the config describes (`analytic.*` and the model's preprocessing or mode, and prompt)."""
    a = cfg.analytic
    dtype = str(a.dtype).lower()
    if dtype not in _DTYPE_BYTES:
        raise UserError(f"analytic.dtype={a.dtype} is not supported", "Use analytic.dtype=bfloat16, float16 or float32")
    text = a.text_tokens if a.text_tokens is not None else cfg.model.prompt.text_tokens
    base = Workload(
        text_tokens=require_whole("analytic.text_tokens", text, 0),
        new_tokens=require_whole("analytic.new_tokens", a.new_tokens, 1),
        dtype_bytes=_DTYPE_BYTES[dtype],
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


def _stage_row(cost: StageCost) -> dict[str, float]:
    return {
        "flops": cost.flops,
        "matmul_flops": cost.matmul_flops,
        "non_matmul_flops": cost.non_matmul_flops,
        "weight_bytes": cost.weight_bytes,
        "activation_bytes": cost.activation_bytes,
        "kv_bytes": cost.kv_bytes,
        "bytes": cost.bytes,
    }


def category_table(cost: StageCost) -> list[dict[str, Any]]:
    """FLOPs and bytes per operator category (matmul, attention, convolution, normalization, ...) with shares."""
    rows: dict[str, dict[str, Any]] = {}
    for m in cost.modules:
        row = rows.setdefault(m.category, {"category": m.category, "flops": 0.0, "bytes": 0.0})
        row["flops"] += m.flops
        row["bytes"] += m.bytes
    out = sorted(rows.values(), key=lambda r: r["flops"], reverse=True)
    for row in out:
        row["share_of_flops"] = row["flops"] / cost.flops if cost.flops else 0.0
        row["share_of_bytes"] = row["bytes"] / cost.bytes if cost.bytes else 0.0
    return out


def module_table(cost: StageCost) -> list[dict[str, Any]]:
    """Modules of a stage grouped across layers (`.layers.N.` -> `.layers.*.`), largest FLOPs first."""
    groups: dict[str, dict[str, Any]] = {}
    for m in cost.modules:
        key = _LAYER_INDEX.sub(".layers.*.", m.name)
        row = groups.setdefault(
            key,
            {
                "module": key,
                "category": m.category,
                "calls": 0,
                "flops": 0.0,
                "weight_bytes": 0.0,
                "activation_bytes": 0.0,
                "kv_bytes": 0.0,
            },
        )
        row["calls"] += 1
        for field in ("flops", "weight_bytes", "activation_bytes", "kv_bytes"):
            row[field] += getattr(m, field)
    total = cost.flops or 1.0
    rows = sorted(groups.values(), key=lambda r: r["flops"], reverse=True)
    for row in rows:
        row["share_of_flops"] = row["flops"] / total
    return rows


def speed_of_light(cost: StageCost, dense_tflops: float, bandwidth_gbps: float) -> dict[str, Any]:
    """Lower-bound time of a stage: max(matmul FLOPs / dense peak, bytes / bandwidth), and which bound it is."""
    compute_s = cost.matmul_flops / (dense_tflops * 1e12)
    memory_s = cost.bytes / (bandwidth_gbps * 1e9)
    return {
        "speed_of_light_ms": max(compute_s, memory_s) * 1e3,
        "bound": "compute" if compute_s >= memory_s else "memory",
    }


def what_if(costs: Mapping[str, StageCost], gpus: Sequence[GpuSpec], dtype: str) -> list[dict[str, Any]]:
    """Lower-bound time per stage on each GPU: max(FLOPs / dense peak, bytes / bandwidth)."""
    key = compute_dtype_key(dtype, tf32_matmul=False)
    out = []
    for gpu in gpus:
        peak = gpu.dense_tflops.get(key)
        if peak is None:
            continue
        out.append(
            {
                "gpu": gpu.display_name,
                "key": gpu.key,
                "dense_tflops": peak,
                "bandwidth_gbps": gpu.bandwidth_gbps,
                "stages": {stage: speed_of_light(cost, peak, gpu.bandwidth_gbps) for stage, cost in costs.items()},
            }
        )
    return out


def priced_views(spec: ModelSpec, workload: Workload, gpu: GpuSpec, dtype: str) -> dict[str, Any]:
    """One what-if row: the image and prompt tokens, the vision and prefill cost, and prefill's bound on `gpu`."""
    costs = prefill(spec, workload)
    pre = costs["prefill"]
    peak = gpu.dense_tflops[compute_dtype_key(dtype, tf32_matmul=False)]
    return {
        "image_tokens": workload.image_tokens(spec),
        "prompt_tokens": workload.prompt_tokens(spec),
        "vision_flops": sum(costs[stage].matmul_flops for stage in spec.vision_stages),
        "prefill_flops": pre.matmul_flops,
        "prefill_bytes": pre.bytes,
        "prefill_speed_of_light_ms": speed_of_light(pre, peak, gpu.bandwidth_gbps)["speed_of_light_ms"],
    }


def tile_sweep(spec: ModelSpec, base: Workload, tiles: Sequence[int], gpu: GpuSpec, dtype: str) -> list[dict[str, Any]]:
    """DeepSeek-OCR-2: prefill cost and lower-bound time on `gpu` for each tile count."""
    return [{"tiles": int(n), **priced_views(spec, attrs.evolve(base, tiles=int(n)), gpu, dtype)} for n in tiles]


def mode_sweep(
    spec: ModelSpec,
    base: Workload,
    modes: Sequence[Mode],
    grids: Sequence[tuple[int, int]],
    gpu: GpuSpec,
    dtype: str,
) -> list[dict[str, Any]]:
    """DeepSeek-OCR v1: prefill cost and lower-bound time on `gpu` for each mode; a crop mode (Gundam) once per
    crop grid of `grids`. `configured` marks the row of `base` itself."""
    rows = []
    for mode in modes:
        for grid in grids if mode.crop_mode else [(1, 1)]:
            w = base.with_mode(mode, grid)
            label = f"{mode.name} {grid[0]}x{grid[1]}" if mode.crop_mode else mode.name
            rows.append(
                {
                    "label": label,
                    "mode": mode.name,
                    "global_size": w.global_size,
                    "tile_size": w.tile_size if w.tiles else None,
                    "crop_grid": list(w.crop_grid) if w.tiles and w.crop_grid else None,
                    "tiles": w.tiles,
                    "configured": w == base,
                    **priced_views(spec, w, gpu, dtype),
                }
            )
    return rows


def view_sweep(cfg: DictConfig, spec: ModelSpec, workload: Workload, gpu: GpuSpec) -> tuple[str, dict[str, Any]]:
    """The report's what-if over the page's views: ("mode_sweep", ...) for v1, ("tile_sweep", ...) for OCR-2."""
    a, dtype = cfg.analytic, str(cfg.analytic.dtype)
    if has_modes(cfg.model):
        modes = [model_mode(cfg.model, name) for name in a.mode_sweep]
        grids = [crop_grid_from(g, "analytic.grid_sweep[]") for g in a.grid_sweep]
        return "mode_sweep", {"gpu": gpu.display_name, "rows": mode_sweep(spec, workload, modes, grids, gpu, dtype)}
    return "tile_sweep", {"gpu": gpu.display_name, "rows": tile_sweep(spec, workload, list(a.tile_sweep), gpu, dtype)}


def workload_row(spec: ModelSpec, workload: Workload, cfg: DictConfig) -> dict[str, Any]:
    """The report's description of the workload (v1: its mode and crop grid too)."""
    v1 = has_modes(cfg.model)
    return {
        "mode": model_mode(cfg.model).name if v1 else None,
        "global_size": workload.global_size,
        "tile_size": workload.tile_size,
        "tiles": workload.tiles,
        "crop_grid": list(workload.crop_grid) if workload.crop_grid else None,
        "text_tokens": workload.text_tokens,
        "new_tokens": workload.new_tokens,
        "dtype": str(cfg.analytic.dtype),
        "image_tokens": workload.image_tokens(spec),
        "prompt_tokens": workload.prompt_tokens(spec),
    }


def build_report(cfg: DictConfig) -> dict[str, Any]:
    """Everything the analytic report shows, JSON-ready."""
    spec = ModelSpec.from_architecture(cfg.model.architecture)
    workload = workload_from(cfg)
    costs = stage_costs(spec, workload)
    table = {g.key: g for g in load_gpu_table()}
    unknown = [k for k in cfg.analytic.gpus if k not in table]
    if unknown:
        raise UserError(
            f"analytic.gpus names GPUs missing from the hardware table: {', '.join(unknown)}",
            f"Use keys from hardware/gpus.yaml: {', '.join(table)}",
        )
    gpus = [table[k] for k in cfg.analytic.gpus]
    reference = table[str(cfg.analytic.reference_gpu)] if str(cfg.analytic.reference_gpu) in table else gpus[0]
    sweep_key, sweep = view_sweep(cfg, spec, workload, reference)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": str(cfg.model.name),
        "weights": "none: priced from the config alone",
        "workload_profile": OmegaConf.to_container(cfg.workload_profile, resolve=True)
        if cfg.get("workload_profile")
        else None,
        "conventions": "1 MAC = 2 FLOPs; matmul/attention/convolution FLOPs as executed (attention over the full "
        "score matrix); MoE routed experts counted for the active top-k only; norms and elementwise ops estimated "
        "separately (non_matmul_flops); bytes = weights read + activations + KV cache, analytic estimates",
        "workload": workload_row(spec, workload, cfg),
        "stages": {stage: _stage_row(cost) for stage, cost in costs.items()},
        "categories": {stage: category_table(cost) for stage, cost in costs.items()},
        "modules": {stage: module_table(costs[stage]) for stage in ("prefill", "decode")},
        "what_if": what_if(costs, gpus, str(cfg.analytic.dtype)),
        sweep_key: sweep,
    }


def _views_text(w: Mapping[str, Any]) -> str:
    """The page's views in words: OCR-2's tile count, or v1's mode and crop grid."""
    if w.get("mode") is None:
        return f"global view {w['global_size']} px + {w['tiles']} tiles of {w['tile_size']} px"
    if w["tiles"]:
        across, down = w["crop_grid"]
        return f"mode {w['mode']}: global view {w['global_size']} px + {across}x{down} tiles of {w['tile_size']} px"
    return f"mode {w['mode']}: one {w['global_size']} px view, no tiles"


def _sweep_section(doc: Doc, r: Mapping[str, Any]) -> None:
    """The what-if over the page's views: tile counts (OCR-2) or modes and crop grids (v1)."""
    if "mode_sweep" in r:
        sweep = r["mode_sweep"]
        doc.h2(f"What-if: resolution modes and Gundam crop grids (prefill on {sweep['gpu']})")
        first = "mode"
        labels = [t["label"] + (" (this workload)" if t["configured"] else "") for t in sweep["rows"]]
    else:
        sweep = r["tile_sweep"]
        doc.h2(f"What-if: tiles per page (prefill on {sweep['gpu']})")
        first = "tiles"
        labels = [str(t["tiles"]) for t in sweep["rows"]]
    doc.table(
        [
            first,
            "image tokens",
            "prompt tokens",
            "vision FLOPs",
            "prefill matmul FLOPs",
            "prefill bytes",
            "lower-bound ms",
        ],
        [
            [
                label,
                str(t["image_tokens"]),
                str(t["prompt_tokens"]),
                flops(t["vision_flops"]),
                flops(t["prefill_flops"]),
                num_bytes(t["prefill_bytes"]),
                ms(t["prefill_speed_of_light_ms"], 2),
            ]
            for label, t in zip(labels, sweep["rows"], strict=True)
        ],
    )


def report_md(r: Mapping[str, Any], top_modules: int = 30) -> str:
    w = r["workload"]
    profile = r.get("workload_profile")
    doc = Doc(f"Analytic model: {r['model']}" + (f" — workload {profile['name']}" if profile else ""))
    doc.para(
        f"Priced from the config alone (no weights). Workload: 1 page, {_views_text(w)} → {w['image_tokens']} image "
        f"tokens, prompt {w['prompt_tokens']} tokens, {w['new_tokens']} new tokens, {w['dtype']}. {r['conventions']}."
    )
    doc.h2("Per stage")
    doc.table(
        [
            "stage",
            "matmul FLOPs",
            "other FLOPs (est.)",
            "weights read",
            "activations",
            "KV cache",
            "bytes",
            "FLOP/byte",
        ],
        [
            [
                s,
                flops(v["matmul_flops"]),
                flops(v["non_matmul_flops"]),
                num_bytes(v["weight_bytes"]),
                num_bytes(v["activation_bytes"]),
                num_bytes(v["kv_bytes"]),
                num_bytes(v["bytes"]),
                f"{v['matmul_flops'] / v['bytes']:,.1f}" if v["bytes"] else "n/a",
            ]
            for s, v in r["stages"].items()
        ],
    )
    doc.h2("What-if: lower-bound time per stage (ms) on each GPU")
    doc.para(
        "max(matmul FLOPs / dense peak, bytes / bandwidth), datasheet peaks from hardware/gpus.yaml; "
        "(c) compute-bound, (m) memory-bound."
    )
    stages_ = list(r["stages"])
    doc.table(
        ["GPU", "dense TFLOP/s", "GB/s", *stages_],
        [
            [
                g["gpu"],
                f"{g['dense_tflops']:,.1f}",
                f"{g['bandwidth_gbps']:,.0f}",
                *[f"{ms(g['stages'][s]['speed_of_light_ms'], 2)} ({g['stages'][s]['bound'][0]})" for s in stages_],
            ]
            for g in r["what_if"]
        ],
    )
    _sweep_section(doc, r)
    doc.h2("Operator categories (share of each stage's FLOPs and bytes)")
    doc.table(
        ["stage", "category", "FLOPs", "share of FLOPs", "bytes", "share of bytes"],
        [
            [
                stage,
                c["category"],
                flops(c["flops"]),
                pct(c["share_of_flops"]),
                num_bytes(c["bytes"]),
                pct(c["share_of_bytes"]),
            ]
            for stage, cats in r["categories"].items()
            for c in cats
        ],
    )
    for stage, rows in r["modules"].items():
        doc.h2(f"Modules of {stage} (top {top_modules} by FLOPs, layers grouped)")
        doc.table(
            ["module", "category", "calls", "FLOPs", "share", "weights", "activations", "KV cache"],
            [
                [
                    f"`{m['module']}`",
                    m["category"],
                    str(m["calls"]),
                    flops(m["flops"]),
                    pct(m["share_of_flops"]),
                    num_bytes(m["weight_bytes"]),
                    num_bytes(m["activation_bytes"]),
                    num_bytes(m["kv_bytes"]),
                ]
                for m in rows[:top_modules]
            ],
        )
    return doc.text()


def write_analytic_report(art: ArtifactsManager, cfg: DictConfig) -> Path:
    """Write report.json and report.md under `static_analysis/analytic_model/` of the run folder."""
    report = build_report(cfg)
    art.write_json(f"{OUTPUT_DIR}/report.json", report)
    return art.write_text(f"{OUTPUT_DIR}/report.md", report_md(report))

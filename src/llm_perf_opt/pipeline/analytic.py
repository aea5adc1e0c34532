"""`analytic-report`: a workload priced from the model config alone (no weights, no GPU), with what-ifs across GPUs
and tile counts. Writes `static_analysis/analytic_model/report.json` and `report.md` under the run folder."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.analytic.model import StageCost, decode, prefill
from llm_perf_opt.analytic.spec import ModelSpec, Workload
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.hardware.table import GpuSpec, compute_dtype_key, load_gpu_table
from llm_perf_opt.report.markdown import Doc, flops, ms, num_bytes, pct
from llm_perf_opt.schema import SCHEMA_VERSION

OUTPUT_DIR = "static_analysis/analytic_model"
_LAYER_INDEX = re.compile(r"\.layers\.\d+\.")
_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}


def workload_from(cfg: DictConfig) -> Workload:
    """The analytic workload the config describes (`analytic.*` and the model's preprocessing and prompt)."""
    a = cfg.analytic
    dtype = str(a.dtype).lower()
    if dtype not in _DTYPE_BYTES:
        raise UserError(f"analytic.dtype={a.dtype} is not supported", "Use analytic.dtype=bfloat16, float16 or float32")
    pre = cfg.model.preprocess
    text = a.text_tokens if a.text_tokens is not None else cfg.model.prompt.text_tokens
    return Workload(
        global_size=int(pre.global_size),
        tile_size=int(pre.tile_size),
        tiles=require_whole("analytic.tiles", a.tiles, 0),
        text_tokens=require_whole("analytic.text_tokens", text, 0),
        new_tokens=require_whole("analytic.new_tokens", a.new_tokens, 1),
        dtype_bytes=_DTYPE_BYTES[dtype],
    )


def stage_costs(spec: ModelSpec, workload: Workload) -> dict[str, StageCost]:
    """prefill (with its vision sub-stages) and decode."""
    costs = dict(prefill(spec, workload))
    costs["decode"] = decode(spec, workload)
    return costs


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


def what_if(costs: Mapping[str, StageCost], gpus: Sequence[GpuSpec], dtype: str) -> list[dict[str, Any]]:
    """Lower-bound time per stage on each GPU: max(FLOPs / dense peak, bytes / bandwidth)."""
    key = compute_dtype_key(dtype, tf32_matmul=False)
    out = []
    for gpu in gpus:
        peak = gpu.dense_tflops.get(key)
        if peak is None:
            continue
        row: dict[str, Any] = {
            "gpu": gpu.display_name,
            "key": gpu.key,
            "dense_tflops": peak,
            "bandwidth_gbps": gpu.bandwidth_gbps,
            "stages": {},
        }
        for stage, cost in costs.items():
            compute_s = cost.matmul_flops / (peak * 1e12)
            memory_s = cost.bytes / (gpu.bandwidth_gbps * 1e9)
            row["stages"][stage] = {
                "speed_of_light_ms": max(compute_s, memory_s) * 1e3,
                "bound": "compute" if compute_s >= memory_s else "memory",
            }
        out.append(row)
    return out


def tile_sweep(spec: ModelSpec, base: Workload, tiles: Sequence[int], gpu: GpuSpec, dtype: str) -> list[dict[str, Any]]:
    """Prefill cost and lower-bound time on `gpu` for each tile count."""
    peak = gpu.dense_tflops[compute_dtype_key(dtype, tf32_matmul=False)] * 1e12
    rows = []
    for n in tiles:
        w = Workload(
            global_size=base.global_size,
            tile_size=base.tile_size,
            tiles=int(n),
            text_tokens=base.text_tokens,
            new_tokens=base.new_tokens,
            dtype_bytes=base.dtype_bytes,
        )
        pre = prefill(spec, w)["prefill"]
        rows.append(
            {
                "tiles": int(n),
                "image_tokens": w.image_tokens(spec),
                "prompt_tokens": w.prompt_tokens(spec),
                "prefill_flops": pre.matmul_flops,
                "prefill_bytes": pre.bytes,
                "prefill_speed_of_light_ms": max(pre.matmul_flops / peak, pre.bytes / (gpu.bandwidth_gbps * 1e9)) * 1e3,
            }
        )
    return rows


def build_report(cfg: DictConfig) -> dict[str, Any]:
    """Everything the analytic report shows, JSON-ready."""
    spec = ModelSpec.from_architecture(OmegaConf.to_container(cfg.model.architecture, resolve=True))  # type: ignore[arg-type]
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
        "workload": {
            "global_size": workload.global_size,
            "tile_size": workload.tile_size,
            "tiles": workload.tiles,
            "text_tokens": workload.text_tokens,
            "new_tokens": workload.new_tokens,
            "dtype": str(cfg.analytic.dtype),
            "image_tokens": workload.image_tokens(spec),
            "prompt_tokens": workload.prompt_tokens(spec),
        },
        "stages": {stage: _stage_row(cost) for stage, cost in costs.items()},
        "categories": {stage: category_table(cost) for stage, cost in costs.items()},
        "modules": {stage: module_table(costs[stage]) for stage in ("prefill", "decode")},
        "what_if": what_if(costs, gpus, str(cfg.analytic.dtype)),
        "tile_sweep": {
            "gpu": reference.display_name,
            "rows": tile_sweep(spec, workload, list(cfg.analytic.tile_sweep), reference, str(cfg.analytic.dtype)),
        },
    }


def report_md(r: Mapping[str, Any], top_modules: int = 30) -> str:
    w = r["workload"]
    profile = r.get("workload_profile")
    doc = Doc(f"Analytic model: {r['model']}" + (f" — workload {profile['name']}" if profile else ""))
    doc.para(
        f"Priced from the config alone (no weights). Workload: 1 page, global view {w['global_size']} px + "
        f"{w['tiles']} tiles of {w['tile_size']} px → {w['image_tokens']} image tokens, prompt {w['prompt_tokens']} "
        f"tokens, {w['new_tokens']} new tokens, {w['dtype']}. {r['conventions']}."
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
    sweep = r["tile_sweep"]
    doc.h2(f"What-if: tiles per page (prefill on {sweep['gpu']})")
    doc.table(
        ["tiles", "image tokens", "prompt tokens", "prefill matmul FLOPs", "prefill bytes", "lower-bound ms"],
        [
            [
                str(t["tiles"]),
                str(t["image_tokens"]),
                str(t["prompt_tokens"]),
                flops(t["prefill_flops"]),
                num_bytes(t["prefill_bytes"]),
                ms(t["prefill_speed_of_light_ms"], 2),
            ]
            for t in sweep["rows"]
        ],
    )
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

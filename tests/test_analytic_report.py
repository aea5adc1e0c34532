"""`analytic-report`: a workload priced from the config alone, what-ifs across GPUs and tile counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import DictConfig

from helpers import run_cli
from llm_perf_opt.cli.common import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline.analytic import build_report


def compose_analytic(*overrides: str) -> DictConfig:
    """The analytic config for DeepSeek-OCR-2 (these tests price OCR-2; v1, the default, is in test_analytic_v1)."""
    return compose_config("analytic", "model=deepseek_ocr2", *overrides)


def test_report_prices_every_stage_and_gpu() -> None:
    r = build_report(compose_analytic())
    assert r["workload"]["image_tokens"] == 1121 and r["workload"]["prompt_tokens"] == 1134
    stages = r["stages"]
    assert set(stages) == {"vision/sam", "vision/encoder", "vision/projector", "prefill", "decode"}
    # Reference (deepseek-ocr-facts §4): 1,366 + 6 x 728 GFLOPs of vision per A4 page at 6 tiles.
    vision = sum(stages[s]["matmul_flops"] for s in ("vision/sam", "vision/encoder", "vision/projector"))
    assert vision == pytest.approx((1366.2 + 6 * 728.0) * 1e9, rel=0.005)
    # 31 decode steps, each reading ~1.148 GB of active weights in bf16.
    assert stages["decode"]["weight_bytes"] == pytest.approx(31 * 1.148e9, rel=0.01)
    gpus = {g["key"] for g in r["what_if"]}
    assert {"h100_sxm", "h200_sxm", "a100_sxm4_80gb", "l4", "rtx_4090"} <= gpus
    h100 = next(g for g in r["what_if"] if g["key"] == "h100_sxm")
    decode = h100["stages"]["decode"]
    assert decode["bound"] == "memory"
    assert decode["speed_of_light_ms"] == pytest.approx(stages["decode"]["bytes"] / 3.35e12 * 1e3)
    tiles = [row["tiles"] for row in r["tile_sweep"]["rows"]]
    assert tiles == [0, 2, 3, 4, 5, 6]
    flops = [row["prefill_flops"] for row in r["tile_sweep"]["rows"]]
    assert flops == sorted(flops)


def test_unknown_gpu_key_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no_such_gpu"):
        build_report(compose_analytic("analytic.gpus=[h100_sxm,no_such_gpu]"))


def test_command_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "an"
    done = run_cli(
        "llm_perf_opt.cli.analytic", "model=deepseek_ocr2", "analytic.tiles=2", f"hydra.run.dir={out}", timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "static_analysis/analytic_model/report.json").read_text())
    assert report["workload"]["tiles"] == 2 and report["workload"]["image_tokens"] == 545
    md = (out / "static_analysis/analytic_model/report.md").read_text()
    assert "What-if: lower-bound time per stage" in md and "NVIDIA L4" in md and "Modules of prefill" in md
    assert json.loads((out / "run_status.json").read_text())["state"] == "complete"


def test_named_workload_is_priced_and_measured_alike(tmp_path: Path) -> None:
    """workload=ocr2-snippet sets the page, the decode length and the analytic workload together."""
    r = build_report(compose_analytic("workload=ocr2-snippet"))
    assert r["workload_profile"]["name"] == "ocr2-snippet"
    assert r["workload"]["tiles"] == 0 and r["workload"]["new_tokens"] == 64 and r["workload"]["image_tokens"] == 257
    out = tmp_path / "run"
    done = run_cli(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr2_tiny",
        "workload=ocr2-snippet",
        "infer.max_new_tokens=3",
        "run.repeats=1",
        "pipeline/torch_profiler=min",
        f"hydra.run.dir={out}",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["workload_profile"]["name"] == "ocr2-snippet"
    assert {rec["image"] for rec in metrics["records"]} == {"snippet_small.png"}
    assert metrics["records"][0]["tiles"] == 0
    assert "workload ocr2-snippet" in (out / "report.md").read_text()
    priced = json.loads((out / "static_analysis/analytic_model/report.json").read_text())
    assert priced["workload"]["tiles"] == 0


def test_category_shares_add_up() -> None:
    r = build_report(compose_analytic())
    for stage, cats in r["categories"].items():
        assert sum(c["share_of_flops"] for c in cats) == pytest.approx(1.0), stage
        assert sum(c["share_of_bytes"] for c in cats) == pytest.approx(1.0), stage
    prefill = {c["category"]: c for c in r["categories"]["prefill"]}
    assert prefill["matmul"]["share_of_flops"] > 0.5

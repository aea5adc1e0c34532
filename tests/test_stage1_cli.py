"""End-to-end `stage1-run` on the tiny model (CPU), its artifacts and its handling of bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from helpers import run_cli, run_main
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.records.common import SCHEMA_VERSION

#: Runs the console scripts in child processes (seconds to a minute each).
pytestmark = pytest.mark.slow

TINY = ["model=deepseek_ocr2_tiny"]


def stage1(*overrides: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`stage1-run` through its module (the console script calls the same main)."""
    return run_cli("llm_perf_opt.cli.stage1", *overrides, timeout=timeout)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real sample pages (0 and 4 tiles) and one corrupt file."""
    root = tmp_path_factory.mktemp("pages")
    for name in ("snippet_small.png", "slide_square.png"):
        shutil.copy(bundled_samples_dir() / name, root / name)
    (root / "broken.PNG").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return root


@pytest.fixture(scope="module")
def tiny_run(
    pages: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    viz = tmp_path_factory.mktemp("viz-abs")
    done = stage1(
        *TINY,
        f"dataset.root={pages}",
        "run.repeats=2",
        "run.warmup=1",
        "infer.max_new_tokens=3",
        "dataset.max_images=2",
        "dataset.sampling=sorted",
        "device=cpu",
        "pipeline.torch_profiler.chrome_trace=true",
        f"pipeline.torch_profiler.output.visualization.save_dir={viz}",
        f"hydra.run.dir={out}",
    )
    return out, viz, done


def test_tiny_run_completes_with_every_artifact(tiny_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    out, viz, done = tiny_run
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (
        "report.md",
        "metrics.json",
        "operators.md",
        "stakeholder_summary.md",
        "env.json",
        "inputs.yaml",
        "assumptions.md",
        "config.yaml",
        "run_status.json",
        "predictions/predictions.jsonl",
        "torch_profiler/trace.json.gz",
        "static_analysis/analytic_model/report.json",
        "plots/stage_breakdown.png",
        "plots/decode_latency.png",
        "plots/operator_shares.png",
        "static_analysis/analytic_model/report.md",
    ):
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name
    status = json.loads((out / "run_status.json").read_text())
    assert status["state"] == "complete"
    assert "report.md" in status["files"]
    # The gallery goes to the absolute save_dir, not into the run folder.
    assert (viz / "predictions.md").is_file()
    assert not (out / "viz").exists()
    assert len(list(viz.glob("*.png"))) == 2
    with gzip.open(out / "torch_profiler/trace.json.gz", "rt") as trace:
        assert "traceEvents" in json.load(trace)
    # The default preset records no shapes, memory or stacks, so operators.md has no columns for them.
    assert "Shapes, memory and call sites" not in (out / "operators.md").read_text()


def test_the_last_line_is_the_report_and_the_time_budget_adds_up(
    tiny_run: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    """`stage1-run | tail -1` is the report's bare path, after the line saying where the time went, which
    metrics.json and report.md keep too."""
    out, _, done = tiny_run
    lines = done.stdout.splitlines()
    assert lines[-1] == str(out / "report.md")
    budget = json.loads((out / "metrics.json").read_text())["time_budget"]
    parts = {p["name"]: p["seconds"] for p in budget["parts"]}
    named = {"start", "build", "timed passes", "FLOP counts", "warm-up", "profiled pass", "reports", "other"}
    assert named <= set(parts)
    assert parts["FLOP counts"] > 0  # the one count, in its own part: "timed passes" holds what the timed passes cost
    assert all(seconds >= 0 for seconds in parts.values())
    assert sum(parts.values()) == pytest.approx(budget["total_s"])
    assert lines[-2].strip().startswith("took ") and "start " in lines[-2]
    assert f"Time budget: {lines[-2].strip()}" in (out / "report.md").read_text()


def test_metrics_schema(tiny_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    out, _, _ = tiny_run
    m = json.loads((out / "metrics.json").read_text())
    assert m["schema_version"] == SCHEMA_VERSION
    assert m["stage"] == "stage1"
    assert m["config_digest"].startswith("sha256:")
    assert m["model"]["weights"] == "random"
    assert m["model"]["parameters"] > 1_000_000
    family = m["model"]["family"]  # as the adapter describes it (deepseek_ocr2_tiny: tiles of 768 px)
    assert (family["name"], family["tiled_views"], family["tiling"], family["tile_px"]) == (
        "deepseek_ocr2",
        True,
        True,
        768,
    )
    assert m["device"]["type"] == "cpu"
    assert m["settings"]["repeats"] == 2 and m["settings"]["warmup"] == 1
    assert m["settings"]["sources"]["run.repeats"] == "config/override"
    assert (m["settings"]["measured_passes"], m["settings"]["asked_passes"]) == (4, 4)  # 2 images x 2 passes
    records = m["records"]
    assert len(records) == 4  # 2 images x 2 repeats; warm-up passes excluded
    for rec in records:
        assert rec["new_tokens"] == 3
        assert len(rec["decode_step_ms"]) == 2
        assert rec["prefill_ms"] >= sum(rec["vision_ms"].values())
        assert rec["ttft_ms"] == pytest.approx(rec["preprocess_ms"] + rec["prefill_ms"])
    tiles = {r["image"]: r["tiles"] for r in records}
    assert tiles == {"slide_square.png": 4, "snippet_small.png": 0}
    stage_names = [s["stage"] for s in m["stages"]]
    for name in (
        "preprocess",
        "prefill",
        "vision/sam",
        "vision/encoder",
        "vision/projector",
        "ttft",
        "decode",
        "decode/step",
        "e2e",
    ):
        assert name in stage_names
    summary = next(s for s in m["stages"] if s["stage"] == "prefill")["summary"]
    assert set(summary) >= {"n", "mean", "std", "min", "p50", "p90", "max", "cv", "ci95_low", "ci95_high", "unit"}
    assert summary["unit"] == "ms" and summary["n"] == 4
    assert next(s for s in m["stages"] if s["stage"] == "vision/sam")["nested_in"] == "prefill"
    mfu = {r["stage"]: r for r in m["mfu"]}
    assert set(mfu) == {"prefill", "vision/sam", "vision/encoder", "vision/projector", "decode"}
    assert mfu["prefill"]["flops_total"] > mfu["vision/sam"]["flops_total"] > 0
    assert mfu["prefill"]["mfu"] is None and mfu["prefill"]["peak"] is None  # no peak for a CPU
    assert m["top_operators"] and m["operator_sort_key"] == "self_cpu_ms"
    eff = {e["stage"]: e for e in m["efficiency"]}
    assert set(eff) == {"prefill", "vision/sam", "vision/encoder", "vision/projector", "decode"}
    assert eff["decode"]["bytes"] > 0 and eff["decode"]["mbu"] is None  # no bandwidth peak for a CPU


def test_inputs_report_and_predictions(tiny_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    out, _, _ = tiny_run
    inputs = yaml.safe_load((out / "inputs.yaml").read_text())
    assert inputs["count"] == 2
    assert [Path(i["path"]).name for i in inputs["images"]] == ["slide_square.png", "snippet_small.png"]
    assert inputs["images"][0]["width"] == 1000 and inputs["images"][0]["bytes"] > 0
    assert [Path(s["path"]).name for s in inputs["skipped"]] == ["broken.PNG"]
    report = (out / "report.md").read_text()
    assert "Skipped input broken.PNG" in report
    assert "Random weights" in report
    assert "↳ vision/sam" in report
    assert "MFU is n/a" in report
    assert "![Where the time goes, per image](plots/stage_breakdown.png)" in report
    preds = [json.loads(line) for line in (out / "predictions/predictions.jsonl").read_text().splitlines()]
    assert [p["image"] for p in preds] == ["slide_square.png", "snippet_small.png"]
    assert all(len(p["token_ids"]) == 3 and p["text"] is None for p in preds)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["model"]["name"] == "deepseek_ocr2_tiny"
    assert config["run"]["repeats"] == 2


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["dataset.root=/nonexistent/pages"], "dataset.root"),
        (["run.repeats=0"], "run.repeats"),
        (["run.batch_size=0"], "run.batch_size"),
        (["infer.max_new_tokens=-2"], "infer.max_new_tokens"),
        (["model.path=__EMPTY__"], "config.json"),
        (["model.path=/nonexistent/checkpoint"], "model.path=/nonexistent/checkpoint does not exist"),
        (["dataset.subset_filelist=__MISSING_LIST__"], "not_there.png"),
        (["run.profiler_window=true"], "run.profiler_window=true opens a window for Nsight Compute"),
    ],
)
def test_bad_input_fails_cleanly(overrides: list[str], needle: str, tmp_path: Path, pages: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "list.txt").write_text("snippet_small.png\nnot_there.png\n")
    overrides = [
        o.replace("__EMPTY__", str(tmp_path / "empty")).replace("__MISSING_LIST__", str(tmp_path / "list.txt"))
        for o in overrides
    ]
    out = tmp_path / "run"
    done = run_main(
        "llm_perf_opt.cli.stage1", *TINY, "device=cpu", f"dataset.root={pages}", *overrides, f"hydra.run.dir={out}"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error:" in done.stderr and needle in done.stderr
    assert "Traceback" not in done.stderr
    if needle in REFUSED_AT_LAUNCH:  # a setting's type or range: refused when the config is composed, no folder made
        assert not out.exists()
        return
    status = json.loads((out / "run_status.json").read_text())
    assert status["state"] == "failed"
    assert needle in status["message"]
    assert not (out / "report.md").exists()


# Settings the launch check refuses (settings_schema) before Hydra makes the run folder.
REFUSED_AT_LAUNCH = {"run.repeats", "run.batch_size", "infer.max_new_tokens"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_is_a_clear_error(tmp_path: Path) -> None:
    # In this process: the exit codes of the real process are checked by tiny_run and the sweep tests.
    done = run_main("llm_perf_opt.cli.stage1", *TINY, "device=cuda", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert "device=cuda" in done.stderr and "device=cpu" in done.stderr
    assert json.loads((tmp_path / "run" / "run_status.json").read_text())["state"] == "failed"


def test_unknown_model_names_the_options(tmp_path: Path) -> None:
    done = run_main("llm_perf_opt.cli.stage1", "model=no_such_model", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode != 0
    assert "no_such_model" in done.stderr and "deepseek_ocr2" in done.stderr


def test_each_input_keeps_its_first_pass_beside_its_timed_median(
    tiny_run: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    """With a warm-up pass, each input's first one is kept (outside the timed records) and shown in report.md's
    per-input table with the range of its extra time over the timed median."""
    out, _, done = tiny_run
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    firsts = {r["image"]: r for r in metrics["first_passes"]}
    assert set(firsts) == {r["image"] for r in metrics["records"]}  # one per input, the same inputs
    assert all(r["e2e_ms"] > 0 and r["new_tokens"] == 3 for r in firsts.values())
    assert len(metrics["records"]) == 2 * len(firsts)  # the first passes are not among the timed ones
    report = (out / "report.md").read_text()
    assert "|e2e|first pass e2e|" in report
    assert "First pass e2e: each input's first warm-up pass" in report

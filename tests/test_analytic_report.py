"""`analytic-report`: a workload priced from the config alone, what-ifs across GPUs and tile counts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from omegaconf import DictConfig
from PIL import Image
from transformers import DeepseekOcr2Config

import llm_perf_opt.conf
from helpers import run_main
from llm_perf_opt.analytic.workload import MeasuredInput, RunWorkload
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, plain
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline.analytic import build_report, build_run_report, check_workload_model
from llm_perf_opt.records.io import dumps
from llm_perf_opt.records.stage1 import ImageRecord
from llm_perf_opt.report.analytic_report import analytic_report_md
from llm_perf_opt.session.adapters.registry import make_adapter


def compose_analytic(*overrides: str) -> DictConfig:
    """The analytic config for DeepSeek-OCR-2 (these tests price OCR-2; v1, the default, is in test_analytic_v1)."""
    return compose_config("analytic", "model=deepseek_ocr2", *overrides)


def report_data(cfg: DictConfig) -> dict[str, Any]:
    """The report of `cfg` as report.json holds it."""
    return dict(json.loads(dumps(build_report(command_config(cfg)))))


def test_report_prices_every_stage_and_gpu() -> None:
    r = report_data(compose_analytic())
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
        build_report(command_config(compose_analytic("analytic.gpus=[h100_sxm,no_such_gpu]")))


@pytest.mark.slow
def test_command_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "an"
    done = run_main("llm_perf_opt.cli.analytic", "model=deepseek_ocr2", "analytic.tiles=2", f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "static_analysis/analytic_model/report.json").read_text())
    assert report["workload"]["tiles"] == 2 and report["workload"]["image_tokens"] == 545
    md = (out / "static_analysis/analytic_model/report.md").read_text()
    assert "What-if: lower-bound time per stage" in md and "NVIDIA L4" in md and "Modules of prefill" in md
    assert json.loads((out / "run_status.json").read_text())["state"] == "complete"


@pytest.mark.slow
def test_named_workload_is_priced_and_measured_alike(tmp_path: Path) -> None:
    """workload=ocr2-snippet sets the page, the decode length and the analytic workload together."""
    r = report_data(compose_analytic("workload=ocr2-snippet"))
    assert r["workload_profile"]["name"] == "ocr2-snippet"
    assert r["workload"]["tiles"] == 0 and r["workload"]["new_tokens"] == 64 and r["workload"]["image_tokens"] == 257
    out = tmp_path / "run"
    done = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr2_tiny",
        "workload=ocr2-snippet",
        "infer.max_new_tokens=3",
        "run.repeats=1",
        "pipeline/torch_profiler=min",
        f"hydra.run.dir={out}",
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
    r = report_data(compose_analytic())
    for stage, cats in r["categories"].items():
        assert sum(c["share_of_flops"] for c in cats) == pytest.approx(1.0), stage
        assert sum(c["share_of_bytes"] for c in cats) == pytest.approx(1.0), stage
    prefill = {c["category"]: c for c in r["categories"]["prefill"]}
    assert prefill["matmul"]["share_of_flops"] > 0.5


# ---- named workloads name their model ----------------------------------------------------------------------------
WORKLOADS = sorted(p.stem for p in (Path(llm_perf_opt.conf.__file__).parent / "workload").glob("*.yaml"))


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_selects_a_model_it_lists(name: str) -> None:
    cfg = compose_config("analytic", f"workload={name}")
    models = list(cfg.workload_profile.models)
    assert cfg.model.name == models[0] and len(models) == 2 and models[1] == f"{models[0]}_tiny"
    check_workload_model(command_config(cfg))  # the workload's own model passes
    check_workload_model(
        command_config(compose_config("stage1", f"model={models[1]}", f"workload={name}"))
    )  # so does its tiny one


def test_workload_prices_its_own_model() -> None:
    """`analytic-report workload=ocr2-receipt` prices DeepSeek-OCR-2 (the default model is v1)."""
    r = build_report(command_config(compose_config("analytic", "workload=ocr2-receipt")))
    assert r.model == "deepseek_ocr2" and r.tile_sweep is not None and r.mode_sweep is None
    assert (r.workload.mode, r.workload.tiles, r.workload.image_tokens, r.workload.new_tokens) == (None, 4, 833, 128)
    assert "vision/encoder" in r.stages
    v1 = build_report(command_config(compose_config("analytic", "workload=ocr1-receipt")))
    assert (v1.model, v1.workload.crop_grid, v1.workload.image_tokens) == ("deepseek_ocr", (1, 4), 713)
    tiny = command_config(compose_config("analytic", "model=deepseek_ocr2_tiny", "workload=ocr2-receipt"))
    assert build_report(tiny).model == "deepseek_ocr2_tiny"


@pytest.mark.slow
def test_workload_of_another_model_is_refused_in_one_paragraph(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"workload=ocr2-receipt is written for model=deepseek_ocr2 or "):
        build_report(command_config(compose_config("analytic", "model=deepseek_ocr", "workload=ocr2-receipt")))
    with pytest.raises(UserError, match=r"this command runs model=deepseek_ocr2\. Leave model= out"):
        check_workload_model(command_config(compose_config("stage1", "model=deepseek_ocr2", "workload=ocr1-snippet")))
    out = tmp_path / "an"
    done = run_main("llm_perf_opt.cli.analytic", "model=deepseek_ocr", "workload=ocr2-receipt", f"hydra.run.dir={out}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: workload=ocr2-receipt is written for model=deepseek_ocr2")
    assert (
        "but this command runs model=deepseek_ocr." in error and "workload_profile.models lists deepseek_ocr." in error
    )
    status = json.loads((out / "run_status.json").read_text())
    assert status["state"] == "failed" and status["message"] == error.removeprefix("error: ")
    assert not (out / "static_analysis").exists()


# ---- a Stage 1 run's inputs, priced as they ran --------------------------------------------------------------------
SAMPLES = ("snippet_small.png", "receipt_long.png")  # v1 Gundam: no tiles and 1x4; OCR-2: 0 and 4 tiles


def measured_inputs(cfg: DictConfig, new_tokens: int = 8) -> list[tuple[MeasuredInput, Any]]:
    """The bundled sample pages prepared by the model's adapter, as Stage 1 measures them (tiles, crop grid,
    tokens), with the prepared inputs."""
    adapter = make_adapter(cfg.model)
    out = []
    for name in SAMPLES:
        prepared = adapter.prepare(Image.open(bundled_samples_dir() / name), None)
        measured = MeasuredInput(
            image=name,
            tiles=prepared.tiles,
            image_tokens=prepared.image_tokens,
            prompt_tokens=prepared.prompt_tokens,
            new_tokens=new_tokens,
            crop_grid=prepared.model_inputs.get("crop_grid"),
        )
        out.append((measured, prepared))
    return out


def _model_stub(cfg: DictConfig) -> Any:
    """What the adapters' analytic_costs read of a model: its config (v1 falls back to the architecture)."""
    if "modes" in cfg.model:
        return SimpleNamespace(config=None)
    return SimpleNamespace(config=DeepseekOcr2Config(**plain(cfg.model.architecture)))


@pytest.mark.parametrize("model", ["deepseek_ocr", "deepseek_ocr2"])
def test_run_report_prices_each_input_as_it_ran(model: str) -> None:
    """An fp32 run of two pages with different tiles: each input priced with its own views and tokens, exactly as
    the adapter prices it for Stage 1's bytes and MBU; the tables sum the inputs; the what-if uses fp32 peaks."""
    cfg = compose_config("analytic", f"model={model}")
    measured = measured_inputs(cfg)
    assert [m.tiles for m, _ in measured] == [0, 4]
    r = build_run_report(command_config(cfg), RunWorkload(tuple(m for m, _ in measured), dtype="float32"))
    assert r.run is not None and [i.image for i in r.run.inputs] == list(SAMPLES)
    adapter = make_adapter(cfg.model)
    for (m, prepared), priced in zip(measured, r.run.inputs, strict=True):
        w = priced.workload
        assert (w.tiles, w.image_tokens, w.prompt_tokens, w.new_tokens, w.dtype) == (
            m.tiles,
            m.image_tokens,
            m.prompt_tokens,
            8,
            "float32",
        )
        expected = adapter.analytic_costs(_model_stub(cfg), prepared, 8, 4)
        assert expected is not None and set(priced.stages) == set(expected)
        for stage, cost in expected.items():
            assert (priced.stages[stage].matmul_flops, priced.stages[stage].bytes) == (cost.matmul_flops, cost.bytes)
        assert priced.bounds["decode"].bound == "memory"
    if model == "deepseek_ocr":
        assert [i.workload.crop_grid for i in r.run.inputs] == [(1, 1), (1, 4)]
        assert r.mode_sweep is not None and [t.label for t in r.mode_sweep.rows if t.configured] == ["gundam 1x1"]
    for stage, total in r.stages.items():
        assert total.bytes == pytest.approx(sum(i.stages[stage].bytes for i in r.run.inputs), rel=1e-12)
        assert total.matmul_flops == pytest.approx(sum(i.stages[stage].matmul_flops for i in r.run.inputs), rel=1e-12)
    assert r.workload == r.run.inputs[0].workload  # the page the view sweep starts from
    h100 = next(g for g in r.what_if if g.key == "h100_sxm")
    assert h100.dense_tflops == 67.0  # the fp32 (non-tensor-core) peak, not bf16's 989.4
    md = analytic_report_md(r)
    assert "the 2 inputs this run measured (no weights), float32. The stage" in md and "Inputs of this run" in md
    assert "Priced from the config alone" not in md and all(name in md for name in SAMPLES)


def test_run_report_refuses_a_run_it_cannot_price() -> None:
    cfg = compose_config("analytic", "model=deepseek_ocr")
    receipt = measured_inputs(cfg)[1][0]
    with pytest.raises(ValueError, match="need their crop grid"):
        build_run_report(command_config(cfg), RunWorkload((attrs.evolve(receipt, crop_grid=None),), dtype="bfloat16"))
    with pytest.raises(ValueError, match="the analytic model prices 4 tiles and 713 image tokens, the run measured"):
        off = attrs.evolve(receipt, image_tokens=receipt.image_tokens + 1)
        build_run_report(command_config(cfg), RunWorkload((off,), dtype="bfloat16"))
    with pytest.raises(ValueError, match="no measured inputs"):
        build_run_report(command_config(cfg), RunWorkload((), dtype="bfloat16"))


def _record(image: str, repeat: int, tiles: int) -> ImageRecord:
    return ImageRecord(
        image=image,
        repeat=repeat,
        preprocess_ms=1.0,
        prefill_ms=2.0,
        vision_ms={},
        decode_ms=4.0,
        decode_step_ms=(4.0,),
        new_tokens=2,
        prompt_tokens=300 + tiles,
        image_tokens=280 + tiles,
        tiles=tiles,
        peak_memory_bytes=None,
        crop_grid=(2, 3) if tiles == 6 else None,
    )


def test_run_workload_from_stage1_records() -> None:
    records = [_record("a.png", 0, 6), _record("a.png", 1, 6), _record("b.png", 0, 0)]
    run = RunWorkload.from_records(records, "bfloat16")
    assert run.dtype == "bfloat16"
    assert run.inputs == (
        MeasuredInput(image="a.png", tiles=6, image_tokens=286, prompt_tokens=306, new_tokens=2, crop_grid=(2, 3)),
        MeasuredInput(image="b.png", tiles=0, image_tokens=280, prompt_tokens=300, new_tokens=2),
    )

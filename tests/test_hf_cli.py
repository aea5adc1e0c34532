"""End-to-end `stage1-run model=hf …` on the CPU: the tiny Qwen2 and Llama presets on the bundled prompts, a tiny Llava
checkpoint on an image, their artifacts, bad input, and Stage 2's workload command for model=hf."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image
from transformers import AutoModelForCausalLM

from helpers import rope_table_flops, run_main, stage2_settings
from hf_fixtures import LLAVA_IMAGE_TOKENS, preset_config, save_tiny_llava
from llm_perf_opt.analytic.dense import DenseSpec, decode, prefill
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.pipeline.stage2 import forwarded_overrides, workload_argv

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

FAST = ["device=cpu", "pipeline/torch_profiler=min"]  # min: no gallery or trace


def stage1(*overrides: str) -> subprocess.CompletedProcess[str]:
    """`stage1-run` in this process (its own process is test_stage1_cli's): what a run of model=hf records."""
    return run_main("llm_perf_opt.cli.stage1", *overrides)


def read(out: Path, name: str) -> Any:
    text = (out / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text) if name.endswith(".yaml") else text


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "qwen2"
    done = stage1(
        "model=hf",
        "model.config=qwen2_tiny",
        "device=cpu",
        "run.repeats=2",
        "run.warmup=1",
        "infer.max_new_tokens=3",
        "dataset.max_images=2",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_qwen2_preset_writes_every_artifact_with_the_model_metadata(qwen_run: Path) -> None:
    for name in ("report.md", "metrics.json", "operators.md", "stakeholder_summary.md", "assumptions.md", "env.json",
                 "inputs.yaml", "config.yaml", "predictions/predictions.jsonl", "viz/predictions.md",
                 "plots/stage_breakdown.png", "plots/decode_latency.png"):  # fmt: skip
        assert (qwen_run / name).is_file() and (qwen_run / name).stat().st_size > 0, name
    assert read(qwen_run, "run_status.json")["state"] == "complete"
    assert not (qwen_run / "static_analysis").exists()  # the static analysis report models DeepSeek-OCR only
    model = read(qwen_run, "metrics.json")["model"]
    assert (model["name"], model["adapter"], model["class_name"]) == ("qwen2_tiny", "hf", "Qwen2ForCausalLM")
    assert model["parameters"] == 205_376 and model["weights"] == "random"
    source = model["config_source"]
    assert source.startswith("preset qwen2_tiny (") and source.endswith("model_presets/qwen2_tiny.json)")
    assert "one stand-in token id per word" in model["weights_detail"]
    assert model["architecture"] == {
        "model_type": "qwen2",
        "input": "text",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "vision_stages": {},
    }
    assert model["preprocess"] == {"chat_template": False, "max_prompt_tokens": None}
    assert read(qwen_run, "config.yaml")["model"]["config"] == "qwen2_tiny"


def test_qwen2_stages_flops_and_bytes(qwen_run: Path) -> None:
    m = read(qwen_run, "metrics.json")
    assert m["settings"]["input_kind"] == "text" and "bundled text prompts" in m["settings"]["inputs_note"]
    stage_names = [s["stage"] for s in m["stages"]]
    assert stage_names == ["preprocess", "prefill", "ttft", "decode", "decode/step", "e2e"]
    records = m["records"]
    assert len(records) == 4  # 2 prompts x 2 timed passes
    prompts = {r["image"]: r["prompt_tokens"] for r in records}
    assert list(prompts) == ["question_short.txt", "email_summary.txt"]  # smallest first (the CPU default)
    assert prompts["question_short.txt"] == 22 and prompts["email_summary.txt"] > 150
    assert all(r["image_tokens"] == 0 and r["tiles"] == 0 and r["vision_ms"] == {} for r in records)
    assert all(r["new_tokens"] == 3 and len(r["decode_step_ms"]) == 2 for r in records)
    # counted FLOPs equal the dense analytic model exactly; bytes come from it
    # (plus the rotary table's matmul where the transformers release builds it with one: helpers.rope_table_flops)
    spec = DenseSpec.from_config(preset_config("qwen2_tiny"))
    assert spec is not None
    model = AutoModelForCausalLM.from_config(preset_config("qwen2_tiny"))
    for image, tokens in prompts.items():
        rope_prefill, rope_steps = rope_table_flops(model, tokens), 2 * rope_table_flops(model, 1)
        assert m["flops_per_image"][image]["prefill"] == prefill(spec, tokens, 4).matmul_flops + rope_prefill
        assert m["flops_per_image"][image]["decode"] == decode(spec, tokens, 3, 4).matmul_flops + rope_steps
    assert {r["stage"] for r in m["mfu"]} == {"prefill", "decode"}
    assert all("FlopCounterMode" in r["flops_source"] for r in m["mfu"])
    eff = {e["stage"]: e for e in m["efficiency"]}
    assert set(eff) == {"prefill", "decode"}
    expected = 2 * sum(decode(spec, t, 3, 4).bytes for t in prompts.values())  # 2 passes each
    assert eff["decode"]["bytes"] == pytest.approx(expected, rel=1e-12)
    assert not any("No analytic model" in w for w in m["warnings"])


def test_qwen2_reports_speak_of_prompts_not_vision(qwen_run: Path) -> None:
    report = read(qwen_run, "report.md")
    assert "2 prompt(s) × 2 timed pass(es)" in report and "## Per prompt (medians, ms)" in report
    assert "per prompt (mean over passes" in report
    assert "vision" not in report.lower() and "tiles" not in report
    assert "|prefill|" in report  # labelled without "(vision included)"
    assumptions = read(qwen_run, "assumptions.md")
    assert "NVTX ranges (domain llm_perf_opt): preprocess, prefill, decode, decode/step" in assumptions
    assert "Architecture: model_type qwen2, input text, hidden_size 64" in assumptions
    assert "Inputs chosen automatically: model qwen2_tiny takes text prompts" in assumptions
    inputs = read(qwen_run, "inputs.yaml")
    assert inputs["kind"] == "text" and inputs["count"] == 2 and "dataset=prompts" in inputs["chosen_because"]
    assert inputs["images"][0]["characters"] == 100 and "width" not in inputs["images"][0]
    gallery = read(qwen_run, "viz/predictions.md")
    assert "What is the difference between a process and a thread" in gallery and "22 prompt tokens" in gallery
    assert not list((qwen_run / "viz").glob("*.png"))
    preds = [json.loads(line) for line in read(qwen_run, "predictions/predictions.jsonl").splitlines()]
    assert [len(p["token_ids"]) for p in preds] == [3, 3] and all(p["text"] is None for p in preds)


@pytest.mark.slow
def test_llama_preset_runs_with_mfu_against_a_given_peak(tmp_path: Path) -> None:
    out = tmp_path / "llama"
    done = stage1(
        "model=hf", "model.config=llama_tiny", *FAST, "run.repeats=1", "infer.max_new_tokens=2",
        "hardware.peak_tflops=0.5", "hardware.peak_bandwidth_gbps=20", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    m = read(out, "metrics.json")
    assert (m["model"]["name"], m["model"]["class_name"]) == ("llama_tiny", "LlamaForCausalLM")
    arch = m["model"]["architecture"]
    assert arch["model_type"] == "llama" and arch["num_key_value_heads"] == 1
    assert m["model"]["experts_implementation"] is None
    rec = m["records"][0]
    prefill_mfu = next(r for r in m["mfu"] if r["stage"] == "prefill")
    assert prefill_mfu["peak"]["value"] == 0.5e12
    assert prefill_mfu["mfu"] == pytest.approx(prefill_mfu["flops_total"] / (rec["prefill_ms"] / 1e3) / 0.5e12)
    decode_eff = next(e for e in m["efficiency"] if e["stage"] == "decode")
    assert decode_eff["mbu"] == pytest.approx(decode_eff["bytes"] / (rec["decode_ms"] / 1e3) / 20e9)
    assert decode_eff["bound"] == "memory"


@pytest.mark.slow
def test_tiny_llava_checkpoint_runs_images_with_vision_stages(tmp_path: Path) -> None:
    ckpt = save_tiny_llava(tmp_path / "llava")
    pages = tmp_path / "pages"
    pages.mkdir()
    Image.open(bundled_samples_dir() / "snippet_small.png").save(pages / "snippet.png")
    out = tmp_path / "run"
    done = stage1(
        "model=hf", f"model.name_or_path={ckpt}", *FAST, f"dataset.root={pages}", "run.repeats=1",
        "infer.max_new_tokens=2", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    m = read(out, "metrics.json")
    assert (m["model"]["name"], m["model"]["weights"], m["settings"]["input_kind"]) == ("llava", "checkpoint", "image")
    assert m["model"]["architecture"]["vision_stages"] == {
        "vision/encoder": "model.vision_tower",
        "vision/projector": "model.multi_modal_projector",
    }
    rec = m["records"][0]
    assert rec["image_tokens"] == LLAVA_IMAGE_TOKENS and rec["prompt_tokens"] == 1 + LLAVA_IMAGE_TOKENS + 4
    assert set(rec["vision_ms"]) == {"vision/encoder", "vision/projector"}
    assert {r["stage"] for r in m["mfu"]} == {"prefill", "vision/encoder", "vision/projector", "decode"}
    assert m["efficiency"] == []  # no analytic bytes for a VLM: said so, not guessed
    assert any("No analytic model for LlavaForConditionalGeneration" in w for w in m["warnings"])
    assert "↳ vision/encoder" in read(out, "report.md")


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["model.config=no_such_preset"], ["no_such_preset", "qwen2_tiny"]),
        (["model.name_or_path=Qwen/Qwen2-0.5B"], ["not a local folder"]),
        (["model.config=__MAMBA__"], ["MambaForCausalLM", "recurrent-state model"]),
        ([], ["neither model.name_or_path nor model.config"]),
        (["model.config=qwen2_tiny", f"dataset.root={bundled_samples_dir()}", "dataset.max_images=1"], []),
        (["model.config=qwen2_tiny", "dataset.root=__PAGES__"], ["takes text prompts", "dataset=prompts"]),
    ],
)
@pytest.mark.slow
def test_bad_input_fails_cleanly_before_building(tmp_path: Path, overrides: list[str], needles: list[str]) -> None:
    (tmp_path / "mamba.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 16, "num_hidden_layers": 1}))
    (tmp_path / "pages").mkdir()
    Image.new("RGB", (40, 30), "white").save(tmp_path / "pages" / "p.png")
    overrides = [
        o.replace("__MAMBA__", str(tmp_path / "mamba.json")).replace("__PAGES__", str(tmp_path / "pages"))
        for o in overrides
    ]
    out = tmp_path / "run"
    done = run_main("llm_perf_opt.cli.stage1", "model=hf", *FAST, *overrides, f"hydra.run.dir={out}")
    if not needles:  # the bundled samples named explicitly are the default dataset: replaced, not an error
        assert done.returncode == 0, done.stderr[-3000:]
        assert read(out, "inputs.yaml")["kind"] == "text"
        return
    assert done.returncode == 2, done.stderr[-3000:]
    assert "error:" in done.stderr and "Traceback" not in done.stderr
    for needle in needles:
        assert needle in done.stderr
    status = read(out, "run_status.json")
    assert status["state"] == "failed" and needles[0] in status["message"]
    assert "model ready" not in (out / "stage1.log").read_text()  # nothing was built
    assert not (out / "report.md").exists()


def test_stage2_forwards_the_hf_overrides(tmp_path: Path) -> None:
    task = ["model=hf", "model.config=qwen2_tiny", "model.preprocess.max_prompt_tokens=64", "dataset=prompts",
            "stage2.mode=deep", "hydra.run.dir=/x"]  # fmt: skip
    user = forwarded_overrides(task)
    assert user == task[:4]
    cfg = compose_config("stage2", *task[:5])
    assert cfg.model.name == "qwen2_tiny" and cfg.dataset.kind == "text"
    argv = workload_argv(stage2_settings(cfg), user, tmp_path, name="nsys")
    assert argv[:3] == [sys.executable, "-m", "llm_perf_opt.cli.stage1"]
    assert argv[3:7] == user and "pipeline.torch_profiler.enable=false" in argv
    ncu = workload_argv(stage2_settings(cfg), user, tmp_path, name="ncu-decode", ncu=True)
    assert "dataset.max_images=1" in ncu and "infer.max_new_tokens=4" in ncu


@pytest.mark.slow
def test_analytic_report_refuses_model_hf(tmp_path: Path) -> None:
    out = tmp_path / "analytic"
    done = run_main("llm_perf_opt.cli.analytic", "model=hf", "model.config=qwen2_tiny", f"hydra.run.dir={out}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "analytic-report has no static model of qwen2_tiny" in done.stderr and "stage1-run" in done.stderr
    assert read(out, "run_status.json")["state"] == "failed"

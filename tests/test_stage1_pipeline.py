"""Stage 1 in-process: settings, run ids, Ctrl-C, and the packaging of configs and entry points."""

from __future__ import annotations

import json
import re
import tomllib
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from llm_perf_opt.config_compose import compose_config, new_run_id
from llm_perf_opt.config_data import command_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline.stage1 import Stage1Run, resolve_settings
from llm_perf_opt.session.session import InferenceSession

ROOT = Path(__file__).resolve().parents[1]


def compose_stage1(*overrides: str) -> DictConfig:
    return compose_config("stage1", *overrides)


def test_device_defaults_fill_only_unset_keys() -> None:
    cfg = compose_stage1("run.repeats=7")
    cpu = resolve_settings(command_config(cfg), torch.device("cpu"))
    assert (cpu.repeats, cpu.warmup, cpu.max_new_tokens, cpu.max_images, cpu.sampling) == (7, 0, 8, 1, "smallest")
    assert cpu.sources["run.repeats"] == "config/override"
    assert cpu.sources["run.warmup"] == "device default (cpu)"
    gpu = resolve_settings(command_config(cfg), torch.device("cuda", 0))
    assert (gpu.repeats, gpu.warmup, gpu.max_new_tokens, gpu.max_images, gpu.sampling) == (7, 1, 32, None, "sorted")
    assert gpu.timed_seconds is None  # run.repeats set: exactly that many timed passes


def test_max_images_all_means_every_image_on_every_device() -> None:
    cfg = compose_stage1("dataset.max_images=all")
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        settings = resolve_settings(command_config(cfg), device)
        assert settings.max_images is None
        assert settings.sources["dataset.max_images"] == "config/override"
    default = compose_stage1()
    assert resolve_settings(command_config(default), torch.device("cpu")).max_images == 1  # null: CPU default


@pytest.mark.parametrize(
    "override",
    [
        "run.repeats=0",
        "run.warmup=-1",
        "infer.max_new_tokens=0",
        "dataset.max_images=alll",
        "dataset.max_images=0",
    ],
)
def test_invalid_settings_raise_user_errors(override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        cfg = compose_stage1(override)
        resolve_settings(command_config(cfg), torch.device("cpu"))


def test_run_ids_never_repeat_within_a_process() -> None:
    ids = [new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", i) for i in ids)


def test_default_run_dir_is_under_tmp_stage1() -> None:
    cfg = compose_config("stage1", return_hydra_config=True)
    assert str(cfg.hydra.run.dir).startswith("tmp/stage1/")


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_stage1(
        "model=deepseek_ocr2_tiny",
        "device=cpu",
        "run.repeats=3",
        "infer.max_new_tokens=2",
        "pipeline/torch_profiler=min",
    )
    real = InferenceSession.run_image
    calls = {"n": 0}

    def interrupted_on_second(self: InferenceSession, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(InferenceSession, "run_image", interrupted_on_second)
    run = Stage1Run(command_config(cfg), tmp_path / "run", run_id="ctrl-c")
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    status = json.loads((tmp_path / "run" / "run_status.json").read_text())
    assert status["state"] == "interrupted"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["settings"]["partial"] is True
    assert len(metrics["records"]) == 1
    assert (metrics["settings"]["measured_passes"], metrics["settings"]["asked_passes"]) == (1, 3)
    assert "did not finish" in (tmp_path / "run" / "report.md").read_text()


def test_a_folder_holding_a_run_is_not_reused(tmp_path: Path) -> None:
    cfg = compose_stage1("model=deepseek_ocr2_tiny", "device=cpu", "dataset.root=/nonexistent")
    with pytest.raises(UserError):
        Stage1Run(command_config(cfg), tmp_path / "run", run_id="first").execute()
    with pytest.raises(UserError, match="already holds a failed run"):
        Stage1Run(command_config(cfg), tmp_path / "run", run_id="second").execute()


def test_configs_ship_inside_the_package() -> None:
    conf = files("llm_perf_opt") / "conf"
    for name in (
        "stage1.yaml",
        "model/deepseek_ocr2.yaml",
        "model/deepseek_ocr2_tiny.yaml",
        "dataset/samples.yaml",
        "pipeline/torch_profiler/default.yaml",
        "pipeline/torch_profiler/min.yaml",
        "pipeline/torch_profiler/max.yaml",
        "pipeline/memory/default.yaml",
    ):
        assert (conf / name).is_file(), name


def test_pixi_tasks_name_real_entry_points() -> None:
    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = manifest["project"]["scripts"]
    tasks = manifest["tool"]["pixi"]["tasks"]
    assert {"stage1-run", "test"} <= set(tasks)
    installed = {ep.name: ep for ep in entry_points(group="console_scripts")}
    for task, command in tasks.items():
        program = command.split()[0]
        if program in scripts:
            assert program in installed, f"{program} is not installed as a console script"
            assert callable(installed[program].load())
        else:
            assert program in {"pytest", "ruff"}, f"pixi task {task} runs unknown program {program}"
    assert manifest["tool"]["pixi"]["pypi-dependencies"]["llm-perf-opt"]["path"] == "."


def test_pixi_python_range_matches_requires_python() -> None:
    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert manifest["tool"]["pixi"]["dependencies"]["python"] == manifest["project"]["requires-python"]

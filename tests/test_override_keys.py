"""An unknown override key: one paragraph naming the nearest valid key (never Hydra's hint to add `+`), exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_cli
from llm_perf_opt.errors import UserError
from llm_perf_opt.override_keys import check_override_keys

EXTRA = "pipeline.torch_profiler.output.extra.deepseek_ocr"


def check(*argv: str, config: str = "stage1", command: str = "stage1-run") -> None:
    check_override_keys(config, list(argv), command=command)


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("run.repets=3", "run.repeats=3"),
        ("repeats=3", "run.repeats=3"),
        ("model.preprocess.max_tile=2", "model.preprocess.max_tiles=2"),
        ("modle=hf", "model=hf"),
        ("hydra.run.dri=/tmp/x", "hydra.run.dir=/tmp/x"),
        (f"{EXTRA}.visualization.max_image=3", f"{EXTRA}.visualization.max_images=3"),
    ],
)
def test_a_typo_names_the_nearest_key(typo: str, suggestion: str) -> None:
    with pytest.raises(UserError) as raised:
        check("device=cpu", typo)
    message = str(raised.value)
    key = typo.split("=")[0]
    assert message.startswith(f"{key} is not a setting of stage1-run. Use ")
    assert f"{suggestion} (the nearest setting to {key})" in message
    assert "+" not in message


def test_several_typos_are_named_together() -> None:
    with pytest.raises(UserError, match=r"run\.repets and infer\.max_new_tokns are not settings of stage1-run"):
        check("run.repets=3", "infer.max_new_tokns=4")


def test_a_key_with_nothing_close_asks_for_the_spelling() -> None:
    with pytest.raises(UserError, match="Check the spelling of xyzzy; `stage1-run --cfg job` lists every setting"):
        check("xyzzy=1")


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("model=hf", "model.config=qwen2_tiny", "run.repeats=2", "hydra.run.dir=/tmp/x"),
        ("-m", "model.mode=tiny,base", "infer.max_new_tokens=2,4"),
        ("-m", "model=hf", "model.config=qwen2_tiny,llama_tiny"),
        ("+my.note=1", "pipeline/torch_profiler=min", "dataset.max_images=all"),
        ("outputs.save_predictions=false", f"{EXTRA}.visualization.max_images=3"),
        ("--help",),
    ],
)
def test_valid_command_lines_pass(argv: tuple[str, ...]) -> None:
    check(*argv)


def test_every_job_of_a_sweep_over_config_groups_is_checked() -> None:
    with pytest.raises(UserError, match=r"model\.config is not a setting of stage1-run with model=deepseek_ocr_tiny"):
        check("-m", "model=hf,deepseek_ocr_tiny", "model.config=qwen2_tiny")


def test_stage2_and_analytic_keys() -> None:
    check("stage2.mode=deep", config="stage2", command="stage2-profile")
    with pytest.raises(UserError, match=r"stage2\.mod is not a setting of stage2-profile\. Use stage2\.mode=deep"):
        check("stage2.mod=deep", config="stage2", command="stage2-profile")
    with pytest.raises(UserError, match=r"Use analytic\.new_tokens=8 "):
        check("analytic.new_token=8", config="analytic", command="analytic-report")


@pytest.mark.parametrize(
    ("module", "command"),
    [
        ("llm_perf_opt.cli.stage1", "stage1-run"),
        ("llm_perf_opt.cli.stage2", "stage2-profile"),
        ("llm_perf_opt.cli.analytic", "analytic-report"),
    ],
)
def test_the_commands_end_with_one_paragraph_and_exit_2(module: str, command: str, tmp_path: Path) -> None:
    done = run_cli(module, "model.dtyp=float16", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"error: model.dtyp is not a setting of {command}. Use model.dtype=float16 (the nearest setting to "
        f"model.dtyp); `{command} --cfg job` lists every setting."
    )
    assert not (tmp_path / "run").exists()

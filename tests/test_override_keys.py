"""An unknown override key: one paragraph naming the nearest valid key (never Hydra's hint to add `+`), exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import preset_dir, run_cli, run_main
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


# ---- `+` adding a key inside a section: the same paragraph (it would be read by nothing) ------------------------
@pytest.mark.parametrize(
    ("added", "suggestion"),
    [
        ("+run.repeatz=3", "run.repeats=3"),
        ("++run.repeatz=3", "run.repeats=3"),
        ("+modle.dtype=float16", "model.dtype=float16"),  # a top-level name close to a section's
        ("+model.preprocess.max_tile=2", "model.preprocess.max_tiles=2"),
    ],
)
def test_a_plus_inside_a_section_names_the_nearest_key(added: str, suggestion: str) -> None:
    key = added.lstrip("+").split("=")[0]
    with pytest.raises(UserError) as raised:
        check("model=deepseek_ocr_tiny", added)
    assert str(raised.value) == (
        f"{key} is not a setting of stage1-run with model=deepseek_ocr_tiny. Use {suggestion} (the nearest setting "
        f"to {key}); a leading + only adds a key that stage1-run never reads; `stage1-run --cfg job` lists every "
        "setting."
    )


@pytest.mark.parametrize("argv", [("+note=x",), ("++run.repeats=3",), ("+hydra.job.env_set.FOO=1",)])
def test_a_plus_outside_the_settings_or_on_an_existing_key_passes(argv: tuple[str, ...]) -> None:
    check(*argv)


def test_a_plus_may_add_a_what_if_lever_but_nothing_else_of_perf_whatif() -> None:
    check('+whatif.levers.mine={overrides: ["run.warmup=0"]}', config="whatif", command="perf-whatif")
    with pytest.raises(UserError, match=r"^whatif\.objectiv is not a setting of perf-whatif\. Use whatif\.objective="):
        check("+whatif.objectiv=pages_per_s", config="whatif", command="perf-whatif")


def test_the_nearest_key_is_never_the_section_holding_the_typo() -> None:
    with pytest.raises(UserError, match=r"^run\.x is not a setting of stage1-run\. Check the spelling of run\.x;"):
        check("run.x=1")  # not "use run=1"


# ---- a config-group option that does not exist: the group's options, the nearest one ----------------------------
def test_an_unknown_group_option_lists_the_options() -> None:
    with pytest.raises(UserError) as raised:
        check("model=nonexistent_model")
    assert str(raised.value) == (
        "model=nonexistent_model names no model config of stage1-run (the options: deepseek_ocr, deepseek_ocr2, "
        "deepseek_ocr2_tiny, deepseek_ocr_tiny, hf). Pick one of them; a config of your own goes in "
        "<dir>/model/<name>.yaml, used with --config-dir <dir>."
    )


def test_a_typed_groups_options_leave_out_its_schema() -> None:
    """The schema every pipeline/torch_profiler option builds on is registered in the group, but it is no option."""
    with pytest.raises(UserError) as raised:
        check("pipeline/torch_profiler=mid")
    assert "(the options: default, max, min)" in str(raised.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("pipeline/torch_profiler=maxx",), "Use pipeline/torch_profiler=max (the nearest option to maxx)"),
        (("-m", "model=hf,deepseek_ocr_tinyy"), "Use model=deepseek_ocr_tiny (the nearest option to"),
        (("workload=ocr1-a4-pag",), "Use workload=ocr1-a4-page (the nearest option to ocr1-a4-pag)"),
        (("hydra/launcher=jobllib",), "(the options: basic). Pick one of them; other options come with Hydra plugins"),
    ],
)
def test_a_mistyped_group_option_names_the_nearest(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        check(*argv)


def test_a_config_dir_is_searched_for_options_and_keys(tmp_path: Path) -> None:
    config_dir = preset_dir(tmp_path, "mine", "name: mine\nobjective: decode_ms_per_token\nlevers: {}\n")
    own = ("--config-dir", str(config_dir))
    check(*own, "whatif=mine", config="whatif", command="perf-whatif")
    options = r"\(the options: advised, all, batch, decode, mine, quantize, throughput, tuning, vision\)\. "
    options += "Use whatif=mine "
    with pytest.raises(UserError, match=options):
        check(*own, "whatif=mien", config="whatif", command="perf-whatif")
    with pytest.raises(UserError, match=r"run\.repetz is not a setting of perf-whatif with whatif=mine"):
        check(*own, "whatif=mine", "run.repetz=3", config="whatif", command="perf-whatif")


# ---- every entry point: one paragraph, exit 2, no run folder -----------------------------------------------------
# The workload a command would run if the override were let through: the tiny model, briefly.
TINY = ("model=deepseek_ocr_tiny", "infer.max_new_tokens=2", "pipeline.torch_profiler.enable=false")


@pytest.mark.parametrize(
    ("module", "command", "argv", "message"),
    [
        ("stage1", "stage1-run", (*TINY, "+run.repeatz=3"), "run.repeatz is not a setting of stage1-run with"),
        ("whatif", "perf-whatif", (*TINY, "+run.repeatz=3"), "run.repeatz is not a setting of perf-whatif with"),
        ("analytic", "analytic-report", ("+analytic.new_tokenz=8",), "analytic.new_tokenz is not a setting of"),
        ("stage1", "stage1-run", ("model=nonexistent_model",), "model=nonexistent_model names no model config of"),
        ("stage2", "stage2-profile", ("model=nonexistent_model",), "model=nonexistent_model names no model config"),
        ("analytic", "analytic-report", ("model=nonexistent_model",), "model=nonexistent_model names no model"),
        ("whatif", "perf-whatif", ("model=nonexistent_model",), "model=nonexistent_model names no model config"),
        ("whatif", "perf-whatif", ("whatif=nosuch",), "whatif=nosuch names no whatif config of perf-whatif (the"),
    ],
)
def test_every_command_refuses_before_anything_runs(
    module: str, command: str, argv: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    # In this process, not a child importing torch per case: a real process's exit 2 is checked above (stage1-run,
    # stage2-profile, analytic-report) and in test_whatif_cli (perf-whatif).
    done = run_main(f"llm_perf_opt.cli.{module}", *argv, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"\nerror: {message}") and done.stderr.count("\n") == 2  # one paragraph
    assert command in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder is made

"""Every command's `--help`: it names the command, lists its own config groups (with the choices the conf folders
hold) and no other command's, points at `--cfg job` and its guide, stays short, and imports no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import pytest

from llm_perf_opt.cli import help_text
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.override_keys import check_override_keys

ROOT = Path(__file__).resolve().parents[1]
CONF = Path(str(files("llm_perf_opt") / "conf"))
MODULES = {
    "stage1-run": "stage1",
    "stage2-profile": "stage2",
    "perf-whatif": "whatif",
    "analytic-report": "analytic",
    "stage1-report": "stage1_report",
    "stage2-report": "stage2_report",
    "perf-compare": "compare",
}
HYDRA_COMMANDS = ["stage1-run", "stage2-profile", "perf-whatif", "analytic-report"]
ARGPARSE_COMMANDS = ["stage1-report", "stage2-report", "perf-compare"]
# The groups each Hydra command offers a choice of, and groups of the shared conf folder it must not list.
OWN_GROUPS = {
    "stage1-run": {"model", "dataset", "pipeline/torch_profiler", "workload"},
    "stage2-profile": {"model", "dataset", "pipeline/torch_profiler", "workload"},
    "perf-whatif": {"model", "dataset", "pipeline/torch_profiler", "workload", "whatif"},
    "analytic-report": {"model", "workload"},
}
ALL_GROUPS = {"model", "dataset", "pipeline/torch_profiler", "workload", "whatif"}


def _help(command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """`<command> --help` run in this process, as its console script runs it."""
    main: Callable[..., None] = importlib.import_module(f"llm_perf_opt.cli.{MODULES[command]}").main
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code in (0, None)
    return capsys.readouterr().out


def _choices(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("command", HYDRA_COMMANDS)
def test_a_hydra_commands_help_names_it_and_its_own_groups(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(command, capsys, monkeypatch)
    lines = text.rstrip().splitlines()
    assert lines[0].startswith(f"{command}: ")
    assert "powered by Hydra" not in text
    assert len(lines) < 40
    start = next(i for i, line in enumerate(lines) if line.startswith("Config groups")) + 1
    rows = dict(line.strip().split("=", 1) for line in lines[start : lines.index("", start)])
    assert set(rows) == OWN_GROUPS[command]
    for group in ALL_GROUPS - OWN_GROUPS[command]:
        assert f"{group}=" not in text
    assert rows["model"] == "|".join(f"{name}*" if name == "deepseek_ocr" else name for name in _choices("model"))
    assert rows["workload"] == "|".join(["null*", *_choices("workload")])
    assert f"{command} --cfg job" in text
    assert f"{command} --cfg job --package {help_text.COMMANDS[command].section}" in text
    assert f"{command} --hydra-help" in text
    assert help_text.guide_path(command) in text


@pytest.mark.parametrize("command", ARGPARSE_COMMANDS)
def test_an_argparse_commands_help_names_it_and_its_guide(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(command, capsys, monkeypatch)
    assert text.startswith(f"usage: {command} ")
    assert f"  {command} " in text  # its examples
    assert help_text.guide_path(command) in text
    assert len(text.splitlines()) < 40


@pytest.mark.parametrize("command", help_text.COMMANDS)
def test_every_guide_named_exists(command: str) -> None:
    assert (ROOT / help_text.guide_path(command)).is_file()


@pytest.mark.parametrize("command", HYDRA_COMMANDS)
def test_the_help_shows_settings_that_exist(command: str) -> None:
    about = help_text.COMMANDS[command]
    assert about.config_name is not None
    config = compose_config(about.config_name, return_hydra_config=True)
    assert config.hydra.help.app_name == command
    assert about.section in config
    for arguments, _ in about.examples:  # each one alone: model.mode=base is a setting of v1 only
        if not arguments.startswith("--config-dir"):  # that one needs the user's folder
            check_override_keys(about.config_name, arguments.split(), command=command)


def test_config_groups_follow_the_defaults_list(tmp_path: Path) -> None:
    for folder, names in {"model": ["a", "b"], "pipeline/prof": ["min", "max"], "extra": ["x", "y"]}.items():
        (tmp_path / folder).mkdir(parents=True)
        for name in names:
            (tmp_path / folder / f"{name}.yaml").write_text("{}\n")
    (tmp_path / "base.yaml").write_text("defaults:\n  - model: a\n  - pipeline/prof@prof: min\n  - _self_\n")
    (tmp_path / "top.yaml").write_text(
        "defaults:\n  - base\n  - override hydra/launcher: basic\n  - extra: null\n  - _self_\n"
    )
    groups = help_text.config_groups("top", tmp_path)
    assert groups == [
        help_text.ConfigGroup("model", "a", ("a", "b")),
        help_text.ConfigGroup("pipeline/prof", "min", ("max", "min")),
        help_text.ConfigGroup("extra", None, ("x", "y")),
    ]


def test_help_imports_no_torch() -> None:
    """Every command's `--help` in one child process; torch and transformers stay unimported."""
    script = "\n".join(
        [
            "import contextlib, importlib, io, sys",
            f"for command, module in {MODULES!r}.items():",
            "    sys.argv = [command, '--help']",
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):",
            "        importlib.import_module(f'llm_perf_opt.cli.{module}').main()",
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr

"""Every setting typed before work starts (settings_schema): a bad value is one paragraph and exit 2 from the
console script itself, before Hydra makes a folder or anything is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_perf_opt.cli import stage1 as stage1_cli
from llm_perf_opt.cli import whatif as whatif_cli
from llm_perf_opt.compile_options import compile_options
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.settings_schema import check_config

TINY = "model=deepseek_ocr_tiny"


def refused(main: object, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The console script's one paragraph for `argv` (its exit code must be 2)."""
    monkeypatch.setattr("sys.argv", ["cmd", *argv])
    with pytest.raises(SystemExit) as stop:
        main()  # type: ignore[operator]
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.split())


@pytest.fixture
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("pipeline.torch_profiler.enable=off", "pipeline.torch_profiler.enable=off is not true or false"),  # D10
        ("run.fill_batches=no", "run.fill_batches=no is not true or false"),
        ("run.batch_size=abc", "run.batch_size=abc is not a whole number"),  # typed int: refused before composing
        ("runtime.kv_cache=foo", "runtime.kv_cache=foo is not a known value"),
        ("run.nonexistent=1", "run.nonexistent is not a setting of stage1-run"),
        ("pipeline.energy.enable=maybe", "pipeline.energy.enable=maybe is not true or false"),
        ("infer.max_new_tokens=9223372036854775807", "infer.max_new_tokens=9223372036854775807 is out of range"),  # D6
        ("infer.max_new_tokens=9000", "more than the model takes"),
        ("pipeline.torch_profiler.output.prediction.save_dir=../shared_pred", "leaves the run folder"),  # D9
        ("+runtime.compile_options.coordinate_descent_tuning=banana", "is not true or false"),  # D5
        ("run.repeats=[1", "the override 'run.repeats=[1' cannot be parsed"),  # D15
        ("run.repeats", "the override 'run.repeats' cannot be parsed"),
        ("device=gpu", "device=gpu is not a device name. Use device=auto, cpu, cuda or cuda:N"),
        ("device=cuda:x", "device=cuda:x is not a device name"),
    ],
)
def test_stage1_refuses_a_bad_value_before_anything_starts(
    override: str, says: str, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=default"]
    argv = [TINY, f"hydra.run.dir={out}", *(extra if "compile_options" in override else []), override]
    assert says in refused(stage1_cli.main, argv, monkeypatch, capsys)
    assert not out.exists()  # refused before Hydra made the folder


def test_a_too_long_folder_name_is_refused_before_hydra(  # D8
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = refused(stage1_cli.main, [TINY, f"hydra.run.dir={out}/{'n' * 300}"], monkeypatch, capsys)
    assert "300 bytes long" in message and "hydra.run.dir" in message


def test_nested_inductor_options_are_options() -> None:  # D18
    assert compile_options({"cpp": {"simdlen": 4}}) == (("cpp.simdlen", 4),)
    with pytest.raises(UserError, match=r"cpp\.nosuch is not an option"):
        compile_options({"cpp": {"nosuch": 4}})


@pytest.fixture
def one_lever(tmp_path: Path) -> Path:
    """A config dir with the what-if preset `one`: a single lever, static_cache."""
    (tmp_path / "whatif").mkdir()
    (tmp_path / "whatif" / "one.yaml").write_text("levers:\n  static_cache: {overrides: [runtime.kv_cache=static]}\n")
    return tmp_path


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("whatif_run.rung_timeout_s=0", "whatif_run.rung_timeout_s=0 is out of range"),  # D12
        ("whatif_run.rung_timeout_s=-5", "whatif_run.rung_timeout_s=-5 is out of range"),
        ("whatif_run.devices=[banana]", "whatif_run.devices holds banana, which is not a device"),
        ("whatif_run.exclude=static_cache", "whatif_run.exclude=static_cache is not a list"),  # D14
        ("whatif_run.exclude=[static_cache]", "whatif_run.exclude leaves no lever"),  # D20
    ],
)
def test_perf_whatif_refuses_its_own_bad_settings_before_a_rung(
    override: str,
    says: str,
    one_lever: Path,
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--config-dir", str(one_lever), "whatif=one", TINY, f"hydra.run.dir={out}", override]
    assert says in refused(whatif_cli.main, argv, monkeypatch, capsys)
    assert not out.exists()


def test_an_unknown_hydra_launcher_is_refused_before_a_rung(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # D12
    argv = [
        TINY,
        f"hydra.run.dir={out}",
        "whatif_run.launcher=hydra",
        'whatif_run.hydra_launcher=["hydra/launcher=nosuch"]',
    ]
    assert "hydra/launcher=nosuch names no hydra/launcher config" in refused(whatif_cli.main, argv, monkeypatch, capsys)


def test_an_inductor_cache_that_is_a_file_is_refused(tmp_path: Path) -> None:  # D13
    file = tmp_path / "cache"
    file.write_text("")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_config(compose_config("whatif", f"whatif_run.inductor_cache={file}"))


def test_a_config_transformers_cannot_build_is_one_paragraph(  # D7
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "model_type": "qwen2",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "banana",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    argv = ["model=hf", f"model.config={path}", f"hydra.run.dir={out}", "pipeline.torch_profiler.enable=false"]
    assert "transformers cannot build a model from" in refused(stage1_cli.main, argv, monkeypatch, capsys)
    assert '"state": "failed"' in (out / "run_status.json").read_text()


def test_every_shipped_setting_is_typed_and_the_defaults_pass() -> None:
    for name in ("stage1", "stage2", "analytic", "whatif"):
        check_config(compose_config(name, return_hydra_config=True))

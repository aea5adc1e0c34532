"""A bug that reaches the top of any command (an exception that is neither bad input nor the environment's) ends it
like bad input does — one paragraph on stderr, the run folder marked failed with the reason — but with exit code 1,
its traceback in a file the paragraph names (`<run folder>/error.log`, or a new file in the temporary folder)."""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llm_perf_opt import interrupts
from llm_perf_opt.cli import analytic, compare, stage1, stage1_report, stage2, stage2_report, whatif
from llm_perf_opt.cli.bug_report import TRACEBACK_ENV
from llm_perf_opt.records.folders import read_status

TINY = "model=deepseek_ocr_tiny"
FIXTURES = Path(__file__).parent / "fixtures"
BUG = "RuntimeError: a bug planted by the test"


def _raise(*args: object, **kwargs: object) -> None:
    raise RuntimeError("a bug planted by the test")


@pytest.fixture
def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The commands run in this process: no signal handlers of theirs left in pytest, nor the logging Hydra sets up
    (its console handler writes to this test's captured stderr), new files of the temporary folder under
    `tmp_path`/tmp, the working folder `tmp_path`."""
    monkeypatch.setattr(interrupts, "install", lambda: None)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in ("hydra", "llm_perf_opt"))]
    before = [(logger, logger.handlers[:], logger.level) for logger in loggers]
    yield tmp_path
    for logger, handlers, level in before:
        for handler in set(logger.handlers) - set(handlers):
            handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)


def _ends_as_a_bug(command: Callable[[], None], capsys: pytest.CaptureFixture[str]) -> tuple[str, Path]:
    """The paragraph `command` ended with (exit code 1, no traceback on stderr) and the file it names."""
    with pytest.raises(SystemExit) as ended:
        command()
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    paragraph = err.strip().splitlines()[-1]
    assert paragraph.startswith(f"error: unexpected {BUG} (in _raise, test_bugs.py:")
    assert "This is a bug in llm-perf-opt or in a library it uses, not a problem with your input" in paragraph
    assert f"set {TRACEBACK_ENV}=1 to print it here too" in paragraph and "issue tracker" in paragraph
    log = Path(paragraph.split("the full traceback is in ", 1)[1].split(" (set ", 1)[0])
    text = log.read_text()
    assert text.startswith("command: ") and "llm-perf-opt 0." in text  # what a report of it needs
    assert "Traceback (most recent call last)" in text and BUG in text
    return paragraph, log


def _hydra_command(main: Callable[[], None], monkeypatch: pytest.MonkeyPatch, *argv: str) -> Callable[[], None]:
    def command() -> None:
        monkeypatch.setattr(sys, "argv", ["cmd", *argv])
        main()

    return command


@pytest.mark.parametrize(
    ("name", "main", "planted", "argv"),
    [
        ("stage1-run", stage1.main, "llm_perf_opt.pipeline.stage1.Stage1Run._measure", ()),
        ("stage2-profile", stage2.main, "llm_perf_opt.pipeline.stage2.Stage2Run._capture", ()),
        ("perf-whatif", whatif.main, "llm_perf_opt.pipeline.whatif.WhatIfRun._run", ("whatif_run.fork_rungs=false",)),
        ("analytic-report", analytic.main, "llm_perf_opt.pipeline.analytic.write_analytic_report", ()),
    ],
)
def test_a_bug_in_a_run_is_one_paragraph_exit_1_and_a_failed_folder(
    name: str,
    main: Callable[[], None],
    planted: str,
    argv: tuple[str, ...],
    quiet: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: the exception's traceback on stderr, exit 1, and (Hydra's) 'Error executing job'."""
    monkeypatch.setattr(planted, _raise)
    run_dir = quiet / "run dir"
    command = _hydra_command(main, monkeypatch, TINY, f"hydra.run.dir={run_dir}", *argv)
    _, log = _ends_as_a_bug(command, capsys)
    assert log == (run_dir / "error.log").resolve()
    status = read_status(run_dir)
    assert status.state == "failed"
    assert status.message is not None and status.message.startswith(f"a bug: {BUG} (in _raise, test_bugs.py:")
    assert status.message.endswith(f"; traceback in {log}")  # also where the pipeline had marked it failed itself


@pytest.mark.parametrize(
    ("main", "planted", "folder"),
    [
        (stage1_report.main, "llm_perf_opt.pipeline.stage1_render.render", FIXTURES / "runs" / "cpu_tiny_v1_stage1"),
        (stage2_report.main, "llm_perf_opt.pipeline.stage2.render", FIXTURES / "compare" / "s2_light"),
        (compare.main, "llm_perf_opt.cli.compare.write_comparison", None),
    ],
)
def test_a_bug_in_a_command_without_a_run_folder_writes_its_traceback_to_the_temporary_folder(
    main: Callable[[list[str]], None],
    planted: str,
    folder: Path | None,
    quiet: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(planted, _raise)
    if folder is None:
        argv = [str(FIXTURES / "compare" / "h100_s1final"), str(FIXTURES / "compare" / "h100_s1sol")]
    else:
        argv = [str(shutil.copytree(folder, quiet / "copy"))]
    _, log = _ends_as_a_bug(lambda: main(argv), capsys)
    assert log.parent == quiet / "tmp" and log.name.startswith("llm-perf-opt-error-")


def test_the_traceback_on_stderr_on_request(
    quiet: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("llm_perf_opt.cli.compare.write_comparison", _raise)
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(SystemExit) as ended:
        compare.main([str(FIXTURES / "compare" / "h100_s1final"), str(FIXTURES / "compare" / "h100_s1sol")])
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith("error: unexpected")

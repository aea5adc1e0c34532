"""Run folders that never lie: write failures end with one paragraph and a folder marked failed, an unwritable
output folder is refused before anything is written, and a folder holding a run is left exactly as it was."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import run_main
from llm_perf_opt import artifacts
from llm_perf_opt.artifacts import ArtifactsManager, OutputWriteError, mark_failed, read_status
from llm_perf_opt.cli.common import run_guarded
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records import io as records_io
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.report import stage1_reports

TINY_RUN = (
    "model=deepseek_ocr2_tiny",
    "device=cpu",
    "run.repeats=1",
    "infer.max_new_tokens=2",
    "pipeline/torch_profiler=min",
    "dataset.max_images=1",
)


def _status(folder: Path) -> dict[str, Any]:
    return json.loads((folder / artifacts.STATUS_FILE).read_text())


def _disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device", "plots/stage_breakdown.png")


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["report writer", "artifacts writer"])
def test_write_failure_while_finishing_marks_the_folder_failed(
    failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The writer fails in the final write and again in the partial write that follows it."""
    run_dir = tmp_path / "run"
    if failing == "report writer":
        monkeypatch.setattr(stage1_reports, "write_details", _disk_full)
    else:
        real = artifacts._atomic_write

        def refuse_metrics(target: Path, text: str) -> None:
            if target.name == "metrics.json":
                raise OutputWriteError(target, OSError(errno.EACCES, "Permission denied"))
            real(target, text)

        monkeypatch.setattr(artifacts, "_atomic_write", refuse_metrics)
    cfg = compose_config("stage1", *TINY_RUN)
    run = Stage1Run(command_config(cfg), run_dir, run_id="disk-full")
    with pytest.raises(SystemExit) as ended:
        run_guarded(run.execute, run_dir=run_dir)
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: could not write ") and "\n" not in err
    assert "Traceback" not in err
    reason = "No space left on device" if failing == "report writer" else "Permission denied"
    assert reason in err
    status = _status(run_dir)
    assert status["state"] == "failed"
    assert reason in status["message"]


def test_status_is_rewritten_in_place_when_the_disk_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    art = ArtifactsManager(tmp_path / "run", stage="stage1")
    art.start("full")

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records_io.tempfile, "mkstemp", no_space)  # every new file fails; the status file exists
    with pytest.raises(OutputWriteError, match="No space left on device"):
        art.write_text("report.md", "# report\n")
    art.finish(artifacts.FAILED, "disk full")
    assert read_status(tmp_path / "run").state == "failed"
    assert read_status(tmp_path / "run").message == "disk full"


def test_an_unexpected_error_still_marks_a_running_folder_failed(tmp_path: Path) -> None:
    art = ArtifactsManager(tmp_path, stage="stage1")
    art.start("bug")

    def bug() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(SystemExit) as ended:
        run_guarded(bug, run_dir=tmp_path)
    assert ended.value.code == 1  # one paragraph (tests/test_bugs.py), the traceback in error.log
    assert read_status(tmp_path).state == "failed"
    message = read_status(tmp_path).message
    assert message is not None and message.startswith("a bug: RuntimeError: a bug (in bug, test_run_folders.py:")
    assert message.endswith(f"; traceback in {(tmp_path / 'error.log').resolve()}")


def test_mark_failed_leaves_final_and_missing_states_alone(tmp_path: Path) -> None:
    assert mark_failed(tmp_path, "why") is False  # no status file
    art = ArtifactsManager(tmp_path, stage="stage1")
    art.start("x")
    art.finish(artifacts.COMPLETE)
    assert mark_failed(tmp_path, "why") is False
    assert read_status(tmp_path).state == "complete"


def test_a_rung_past_its_limit_that_recorded_the_stop_as_interrupted_is_marked_failed(tmp_path: Path) -> None:
    """The Hydra phase's time limit stops its rungs with SIGTERM; a rung that records the stop itself reads
    `interrupted`, yet it ran past its limit: the what-if marks it failed (only where asked to replace that state)."""
    from llm_perf_opt.pipeline.whatif_rungs import PAST_LIMIT_MARKED

    art = ArtifactsManager(tmp_path, stage="stage1")
    art.start("x")
    art.finish(artifacts.INTERRUPTED)
    assert mark_failed(tmp_path, "past its limit") is False  # by default only a folder still running
    assert read_status(tmp_path).state == "interrupted"
    assert mark_failed(tmp_path, "past its limit", replacing=PAST_LIMIT_MARKED) is True
    assert read_status(tmp_path).state == "failed" and read_status(tmp_path).message == "past its limit"


def test_read_status_names_a_damaged_file(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="does not exist"):
        read_status(tmp_path)
    (tmp_path / "run_status.json").write_text('{"state": "runn')
    with pytest.raises(RecordError, match=r"run_status\.json cannot be read as a run record: it is damaged"):
        read_status(tmp_path)
    (tmp_path / "run_status.json").write_text("[1, 2]")
    with pytest.raises(RecordError, match="do not fit a RunStatus record"):
        read_status(tmp_path)
    with pytest.raises(Exception, match="already holds a damaged run"):
        ArtifactsManager(tmp_path, stage="stage1").start("again")


def _unprivileged(argv: list[str]) -> list[str]:
    """`argv` run without the root override of file permissions, so a read-only folder is read-only."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file permissions cannot be enforced")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", *argv]


@pytest.mark.parametrize("inside", [False, True])
def test_read_only_run_dir_is_one_paragraph(inside: bool, tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    target = read_only / "run" if inside else read_only
    argv = [sys.executable, "-m", "llm_perf_opt.cli.stage1", *TINY_RUN, f"hydra.run.dir={target}"]
    try:
        done = subprocess.run(_unprivileged(argv), capture_output=True, text=True, timeout=300, check=False)
    finally:
        read_only.chmod(0o755)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"error: the output folder {target} cannot be written: Permission denied" in done.stderr
    assert list(read_only.iterdir()) == []


@pytest.mark.slow
def test_refused_reuse_keeps_the_previous_run_and_its_hydra_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_main("llm_perf_opt.cli.stage1", *TINY_RUN, "dataset.root=/nonexistent", f"hydra.run.dir={run_dir}")
    assert first.returncode == 2
    before = {p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    assert Path(".hydra/overrides.yaml") in before
    second = run_main("llm_perf_opt.cli.stage1", *TINY_RUN, "run.repeats=3", f"hydra.run.dir={run_dir}")
    assert second.returncode == 2
    assert "already holds a failed run; it was left untouched" in second.stderr
    assert "Traceback" not in second.stderr
    after = {p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    assert after == before
    assert b"run.repeats=3" not in (run_dir / ".hydra" / "overrides.yaml").read_bytes()


def test_a_sweep_folder_holding_runs_is_refused(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "run_status.json").write_text(
        json.dumps({"stage": "stage1", "run_id": "earlier", "state": "complete", "started": "2026-11-23T10:00:00"})
    )
    (sweep / "0" / ".hydra").mkdir()
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- run.repeats=1\n")
    done = run_main("llm_perf_opt.cli.stage1", "-m", *TINY_RUN, "run.repeats=1,2", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 2
    assert f"the run folder {sweep / '0'} already holds a complete run" in done.stderr
    assert (sweep / "0" / ".hydra" / "overrides.yaml").read_text() == "- run.repeats=1\n"
    assert not (sweep / "1").exists()


@pytest.mark.parametrize(
    ("error", "paragraph"),
    [
        (OSError(errno.EDQUOT, "Disk quota exceeded", "/shared/viz/a.png"), "could not write /shared/viz/a.png"),
        (PermissionError(errno.EACCES, "Permission denied", "/shared/viz"), "/shared/viz: Permission denied"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), None),  # not the environment: a bug
    ],
)
def test_os_errors_outside_the_writers(
    error: OSError, paragraph: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ArtifactsManager(tmp_path, stage="stage1").start("os-error")

    def job() -> None:
        raise error

    with pytest.raises(SystemExit) as ended:
        run_guarded(job, run_dir=tmp_path)
    assert ended.value.code == (1 if paragraph is None else 2)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {paragraph}" if paragraph else "error: unexpected FileNotFoundError")
    status = read_status(tmp_path)
    assert status.state == "failed"
    assert status.message is not None and str(error.filename) in status.message

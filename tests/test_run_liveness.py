"""A run folder names the process writing it (pid and host), so a folder still marked `running` after that process
died (SIGKILL, out of memory) is reported as such by every reader instead of being trusted as running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llm_perf_opt import artifacts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.cli.stage1_report import main as stage1_report
from llm_perf_opt.pipeline import compare
from llm_perf_opt.pipeline.sweep import load_job
from llm_perf_opt.pipeline.whatif_rungs import RungJob, stopped_outcome
from llm_perf_opt.records.common import RunStatus
from llm_perf_opt.records.folders import (
    ALIVE,
    GONE,
    UNKNOWN,
    read_status,
    whatif_for,
    writer_note,
    writer_state,
)
from whatif_fixtures import realistic, whatif_tree

FIXTURES = Path(__file__).parent / "fixtures"
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The id of a process of this host that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def running(pid: int | None, host: str | None = HOST) -> RunStatus:
    return RunStatus(stage="stage1", run_id="r", state="running", started="2026-11-25T10:00:00", pid=pid, host=host)


def mark_running(folder: Path, pid: int | None, host: str | None = HOST) -> None:
    """Rewrite `folder`'s status as a run still `running` in process `pid` on `host`."""
    data: dict[str, Any] = json.loads((folder / artifacts.STATUS_FILE).read_text())
    data.update(state="running", ended=None, message=None, pid=pid, host=host)
    (folder / artifacts.STATUS_FILE).write_text(json.dumps(data))


def test_the_status_names_the_process_and_older_folders_still_load(tmp_path: Path) -> None:
    ArtifactsManager(tmp_path / "run", stage="stage1").start("run")
    status = read_status(tmp_path / "run")
    assert (status.pid, status.host) == (os.getpid(), HOST)
    older = FIXTURES / "compare" / "cpu_tiny"  # written before the process was recorded
    assert "pid" not in json.loads((older / artifacts.STATUS_FILE).read_text())
    assert read_status(older).pid is None and read_status(older).host is None


def test_the_liveness_judgement(dead_pid: int) -> None:
    assert writer_state(running(os.getpid())) == ALIVE
    alive = f"the process writing it (pid {os.getpid()} on host {HOST}) is still running"
    assert writer_note(running(os.getpid())) == alive
    assert writer_state(running(dead_pid)) == GONE
    assert writer_note(running(dead_pid)) == (
        f"the process that wrote it (pid {dead_pid} on host {HOST}) is gone: it was killed before it could record "
        "its end"
    )
    elsewhere = running(os.getpid(), host="gpu-node-17")
    assert writer_state(elsewhere) == UNKNOWN
    assert f"written by pid {os.getpid()} on host gpu-node-17, so from host {HOST} it cannot be told" in writer_note(
        elsewhere
    )
    assert writer_state(running(None, None)) == UNKNOWN
    assert "does not record its process (an older folder)" in writer_note(running(None, None))


def test_a_zombie_is_gone() -> None:
    """Ended but not yet reaped by its parent: os.kill(pid, 0) still succeeds, yet the process is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped
        assert writer_state(running(child.pid)) == GONE
    finally:
        child.wait()


def test_perf_compare_says_the_process_is_gone(tmp_path: Path, dead_pid: int) -> None:
    folder = tmp_path / "killed"
    shutil.copytree(FIXTURES / "compare" / "h100_s1sol", folder)
    mark_running(folder, dead_pid)
    skipped = compare.load_run(folder)
    assert isinstance(skipped, compare.Skipped)
    assert skipped.reason == (
        f"the run is marked running, not complete: the process that wrote it (pid {dead_pid} on host {HOST}) is "
        "gone: it was killed before it could record its end"
    )


def test_a_killed_run_without_metrics(tmp_path: Path, dead_pid: int, capsys: pytest.CaptureFixture[str]) -> None:
    """What a SIGKILL leaves: a `running` status and no metrics.json; perf-compare and stage1-report say so."""
    folder = tmp_path / "killed"
    ArtifactsManager(folder, stage="stage1").start("killed")
    mark_running(folder, dead_pid)
    gone = f"the process that wrote it (pid {dead_pid} on host {HOST}) is gone"
    skipped = compare.load_run(folder)
    assert isinstance(skipped, compare.Skipped) and gone in skipped.reason
    with pytest.raises(SystemExit) as ended:
        stage1_report([str(folder)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"is not a finished stage1-run folder; its run_status.json reads running: {gone}" in err


def test_stage1_report_header_names_a_gone_process(tmp_path: Path, dead_pid: int) -> None:
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / "cpu_tiny_v1_stage1", folder)
    mark_running(folder, dead_pid)
    stage1_report([str(folder)])
    report = (folder / "report.md").read_text()
    assert (
        f"**Not marked finished:** its run_status.json still reads running; the process that wrote it (pid "
        f"{dead_pid} on host {HOST}) is gone" in report
    )
    assert read_status(folder).state == "running"  # a reader rebuilds the reports, it does not judge the run


def test_a_sweep_job_whose_process_is_gone(tmp_path: Path, dead_pid: int) -> None:
    job = tmp_path / "sweep" / "0"
    ArtifactsManager(job, stage="stage1").start("0")
    mark_running(job, dead_pid)
    reason = load_job(tmp_path / "sweep", job).skipped_reason
    assert reason is not None
    assert reason.startswith(f"the run is marked running (the process that wrote it (pid {dead_pid} on host {HOST})")


def test_citing_a_what_if_run_whose_process_is_gone_warns(
    tmp_path: Path, dead_pid: int, caplog: pytest.LogCaptureFixture
) -> None:
    whatif = whatif_tree(tmp_path / "whatif", realistic())
    ArtifactsManager(whatif, stage="whatif").start("whatif")
    mark_running(whatif, dead_pid)
    assert whatif_for(whatif / "rungs" / "00-baseline") is not None
    assert f"the what-if run in {whatif} did not record its end (the process that wrote it (pid {dead_pid}" in (
        caplog.text
    )


def test_the_what_if_reader_names_a_rung_whose_process_is_gone(tmp_path: Path, dead_pid: int) -> None:
    """A rung still marked `running` after the what-if run stopped it (SIGKILL after the grace period)."""
    job = RungJob("static_cache", (), (), tmp_path / "rungs" / "01-static_cache", tmp_path / "logs" / "01.log")
    ArtifactsManager(job.folder, stage="stage1").start(job.folder.name)
    mark_running(job.folder, dead_pid)
    outcome = stopped_outcome(job)
    assert outcome is not None and outcome.state == "failed"
    assert outcome.message == (
        f"stopped with the what-if run, it recorded no end within 20 s (the process that wrote it (pid {dead_pid} on "
        f"host {HOST}) is gone: it was killed before it could record its end)"
    )
    assert read_status(job.folder).state == "failed"  # no longer claims to run


def test_a_rung_past_its_time_limit_is_failed_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rung process still running at `whatif_run.rung_timeout_s` is stopped: its outcome and its folder read
    failed, and the message names the limit and what to do for a lever that compiles for minutes."""
    from llm_perf_opt.pipeline import whatif_rungs

    job = RungJob("vision_max_autotune", (), (), tmp_path / "rungs" / "02-vision_max_autotune", tmp_path / "02.log")
    ArtifactsManager(job.folder, stage="stage1").start(job.folder.name)  # the rung had started its folder
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(whatif_rungs, "stage1_command", lambda job, device: sleeper)
    outcome = whatif_rungs.run_rung(job, None, timeout_s=1.0)
    assert outcome.state == "failed" and outcome.wall_s is not None and outcome.wall_s < 30
    assert outcome.message == (
        "ran past whatif_run.rung_timeout_s=1 s and was stopped (a lever that compiles for minutes, such as "
        "max-autotune, needs a higher limit or null)"
    )
    assert read_status(job.folder).state == "failed"

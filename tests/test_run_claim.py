"""A run folder is claimed atomically before anything is written into it: of two runs started together into one
folder exactly one runs there, and the refused one neither writes into it nor marks it failed."""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from helpers import TINY_STAGE1
from llm_perf_opt import artifacts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.cli.common import RunFolderGuard, run_guarded
from llm_perf_opt.errors import UserError
from llm_perf_opt.records.common import RunStatus
from llm_perf_opt.records.folders import read_status, this_host
from llm_perf_opt.records.io import create_exclusive, dumps

RACERS = 6


def _race(folder: Path, barrier: Any, results: Any) -> None:
    """One racer: wait for the others, then claim `folder`; puts "won" or the refusal."""
    barrier.wait()
    try:
        artifacts.claim(folder, stage="stage1")
    except UserError as exc:
        results.put(str(exc))
        return
    results.put("won")


def test_of_processes_claiming_one_folder_at_once_exactly_one_wins(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(RACERS), context.Queue()
    racers = [context.Process(target=_race, args=(tmp_path / "run", barrier, queue)) for _ in range(RACERS)]
    for racer in racers:
        racer.start()
    results = [queue.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    assert results.count("won") == 1
    assert all("already holds a running run" in r for r in results if r != "won")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["run_status.json"]  # no racer's temporary file left
    status = read_status(tmp_path / "run")
    assert status.state == "running" and status.host == this_host() and status.pid != os.getpid()


def test_without_hard_links_a_claim_is_still_exclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some FUSE and SMB mounts have no hard links: the claim falls back to O_EXCL."""

    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    create_exclusive(tmp_path / "run_status.json", "first\n")
    with pytest.raises(FileExistsError):
        create_exclusive(tmp_path / "run_status.json", "second\n")
    assert (tmp_path / "run_status.json").read_text() == "first\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run_status.json"]


def test_a_refused_run_never_marks_the_other_runs_folder_failed(tmp_path: Path) -> None:
    """Before: the refused run's error handler marked the folder it was refused from `failed`, mid-run."""
    other = RunStatus(
        stage="stage1",
        run_id="other",
        state="running",
        started="2026-11-25T10:00:00",
        pid=os.getppid(),
        host=this_host(),
    )
    (tmp_path / "run_status.json").write_text(dumps(other))

    def refused() -> None:
        ArtifactsManager(tmp_path, stage="stage1").start("second")

    with pytest.raises(SystemExit) as ended:
        run_guarded(refused, run_dir=tmp_path)
    assert ended.value.code == 2
    assert read_status(tmp_path) == other


def hydra_config(folder: Path) -> object:
    return OmegaConf.create({"hydra": {"run": {"dir": str(folder)}}})


def test_the_guard_claims_the_folder_before_hydra_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    RunFolderGuard().on_run_start(hydra_config(folder), config_name="stage1")
    claimed = read_status(folder)
    assert (claimed.state, claimed.stage, claimed.pid) == ("running", "stage1", os.getpid())
    with pytest.raises(SystemExit):  # a second run into it, even from this process, is refused
        RunFolderGuard().on_run_start(hydra_config(folder), config_name="stage1")
    assert "already holds a running run (the process writing it" in capsys.readouterr().err
    art = ArtifactsManager(folder, stage="stage1")
    art.start("run")  # the run that claimed it starts in it
    art.finish(artifacts.COMPLETE)
    assert read_status(folder).state == "complete"
    with pytest.raises(UserError, match="already holds a complete run"):
        ArtifactsManager(folder, stage="stage1").start("again")


def test_a_claim_that_ran_nothing_is_given_back(tmp_path: Path) -> None:
    """stage2-profile stage2.rerender=<folder> runs nothing in the folder the guard claimed."""
    artifacts.claim(tmp_path / "run", stage="stage2")
    artifacts.release(tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []
    ArtifactsManager(tmp_path / "started", stage="stage2").start("started")
    artifacts.release(tmp_path / "started")  # a started run is not this process's to give back
    assert read_status(tmp_path / "started").state == "running"


@pytest.mark.slow
def test_two_runs_started_together_into_one_folder(tmp_path: Path) -> None:
    """Before: both passed the check, the refused one overwrote `.hydra/` and marked the live folder failed."""
    out = tmp_path / "run"

    def start(repeats: int) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-m",
            "llm_perf_opt.cli.stage1",
            *TINY_STAGE1,
            f"run.repeats={repeats}",
            f"hydra.run.dir={out}",
        ]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    runs = {1: start(1), 2: start(2)}
    errors = {repeats: run.communicate(timeout=600)[1] for repeats, run in runs.items()}
    codes = {repeats: run.returncode for repeats, run in runs.items()}
    assert sorted(codes.values()) == [0, 2], errors
    won = next(repeats for repeats, code in codes.items() if code == 0)
    lost = 3 - won
    assert f"error: the run folder {out} already holds a running run" in errors[lost]
    assert "it was left untouched" in errors[lost] and "Traceback" not in errors[lost]
    status = read_status(out)
    assert status.state == "complete" and status.pid == runs[won].pid
    overrides = (out / ".hydra" / "overrides.yaml").read_text()
    assert f"run.repeats={won}" in overrides and f"run.repeats={lost}" not in overrides
    assert "already holds" not in "".join(log.read_text() for log in out.glob("*.log"))


def test_an_interrupted_run_is_named_with_its_article(tmp_path: Path) -> None:
    """Before: "already holds a interrupted run"."""
    from llm_perf_opt import artifacts

    manager = artifacts.ArtifactsManager(tmp_path / "run", stage="stage1")
    manager.start("r")
    manager.finish(artifacts.INTERRUPTED, "stopped by SIGHUP")
    with pytest.raises(UserError, match="already holds an interrupted run;"):
        artifacts.refuse_reuse(tmp_path / "run")

"""The device handoff between what-if rungs (`whatif_run.overlap_rungs`): a rung hands its device on before it has
ended, the next one starts then and waits for the previous process's end before its warm-up passes."""

from __future__ import annotations

import itertools
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline import rung_handoff, whatif_rungs
from llm_perf_opt.pipeline.rung_handoff import RELEASED_ENV, WAIT_ENV, GpuHandoff
from llm_perf_opt.pipeline.whatif_rungs import Handoff, RungJob, run_rungs

CPU = torch.device("cpu")


def test_outside_a_what_if_run_the_handoff_does_nothing(tmp_path: Path) -> None:
    handoff = GpuHandoff.from_environ({})
    handoff.wait()
    handoff.release(CPU)
    assert handoff.waited_s is None and not handoff.handed


def test_a_rung_waits_for_the_previous_ones_end(tmp_path: Path) -> None:
    exited = tmp_path / "00-baseline.exited"
    handoff = GpuHandoff.from_environ({WAIT_ENV: str(exited)})
    threading.Timer(0.3, exited.touch).start()
    handoff.wait()
    assert handoff.waited_s is not None and 0.25 <= handoff.waited_s < 10
    exited.unlink()
    handoff.wait()  # once: later calls return at once
    assert not exited.exists()


def test_a_rung_whose_neighbour_never_ends_fails_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rung_handoff, "WAIT_LIMIT_S", 0.1)
    handoff = GpuHandoff.from_environ({WAIT_ENV: str(tmp_path / "never.exited")})
    with pytest.raises(UserError) as caught:
        handoff.wait()
    assert "did not end within 0.1 s" in caught.value.problem
    assert "whatif_run.overlap_rungs=false" in caught.value.fix


def test_a_rung_hands_its_device_on_once_and_only_where_a_second_rung_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = tmp_path / "01-static_cache.released"
    handoff = GpuHandoff.from_environ({RELEASED_ENV: str(released)})
    monkeypatch.setattr(rung_handoff, "available_host_bytes", lambda: 0)  # no room beside this process
    handoff.release(CPU)
    assert not released.exists() and not handoff.handed
    monkeypatch.setattr(rung_handoff, "available_host_bytes", lambda: 1 << 50)
    handoff.release(CPU)
    assert released.exists() and handoff.handed
    released.unlink()
    handoff.release(CPU)  # once
    assert not released.exists()


def test_the_room_check_reads_the_hosts_available_memory() -> None:
    available = rung_handoff.available_host_bytes()
    assert available is None or available > 0
    assert rung_handoff.room_for_another(torch.device("meta")) == "meta devices are handed over only at exit"


# A stand-in rung: starts, waits like stage1-run before its warm-up, "measures" for a while, hands its device on,
# then spends a while "post-processing" before it ends; it writes when each happened. It imports no torch (seconds a
# process on this machine): the handoff reads only the device's type.
RUNG = """
import json, sys, time, types
times = {"start": time.time()}
from llm_perf_opt.pipeline.rung_handoff import GpuHandoff
handoff = GpuHandoff.from_environ()
time.sleep(0.2)  # model build and FLOP count: may overlap the previous rung's end
handoff.wait()
times["passes"] = time.time()
time.sleep(0.3)  # warm-up and timed passes: the device to itself
times["passes_end"] = time.time()
handoff.release(types.SimpleNamespace(type="cpu"))
time.sleep(0.8)  # the profiler's post-processing, writing, exiting
times["end"] = time.time()
open(sys.argv[1], "w").write(json.dumps(times))
"""


def _times(tmp_path: Path, overlap: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, float]]:
    monkeypatch.setattr(
        whatif_rungs, "stage1_command", lambda job, device: [sys.executable, "-c", RUNG, str(job.folder) + ".json"]
    )
    jobs = [
        RungJob(name, (), (), tmp_path / f"{overlap}-{i}-{name}", tmp_path / f"{overlap}-{i}.log")
        for i, name in enumerate(("baseline", "static_cache", "attn_eager"))
    ]
    outcomes = run_rungs(jobs, [None], timeout_s=60, overlap=overlap)
    assert set(outcomes) == {"baseline", "static_cache", "attn_eager"}
    return [json.loads(Path(str(job.folder) + ".json").read_text()) for job in jobs]


def test_with_overlap_the_next_rung_starts_before_the_previous_one_ends_and_measures_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _times(tmp_path, True, monkeypatch)
    for before, after in itertools.pairwise(runs):
        assert after["start"] < before["end"]  # started during the previous rung's post-processing
        assert after["start"] >= before["passes_end"]  # never during its passes
        assert after["passes"] >= before["end"]  # its own passes after the previous process ended


def test_without_overlap_each_rung_starts_after_the_previous_one_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _times(tmp_path, False, monkeypatch)
    for before, after in itertools.pairwise(runs):
        assert after["start"] >= before["end"]


def test_the_handoff_files_of_a_rung_are_named_after_its_folder(tmp_path: Path) -> None:
    job = RungJob("static_cache", (), (), tmp_path / "rungs" / "01-static_cache", tmp_path / "01.log")
    first = Handoff.of(tmp_path, job, None, overlap=True)
    assert first.env == ((RELEASED_ENV, str(tmp_path / "01-static_cache.released")),)
    second = Handoff.of(tmp_path, job, first.exited, overlap=True)
    assert dict(second.env)[WAIT_ENV] == str(tmp_path / "01-static_cache.exited")
    kept = Handoff.of(tmp_path, job, tmp_path / "compile_preloaded", overlap=False)  # waits, never hands on early
    assert kept.env == ((WAIT_ENV, str(tmp_path / "compile_preloaded")),)

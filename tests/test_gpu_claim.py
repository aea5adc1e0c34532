"""`${llo_job_device:}`'s GPU claim (CPU only: the device count is given): each job of a sweep takes a GPU no other
job holds, keeps it for its process's next jobs, and falls back to `job mod GPUs` when it cannot lock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_perf_opt import gpu_claim


@pytest.fixture
def no_held_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(gpu_claim, "_HELD", None)
    yield
    if gpu_claim._HELD is not None:
        gpu_claim._HELD.release()


def test_two_claims_take_two_gpus_and_a_released_one_is_taken_again(tmp_path: Path) -> None:
    first = gpu_claim.claim(tmp_path, 2)
    second = gpu_claim.claim(tmp_path, 2)
    assert first is not None and second is not None
    assert (first.index, second.index) == (0, 1)
    assert gpu_claim.claim(tmp_path, 2) is None  # both held: nothing free
    first.release()
    again = gpu_claim.claim(tmp_path, 2)
    assert again is not None and again.index == 0
    again.release()
    second.release()


def test_a_sweeps_locks_are_its_own(tmp_path: Path) -> None:
    assert gpu_claim.lock_dir_for(str(tmp_path / "a")) != gpu_claim.lock_dir_for(str(tmp_path / "b"))
    assert gpu_claim.lock_dir_for(str(tmp_path / "a")) == gpu_claim.lock_dir_for(str(tmp_path / "a" / "." / ""))


@pytest.mark.usefixtures("no_held_gpu")
def test_a_reused_worker_keeps_its_gpu(tmp_path: Path) -> None:
    sweep = str(tmp_path / "sweep")
    other = gpu_claim.claim(gpu_claim.lock_dir_for(sweep), 3)  # another worker holds cuda:0
    assert other is not None and other.index == 0
    assert gpu_claim.claim_for_job(sweep, job_num=0, count=3) == 1
    assert gpu_claim.claim_for_job(sweep, job_num=5, count=3) == 1  # this process's next job: the same GPU
    # a job of another sweep releases this process's claim and takes that sweep's first free GPU
    assert gpu_claim.claim_for_job(str(tmp_path / "next"), job_num=4, count=3) == 0
    freed = gpu_claim.claim(gpu_claim.lock_dir_for(sweep), 3)
    assert freed is not None and freed.index == 1  # the first sweep's cuda:1 is free again
    freed.release()
    other.release()


@pytest.mark.usefixtures("no_held_gpu")
def test_falls_back_to_the_job_number_when_every_gpu_is_held(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sweep = str(tmp_path / "sweep")
    held = [gpu_claim.claim(gpu_claim.lock_dir_for(sweep), 2) for _ in range(2)]
    assert gpu_claim.claim_for_job(sweep, job_num=3, count=2) == 1
    assert "all 2 GPU(s) are held" in caplog.text
    for claim in held:
        assert claim is not None
        claim.release()


@pytest.mark.usefixtures("no_held_gpu")
def test_falls_back_to_the_job_number_when_locking_is_impossible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(lock_dir: Path, count: int) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gpu_claim, "claim", refuse)
    assert gpu_claim.claim_for_job(str(tmp_path), job_num=5, count=4) == 1
    assert "cannot be used" in caplog.text

"""`${llo_job_device:}`: the GPU a sweep job runs on, claimed so that two jobs running at once never share one.

A job takes the first GPU no other job of the sweep holds: an exclusive, non-blocking `fcntl.flock` on one lock file
per GPU under the machine's own temporary folder (jobs on other cluster nodes never count), held for the life of the
process (a launcher worker that runs several jobs keeps its GPU; it comes free when the process ends). When no lock
can be taken (no `fcntl`, an unwritable folder, more jobs at once than GPUs), job *n* takes `cuda:(n mod GPUs)`
with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import attrs

log = logging.getLogger("llm_perf_opt.gpu_claim")

LOCKS_DIR = "llm-perf-opt-gpu-locks"


@attrs.define
class GpuClaim:
    """A GPU held by this process for the sweep whose locks lie in `lock_dir` (the lock file stays open)."""

    lock_dir: Path
    index: int
    fd: int

    def release(self) -> None:
        os.close(self.fd)  # closing the file releases its flock


def lock_dir_for(sweep_dir: str) -> Path:
    """The folder of one sweep's GPU locks: under the machine's temporary folder, keyed by the sweep folder."""
    key = hashlib.sha1(os.path.abspath(sweep_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / LOCKS_DIR / key


def claim(lock_dir: Path, count: int) -> GpuClaim | None:
    """Take the first of `count` GPUs whose lock nobody holds; None when every one is held.

    OSError when the locks cannot be used at all (no `fcntl`, unwritable folder)."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        fd = os.open(lock_dir / f"cuda-{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError:
            os.close(fd)
            raise
        return GpuClaim(lock_dir, index, fd)
    return None


_HELD: GpuClaim | None = None  # the GPU this process holds for its sweep


def claim_for_job(sweep_dir: str, job_num: int, count: int) -> int:
    """The GPU index of a sweep job in this process: the one it already holds for this sweep, else a free one
    (a claim for another sweep is released first), else `job_num mod count` with a warning."""
    global _HELD
    lock_dir = lock_dir_for(sweep_dir)
    if _HELD is not None and _HELD.lock_dir == lock_dir and _HELD.index < count:
        return _HELD.index
    if _HELD is not None:
        _HELD.release()
        _HELD = None
    fallback = job_num % count
    try:
        _HELD = claim(lock_dir, count)
    except (OSError, ImportError) as exc:
        log.warning("GPU locks under %s cannot be used (%s): job %d takes cuda:%d", lock_dir, exc, job_num, fallback)
        return fallback
    if _HELD is None:
        log.warning(
            "all %d GPU(s) are held by other jobs of this sweep (more jobs at once than GPUs): job %d shares cuda:%d",
            count,
            job_num,
            fallback,
        )
        return fallback
    return _HELD.index


def job_device() -> str:
    """`${llo_job_device:}`: in a multirun job, `cuda:N` for the GPU it claimed; in a single run `cuda:0`;
    without a GPU (or outside Hydra) `auto`."""
    import torch
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    count = torch.cuda.device_count()
    if count == 0 or not HydraConfig.initialized():
        return "auto"
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return "cuda:0"
    number = int(getattr(hydra_cfg.job, "num", None) or 0)
    return f"cuda:{claim_for_job(str(hydra_cfg.sweep.dir), number, count)}"

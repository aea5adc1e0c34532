"""A measured job that shares its process with an earlier one (a Hydra launcher worker reused by joblib/loky):
what the earlier job left behind is cleared before this one measures."""

from __future__ import annotations

import gc
import logging

import torch

log = logging.getLogger("llm_perf_opt.session")

_jobs_started = 0  # measured jobs this process has started


def start_clean(device: torch.device) -> bool:
    """Mark a job's start; when this process already ran one, reset torch.compile's caches and counters and the CUDA
    allocator's cache and peak memory on `device`. Returns whether it was reused."""
    global _jobs_started
    _jobs_started += 1
    if _jobs_started == 1:
        return False
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gc.collect()  # the earlier job's model and tensors, before their cached blocks are returned
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    log.info("this process ran %d job(s) before this one: compile caches, CUDA allocator reset", _jobs_started - 1)
    return True

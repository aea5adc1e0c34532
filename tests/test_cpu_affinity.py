"""run.cpu_affinity: which cores a run is pinned to, and the clear errors for bad values."""

from __future__ import annotations

import os

import pytest
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.session.cpu_affinity import AUTO_CORES, choose, format_cores, parse_cores, pin

CUDA0, CUDA1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
SIXTEEN = list(range(16))


def test_core_lists_parse_and_print_alike() -> None:
    assert parse_cores("2-5,8") == (2, 3, 4, 5, 8) and format_cores((8, 2, 3, 4, 5)) == "2-5,8"
    assert parse_cores(" 3 ") == (3,) and format_cores((0, 2, 4)) == "0,2,4"
    for bad in ("two", "5-2", "-1", "1-x"):
        with pytest.raises(UserError, match="not a list of CPU cores"):
            parse_cores(bad)


def test_auto_pins_a_gpu_run_to_four_cores_near_its_gpu_and_never_a_cpu_run() -> None:
    near = list(range(8, 16))  # the GPU's NUMA node
    first = choose("auto", CUDA0, SIXTEEN, near)
    assert first.cores == (9, 10, 11, 12) and "near the GPU" in first.how  # its first core left to the system
    assert choose("auto", CUDA1, SIXTEEN, list(range(16))).cores == (5, 6, 7, 8)  # the next GPU: the next four
    assert choose("auto", CUDA0, SIXTEEN, None).cores == (1, 2, 3, 4)
    assert choose("auto", CPU, SIXTEEN, None).cores is None
    small = choose("auto", CUDA0, list(range(4)), None)
    assert small.cores is None and "fewer than" in small.how and len(first.cores or ()) == AUTO_CORES


def test_explicit_cores_and_none() -> None:
    assert choose("2-5", CPU, SIXTEEN, None).cores == (2, 3, 4, 5)
    assert choose("none", CUDA0, SIXTEEN, None).cores is None
    with pytest.raises(UserError, match="cannot use: 20-21"):
        choose("20-21", CUDA0, SIXTEEN, None)
    assert "cores 2-5, 4 torch threads" in choose("2-5", CPU, SIXTEEN, None).describe()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_pinning_applies_to_the_process_and_torch_threads() -> None:
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    core = min(before)
    try:
        done = pin(str(core), CPU)
        assert done.cores == (core,) and os.sched_getaffinity(0) == {core} and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)

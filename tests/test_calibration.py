"""Calibration workloads (instruments/calibration.py) on the CPU: known work, positive rates, honest descriptions."""

from __future__ import annotations

import torch

from llm_perf_opt.instruments.calibration import achieved_rate, copy_workload, gemm_workload, tf32_matmuls

CPU = torch.device("cpu")


def test_gemm_work_is_two_m_n_k_and_the_product_is_right() -> None:
    gemm = gemm_workload(CPU, torch.float32, size=64)
    assert (gemm.name, gemm.unit, gemm.work_per_run) == ("gemm_float32", "FLOP", 2.0 * 64**3)
    assert gemm.description == "64³ float32 GEMM (torch.matmul)"
    gemm.run()  # runs in place into its preallocated output


def test_copy_moves_every_byte_twice() -> None:
    copy = copy_workload(CPU, gib=1 / 1024)  # 1 MiB
    assert (copy.name, copy.unit, copy.work_per_run) == ("copy", "byte", 2.0 * 2**20)
    copy.run()


def test_achieved_rate_is_work_over_time() -> None:
    rate = achieved_rate(gemm_workload(CPU, torch.float32, size=64), CPU, iters=3, repeats=3, warmup=1)
    assert rate.unit == "FLOP/s" and rate.value > 0
    assert rate.description == "64³ float32 GEMM (torch.matmul), median of 3 × 3 runs, time.perf_counter (CPU)"
    bandwidth = achieved_rate(copy_workload(CPU, gib=1 / 1024), CPU, iters=2, repeats=3, warmup=0)
    assert bandwidth.unit == "B/s" and bandwidth.value > 0


def test_tf32_switch_is_restored() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    with tf32_matmuls(not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before

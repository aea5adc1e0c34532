"""Nsight Compute's launch windows (nsight/ncu_windows.py): pure arithmetic on the nsys trace's kernel counts."""

from __future__ import annotations

from llm_perf_opt.nsight.ncu_windows import (
    BytesWindow,
    decode_bytes_window,
    launch_cap,
    launch_window,
    prefill_bytes_window,
    rarest_fitting,
)
from llm_perf_opt.records.stage2 import NcuStageTarget


def test_launch_window_lands_in_a_middle_decode_step() -> None:
    target = NcuStageTarget(kernels=(), calls={"gemm": 310, "add": 620, "lm_head": 31}, instances=31)
    # 30 matching launches per step; 9 new tokens: skip 4 steps, count one step (capped at 4 per kernel name).
    assert launch_window("decode", ["gemm", "add"], target, 1, 9) == (120, 8)
    assert launch_window("decode", ["lm_head"], target, 1, 9) == (4, 1)
    assert launch_window("decode", ["lm_head"], target, 1, 2) == (0, 1)  # one step: nothing to skip
    prefill = NcuStageTarget(kernels=(), calls={"gemm": 50}, instances=5)
    assert launch_window("prefill", ["gemm"], prefill, 2, 9) == (0, 8)
    assert launch_window("prefill", ["never_ran"], prefill, 2, 9) == (0, 1)  # at least one launch


def test_later_rounds_take_the_rarest_missing_kernels_that_fit() -> None:
    target = NcuStageTarget(kernels=(), calls={"device_kernel": 3410, "lm_head": 155, "norm": 310}, instances=155)
    # per step: lm_head 1, norm 2, device_kernel 22; the window for k kernels holds 4k launches.
    assert rarest_fitting(["device_kernel", "lm_head", "norm"], target, 1) == ["lm_head", "norm"]
    assert rarest_fitting(["device_kernel"], target, 1) == ["device_kernel"]  # the first always goes in
    assert (launch_cap(0, 1), launch_cap(3, 2)) == (1, 24)


def test_prefill_bytes_window_covers_the_first_forward() -> None:
    assert prefill_bytes_window("prefill", [683, 690], 1) == BytesWindow("the prefill of the first image", 0, 1380, 683)
    batch = prefill_bytes_window("vision/sam", [67, 73], 4)
    assert batch.instance == "the vision/sam of the first batch (4 inputs)" and batch.count == 146
    assert prefill_bytes_window("prefill", [], 1) == BytesWindow("the prefill of the first image", 0, 0, 0)


def test_decode_bytes_window_profiles_the_middle_step() -> None:
    # 4 new tokens: 3 steps, the middle one is the second: skip the first step's launches
    assert decode_bytes_window([217] * 6, 4) == BytesWindow("decode step 2 of 3", 217, 217, 217)
    # 21 new tokens: step 10 of 20, past the trace's 3 steps: their mean (200) stands in
    skipped = 190 + 200 + 210 + 6 * 200  # the 9 steps before it
    assert decode_bytes_window([190, 200, 210], 21) == BytesWindow("decode step 10 of 20", skipped, 200, 200)
    assert decode_bytes_window([217], 1).count == 0 and decode_bytes_window([], 8).count == 0

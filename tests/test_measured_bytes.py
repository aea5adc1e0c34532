"""The join of measured and analytic bytes per stage instance: analytic costs per instance from Stage 1's record,
the stated causes of a gap, and the checks on a bytes pass's launch window."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llm_perf_opt.nsight.measured_bytes import (
    InstanceCost,
    gap_reason,
    instance_costs,
    measured_rows,
    window_warnings,
)
from llm_perf_opt.nsight.ncu_bytes import LaunchBytes, bytes_by_range, read_launch_bytes
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.stage2 import NcuBytesPass

FIXTURES = Path(__file__).parent / "fixtures"
L2 = 50 * 2**20
MB = 1e6
BANDWIDTH = PeakFigure(value=3.35e12, unit="B/s", dtype_key=None, source="datasheet", device_name="H100")
PREFILL_PASS = NcuBytesPass(
    stage="prefill",
    instance="the prefill of the first image",
    folder="ncu/bytes-prefill",
    workload="workload/ncu-bytes-prefill",
    launch_skip=0,
    launch_count=16,
    expected_kernels=8,
    cache_control="none",
)
DECODE_PASS = attrs.evolve(
    PREFILL_PASS, stage="decode", instance="decode step 2 of 3", launch_skip=4, launch_count=4, expected_kernels=4
)


def launch(name: str, moved: float, *ranges: str) -> LaunchBytes:
    return LaunchBytes(name=name.split("<")[0], full_name=name, ranges=ranges, duration_s=1e-5,
                       dram_read_bytes=moved, dram_write_bytes=0.0)  # fmt: skip


def test_instance_costs_per_pass_and_per_decode_step() -> None:
    h100 = load_stage1_metrics(FIXTURES / "metrics" / "h100_full_stage1.json")  # 25 passes of 31 steps
    costs = instance_costs(h100)
    prefill = h100.efficiency_of("prefill")
    decode = h100.efficiency_of("decode")
    assert prefill is not None and decode is not None
    assert costs["prefill"] == InstanceCost(prefill.flops / 25, prefill.bytes / 25)
    assert costs["decode/step"] == InstanceCost(decode.flops / (25 * 31), decode.bytes / (25 * 31))
    assert set(costs) == {"prefill", "vision/sam", "vision/encoder", "vision/projector", "decode/step"}
    assert instance_costs(attrs.evolve(h100, records=())) == {}  # no passes: nothing to divide by


def test_no_reason_where_they_agree_or_nothing_is_known() -> None:
    assert gap_reason("prefill", 1.05 * MB, 1.0 * MB, [], L2) is None
    assert gap_reason("prefill", 0.91 * MB, 1.0 * MB, [], L2) is None
    assert gap_reason("prefill", 2 * MB, None, [], L2) is None


def test_less_than_analytic_is_put_down_to_l2_hits() -> None:
    fits = gap_reason("vision/sam", 5 * MB, 10 * MB, [], L2)
    assert fits is not None and "fits in the 50 MiB L2" in fits and "9.5 MiB" in fits
    assert "earlier kernels" in fits
    step = gap_reason("decode/step", 5 * MB, 10 * MB, [], L2)
    assert step is not None and "the previous step read are still there" in step
    large = gap_reason("prefill", 500 * MB, 1000 * MB, [], L2)
    assert large is not None and "only L2 misses" in large and "fits" not in large
    assert "the 50 MiB L2" in large
    unknown_l2 = gap_reason("prefill", 5 * MB, 10 * MB, [], None)
    assert unknown_l2 is not None and "fits" not in unknown_l2


def test_more_than_analytic_names_the_kernels_that_move_the_extra() -> None:
    launches = [
        launch("nvjet_gemm", 60 * MB, "prefill"),
        launch("void cunn_SoftMaxForward<8>(T4 *)", 25 * MB, "prefill"),
        launch("void unrolled_elementwise_kernel<direct_copy_kernel_cuda(...)>(int)", 12 * MB, "prefill"),
        launch("void vectorized_elementwise_kernel<4, CUDAFunctor_add>(int)", 3 * MB, "prefill"),  # 3%: left out
    ]
    why = gap_reason("prefill", 100 * MB, 50 * MB, launches, L2)
    assert why is not None and "does not count" in why
    assert "25% in softmax kernels" in why and "12% in copy kernels" in why
    assert "elementwise kernels" not in why.split("copy kernels")[1]  # under 5%: not named
    assert gap_reason("prefill", 100 * MB, 50 * MB, [launch("gemm", 100 * MB)], L2) is not None


def test_rows_of_the_prefill_pass_join_measured_and_analytic() -> None:
    launches = read_launch_bytes(FIXTURES / "ncu" / "synthetic_bytes_prefill_raw.csv")
    costs = {"prefill": InstanceCost(3.6e9, 30 * MB), "vision/sam": InstanceCost(2e9, 16 * MB)}
    rows = measured_rows(
        PREFILL_PASS,
        bytes_by_range(launches),
        launches,
        costs,
        "the profiled workload",
        bandwidth=BANDWIDTH,
        ridge=295.3,
        l2_cache_bytes=L2,
    )
    assert [r.stage for r in rows] == ["prefill", "vision/sam", "vision/encoder", "vision/projector"]
    prefill = rows[0]
    assert prefill.instance == "the prefill of the first image" and prefill.kernels == 8
    assert prefill.measured_bytes == pytest.approx(36 * MB) and prefill.analytic_bytes == 30 * MB
    assert prefill.ratio == pytest.approx(1.2)
    assert prefill.measured_intensity == pytest.approx(100.0) and prefill.analytic_intensity == pytest.approx(120.0)
    assert prefill.measured_bound == prefill.analytic_bound == "memory"
    assert prefill.kernel_ms == pytest.approx(0.3)
    assert prefill.measured_mbu == pytest.approx(36 * MB / 300e-6 / 3.35e12)
    assert prefill.analytic_mbu == pytest.approx(30 * MB / 300e-6 / 3.35e12)
    assert prefill.why is not None and "softmax" in prefill.why
    assert prefill.analytic_source == "the profiled workload"
    encoder = rows[2]  # no analytic figure for it
    assert encoder.analytic_bytes is None and encoder.ratio is None and encoder.why is None
    assert encoder.analytic_source is None and encoder.measured_bound is None


def test_rows_of_the_decode_pass_are_the_step() -> None:
    launches = read_launch_bytes(FIXTURES / "ncu" / "synthetic_bytes_decode_raw.csv")
    rows = measured_rows(
        DECODE_PASS,
        bytes_by_range(launches),
        launches,
        {"decode/step": InstanceCost(0.031e9, 31 * MB)},
        "x",
        bandwidth=None,
        ridge=None,
        l2_cache_bytes=L2,
    )
    assert [(r.stage, r.instance) for r in rows] == [("decode/step", "decode step 2 of 3")]
    assert rows[0].ratio == pytest.approx(1.0) and rows[0].why is None
    assert rows[0].measured_mbu is None and rows[0].measured_bound is None  # no peak, no ridge


def test_window_warnings() -> None:
    eight = [launch("k", 1.0, "prefill")] * 8
    assert window_warnings(PREFILL_PASS, eight) == []
    assert "profiled 7 kernels where nsys counted 8" in window_warnings(PREFILL_PASS, eight[:7])[0]
    full = window_warnings(attrs.evolve(PREFILL_PASS, launch_count=8), eight)
    assert len(full) == 1 and "filled its window of 8 launches" in full[0]
    steps = [launch("k", 1.0, "decode", "decode/step")] * 3 + [launch("k", 1.0, "decode")]
    assert window_warnings(DECODE_PASS, steps) == [
        "The bytes pass over decode step 2 of 3: 1 of its 4 kernels ran outside a decode step."
    ]


def test_instance_costs_of_a_batched_run_are_per_batch() -> None:
    """Batched: one prefill instance is a whole batch's (its inputs' vision included), so costs divide by batch
    passes, not by input records."""
    batched = load_stage1_metrics(FIXTURES / "metrics" / "cpu_tiny_batch2_stage1.json")  # 3 passes of a batch of 2
    costs = instance_costs(batched)
    prefill = batched.efficiency_of("prefill")
    assert prefill is not None and costs["prefill"].flops == pytest.approx(prefill.flops / 3)
    assert costs["prefill"].flops == pytest.approx(batched.flops_per_batch["batch 0"]["prefill"])
    steps = sum(len(b.decode_step_ms) for b in batched.batches)
    decode = batched.efficiency_of("decode")
    assert decode is not None and costs["decode/step"].bytes == pytest.approx(decode.bytes / steps)


def test_a_gemm_whose_template_names_copy_atoms_is_not_a_copy_kernel() -> None:
    """CUTLASS's grouped GEMM (the MoE experts) names `cute::Copy_Atom`s in its template arguments: the kind of a
    kernel comes from its function name and functor, not from every word of its full name."""
    grouped = (
        "void cutlass::device_kernel<gemm::GemmUniversal<gemm::CollectiveMma<cute::Copy_Atom<cute::SM90_TMA_LOAD>, "
        "cute::SM75_U32x4_LDSM_N>>>(T1::Params)"
    )
    launches = [
        launch(grouped, 60 * MB, "prefill"),
        launch("void elementwise_kernel<128, 4, gpu_kernel_impl_nocast<direct_copy_kernel_cuda>>(int)", 40 * MB),
    ]
    why = gap_reason("prefill", 100 * MB, 50 * MB, launches, L2)
    assert why is not None and "40% in copy kernels" in why and "60%" not in why

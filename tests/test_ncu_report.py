"""The ncu raw-page CSV parser: units, FLOPs, aggregation per kernel, and the real H100 export."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.nsight.ncu_report import (
    classify_bound,
    function_name,
    kernel_base_name,
    nvtx_stack,
    parse_ncu_raw_csv,
    parse_number,
    read_ncu_raw_csv,
    read_table,
    unit_scale,
)

FIXTURE = Path(__file__).parent / "fixtures" / "ncu" / "h100_tiny_decode_raw.csv"
NVTX = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"


def nvtx_cell(*ranges: str) -> str:
    return "640 " + "".join(f' "llm_perf_opt:{r}:none:none:RGB:0xff:REGISTERED:{r}" ' for r in ranges)


def raw_csv(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """An ncu raw-page CSV: header, units row, one row per launch (every field quoted, as ncu writes it)."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow([name for name, _ in columns])
    writer.writerow([unit for _, unit in columns])
    writer.writerows(rows)
    return out.getvalue()


# ---- the real export -------------------------------------------------------------------------------------


def test_fixture_kernels() -> None:
    kernels = read_ncu_raw_csv(FIXTURE)
    # 6 launches of 5 functions: the two unrolled_elementwise_kernel launches are different instantiations.
    assert [k.name for k in kernels] == [
        "unrolled_elementwise_kernel",
        "reduce_kernel",
        "indexSelectSmallIndex",
        "vectorized_elementwise_kernel",
        "elementwise_kernel_with_index",
    ]
    assert sum(k.launches for k in kernels) == 6
    unrolled = kernels[0]
    assert (unrolled.launches, unrolled.variants) == (2, 2)
    assert unrolled.duration_s == pytest.approx((4.928 + 4.544) / 2 * 1e-6)
    assert unrolled.dram_bytes == pytest.approx((43.008 + 34.560) / 2 * 1e3)
    assert unrolled.full_name.startswith("void unrolled_elementwise_kernel<direct_copy_kernel_cuda")
    totals = [k.duration_s * k.launches for k in kernels]
    assert totals == sorted(totals, reverse=True)
    for kernel in kernels:
        assert kernel.nvtx_range == "decode/step"
        assert kernel.bound == "latency"  # tiny decode kernels: far below 60 % of any peak
        assert kernel.flops == 0.0  # no FP instruction executed; the derived__sm__..._x2 peaks are not work
        assert kernel.achieved_tflops == 0.0 and kernel.arithmetic_intensity == 0.0


def test_fixture_units_by_hand() -> None:
    """Launch 0: gpu__time_duration.sum = 3.264 us, dram__bytes_read.sum = 4.352 Kbyte, write 0 byte."""
    index_select = next(k for k in read_ncu_raw_csv(FIXTURE) if k.name == "indexSelectSmallIndex")
    assert index_select.launches == 1
    assert index_select.duration_s == pytest.approx(3.264e-6)
    assert index_select.dram_bytes == pytest.approx(4352.0)
    # ncu's own dram__bytes.sum.per_second for this launch: 1.333333 Gbyte/s (Kbyte = 1000 bytes).
    assert index_select.dram_gbps == pytest.approx(1.333333, rel=1e-5)
    assert index_select.sm_throughput_pct == pytest.approx(0.008585)
    assert index_select.dram_throughput_pct == pytest.approx(9.840445)  # gpu__compute_memory_throughput
    assert index_select.full_name.startswith("void unnamed>::indexSelectSmallIndex<c10::BFloat16")


# ---- synthetic exports -----------------------------------------------------------------------------------

COLUMNS = [
    ("ID", ""),
    (NVTX, ""),
    ("Kernel Name", ""),
    ("derived__sm__sass_thread_inst_executed_op_ffma_pred_on_x2", "inst"),  # a PEAK rate: must be ignored
    ("dram__bytes_read.sum", "Mbyte"),
    ("dram__bytes_write.sum", "Kbyte"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    ("gpu__time_duration.sum", "us"),
    ("sm__ops_path_tensor_src_bf16_dst_fp32.sum", ""),
    ("sm__ops_path_tensor_src_int8.sum", ""),  # integer work is not FLOPs
    ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "inst"),
    ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "Kinst"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%"),
]


def gemm_row(
    launch: int,
    template: str,
    duration_us: str,
    read_mb: str,
    tensor: str,
    sm: str,
    mem: str,
    ranges: tuple[str, ...] = ("decode", "decode/step"),
) -> list[str]:
    return [
        str(launch),
        nvtx_cell(*ranges),
        f"void at::native::gemv<{template}>(int, T1)",
        "33,792.000000",
        read_mb,
        "500",
        mem,
        duration_us,
        tensor,
        "9,999",
        "1,000",
        "2",
        sm,
    ]


def test_repeated_launches_are_averaged_and_their_throughputs_weighted_by_time() -> None:
    text = raw_csv(
        COLUMNS,
        [
            gemm_row(0, "float", "1,000.0", "2.0", "4,000,000", "80.0", "20.0"),
            gemm_row(1, "c10::BFloat16", "3,000.0", "4.0", "8,000,000", "60.0", "30.0"),
            gemm_row(2, "float", "10.0", "0.1", "0", "1.0", "70.0", ranges=("prefill",)),
        ],
    )
    decode, prefill = parse_ncu_raw_csv(text)
    assert (decode.name, decode.launches, decode.variants, decode.nvtx_range) == ("gemv", 2, 2, "decode/step")
    assert decode.full_name == "void at::native::gemv<c10::BFloat16>(int, T1)"  # the longest launch's name
    assert decode.duration_s == pytest.approx(2e-3)
    assert decode.dram_bytes == pytest.approx(3e6 + 5e5)
    # per launch: fadd 1,000 + 2 x ffma 2 Kinst (4,000) + tensor (4e6, 8e6); int8 and the x2 peak do not count
    assert decode.flops == pytest.approx(5_000 + 6e6)
    assert decode.achieved_tflops == pytest.approx((5_000 + 6e6) / 2e-3 / 1e12)
    assert decode.dram_gbps == pytest.approx((3e6 + 5e5) / 2e-3 / 1e9)
    assert decode.arithmetic_intensity == pytest.approx((5_000 + 6e6) / (3e6 + 5e5))
    # launches of 1 and 3 ms: the SM was busy (80 x 1 + 60 x 3) / 4 = 65% of the kernel's time, not (80 + 60) / 2
    assert (decode.sm_throughput_pct, decode.dram_throughput_pct) == (pytest.approx(65.0), pytest.approx(27.5))
    assert decode.bound == "compute"
    assert (prefill.launches, prefill.nvtx_range, prefill.bound) == (1, "prefill", "memory")
    assert prefill.duration_s == pytest.approx(10e-6) and prefill.dram_bytes == pytest.approx(1e5 + 5e5)


def test_no_flop_metrics_gives_none() -> None:
    text = raw_csv(
        [
            ("ID", ""),
            ("Kernel Name", ""),
            ("gpu__time_duration.sum", "ms"),
            ("dram__bytes_read.sum", "Gbyte"),
            ("dram__bytes_write.sum", "byte"),
        ],
        [["0", "copy_kernel", "1.5", "0.003", "0"]],
    )
    (kernel,) = parse_ncu_raw_csv(text)
    assert kernel.duration_s == pytest.approx(1.5e-3) and kernel.dram_bytes == pytest.approx(3e6)
    assert kernel.flops is None and kernel.achieved_tflops is None and kernel.arithmetic_intensity is None
    assert kernel.sm_throughput_pct is None and kernel.dram_throughput_pct is None
    assert kernel.bound == "unknown" and kernel.nvtx_range is None and kernel.dram_gbps == pytest.approx(2.0)


def test_roofline_rates_when_counts_are_missing() -> None:
    """SpeedOfLight_RooflineChart gives per-cycle rates; FLOPs = rate x elapsed cycles (clock x duration)."""
    text = raw_csv(
        [
            ("ID", ""),
            ("Kernel Name", ""),
            ("gpu__time_duration.sum", "us"),
            ("dram__bytes.sum", "Kbyte"),
            ("derived__smsp__sass_thread_inst_executed_op_ffma_pred_on_x2", "inst/cycle"),
            ("smsp__cycles_elapsed.avg.per_second", "Ghz"),
            ("smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed", "inst/cycle"),
            ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
        ],
        [["0", "void k<1>(int)", "10", "8", "100", "2", "50", "75"]],
    )
    (kernel,) = parse_ncu_raw_csv(text)
    cycles = 2e9 * 10e-6  # 20,000
    assert kernel.flops == pytest.approx((100 + 50) * cycles)  # the x2 column is already 2 FLOPs per FMA
    assert kernel.dram_bytes == pytest.approx(8000)
    assert kernel.dram_throughput_pct == pytest.approx(75.0) and kernel.bound == "memory"


def test_console_lines_around_the_csv_are_ignored() -> None:
    body = raw_csv(
        [
            ("ID", ""),
            ("Kernel Name", ""),
            ("gpu__time_duration.sum", "ns"),
            ("dram__bytes_read.sum", "byte"),
            ("dram__bytes_write.sum", "byte"),
        ],
        [["0", "k", "1,500", "10", "20"]],
    )
    text = "==PROF== Disconnected\n" + body + "==WARNING== something\n"
    (kernel,) = parse_ncu_raw_csv(text)
    assert kernel.duration_s == pytest.approx(1.5e-6) and kernel.dram_bytes == 30


# ---- empty and malformed -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "==PROF== No kernels were profiled.\n",
        '"ID","Kernel Name","gpu__time_duration.sum"\n',
        '"ID","Kernel Name","gpu__time_duration.sum"\n"","","us"\n',
    ],
)
def test_nothing_profiled_gives_an_empty_list(tmp_path: Path, text: str) -> None:
    path = tmp_path / "raw.csv"
    path.write_text(text)
    assert read_ncu_raw_csv(path) == []


def test_missing_units_row_is_a_user_error() -> None:
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","1.0"\n"1","k","2.0"\n'
    with pytest.raises(UserError, match="no units row"):
        parse_ncu_raw_csv(text)


@pytest.mark.parametrize("text", ["Time (%),Total Time (ns),Name\n1.0,2,k\n", "garbage"])
def test_not_an_ncu_export_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match="not an ncu raw-page CSV"):
        parse_ncu_raw_csv(text)


def test_console_errors_only_is_a_user_error() -> None:
    with pytest.raises(UserError, match="ERR_NVGPUCTRPERM"):
        parse_ncu_raw_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")


def test_missing_duration_or_bytes_is_a_user_error() -> None:
    no_time = raw_csv([("ID", ""), ("Kernel Name", ""), ("dram__bytes_read.sum", "byte")], [["0", "k", "1"]])
    with pytest.raises(UserError, match=r"gpu__time_duration\.sum"):
        parse_ncu_raw_csv(no_time)
    no_bytes = raw_csv([("ID", ""), ("Kernel Name", ""), ("gpu__time_duration.sum", "us")], [["0", "k", "1"]])
    with pytest.raises(UserError, match="DRAM byte"):
        parse_ncu_raw_csv(no_bytes)
    short = raw_csv([("ID", ""), ("Kernel Name", ""), ("gpu__time_duration.sum", "us")], [["0", "k"]])
    with pytest.raises(UserError, match="has 2 fields"):
        parse_ncu_raw_csv(short)


# ---- helpers -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "scale"),
    [
        ("byte", 1),
        ("Kbyte", 1e3),
        ("Mbyte", 1e6),
        ("Gbyte", 1e9),
        ("KiB", 1.0),
        ("Kibyte", 1024.0),
        ("ns", 1e-9),
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1),
        ("usecond", 1e-6),
        ("Gbyte/s", 1e9),
        ("Tbyte/s", 1e12),
        ("Mbyte/second", 1e6),
        ("cycle/nsecond", 1e9),
        ("Kbyte/cycle", 1e3),
        ("Ghz", 1e9),
        ("inst", 1),
        ("Kinst", 1e3),
        ("%", 1),
        ("", 1),
        ("inst/cycle", 1),
        ("SM", 1),
        ("register/thread", 1),
    ],
)
def test_unit_scale(unit: str, scale: float) -> None:
    assert unit_scale(unit) == pytest.approx(scale)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234.5", 1234.5),
        ("3,670", 3670.0),
        (" 0.000000 ", 0.0),
        ("", None),
        ("n/a", None),
        ("(64, 1, 1)", None),
        ("nan", None),
    ],
)
def test_parse_number(text: str, value: float | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("sm", "mem", "bound"),
    [
        (80, 20, "compute"),
        (20, 80, "memory"),
        (60, 60, "compute"),  # a tie goes to compute
        (60, 10, "compute"),
        (59.9, 30, "compute-leaning"),
        (57, 53, "compute-leaning"),  # a GEMM at 57% of tensor peak is not latency-bound
        (30, 45, "memory-leaning"),
        (40, 40, "compute-leaning"),
        (39.9, 39.9, "latency"),
        (14, 0.04, "latency"),
        (None, 70, "memory"),
        (None, 50, "unknown"),  # a middling memory figure says nothing of the SM side
        (None, 10, "unknown"),
        (65, None, "compute"),
        (None, None, "unknown"),
    ],
)
def test_classify_bound(sm: float | None, mem: float | None, bound: str) -> None:
    assert classify_bound(sm, mem) == bound


@pytest.mark.parametrize(
    ("name", "base", "function"),
    [
        (
            "void at::native::elementwise_kernel<128, 4>(int, T3)",
            "at::native::elementwise_kernel",
            "elementwise_kernel",
        ),
        (
            "void at::native::<unnamed>::indexSelectSmallIndex<c10::BFloat16, long>(TensorInfo<T1, T3>, int)",
            "at::native::indexSelectSmallIndex",
            "indexSelectSmallIndex",
        ),
        (
            "void unnamed>::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, (int)-2>(int)",
            "indexSelectSmallIndex",
            "indexSelectSmallIndex",
        ),
        (
            "void <unnamed>::elementwise_kernel_with_index<int, arange_cuda_out(const c10::Scalar &)::[lambda() "
            "(instance 1)]>(T1, T2)",
            "elementwise_kernel_with_index",
            "elementwise_kernel_with_index",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, 4>(float *)",
            "softmax_warp_forward",
            "softmax_warp_forward",
        ),
        (
            "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
            "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
            "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
        ),
        (
            "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(T1::Params)",
            "cutlass::device_kernel",
            "device_kernel",
        ),
        ("reduce_kernel", "reduce_kernel", "reduce_kernel"),
    ],
)
def test_kernel_names(name: str, base: str, function: str) -> None:
    assert kernel_base_name(name) == base
    assert function_name(name) == function


def test_full_size_prefill_gemm_fixture_is_compute_bound_near_its_sm_throughput() -> None:
    """A real bf16 GEMM of the full-size model's prefill (H100): tensor-core FLOPs give the achieved rate."""
    kernels = read_ncu_raw_csv(FIXTURE.parent / "h100_full_prefill_gemm_raw.csv")
    gemm = next(k for k in kernels if k.name.startswith("nvjet_sm90"))
    assert gemm.launches == 8
    assert gemm.bound == "compute"
    assert gemm.achieved_tflops is not None and 400 < gemm.achieved_tflops < 989.4
    # The achieved fraction of the dense bf16 peak agrees with ncu's own SM throughput figure.
    assert gemm.sm_throughput_pct is not None
    assert abs(gemm.achieved_tflops / 989.4 * 100 - gemm.sm_throughput_pct) < 10
    assert gemm.arithmetic_intensity is not None and gemm.arithmetic_intensity > 100


def test_full_size_prefill_gemm_below_60_percent_is_compute_leaning_not_latency() -> None:
    """The GEMM's first four launches (a smaller prefill GEMM) keep the tensor pipe busy 58–59% of the time and
    memory 53–54%: under ncu's 60% line, yet compute-limited."""
    lines = (FIXTURE.parent / "h100_full_prefill_gemm_raw.csv").read_text().splitlines()
    rows = list(csv.reader(lines))
    header = rows[0]
    (gemm,) = parse_ncu_raw_csv("\n".join(lines[:6]))  # header, units, launches 1-4
    assert gemm.launches == 4
    tensor = [
        float(r[header.index("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed")]) for r in rows[2:6]
    ]
    assert all(58 < t < 60 for t in tensor)
    # the SM figure is the tensor pipe here (time-weighted over four launches of nearly equal length)
    assert gemm.sm_throughput_pct == pytest.approx(sum(tensor) / 4, rel=1e-4)
    assert gemm.dram_throughput_pct is not None and 53 < gemm.dram_throughput_pct < 54
    assert gemm.bound == "compute-leaning"


def test_nvtx_stack_of_the_real_export_and_of_both_range_kinds() -> None:
    table, rows = read_table(FIXTURE.read_text(), "fixture")
    assert [nvtx_stack(table, row, "llm_perf_opt") for row in rows] == [("decode", "decode/step")] * 6
    assert nvtx_stack(table, rows[0], "other") == ()
    start_stop = "Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
    text = raw_csv(
        [("ID", ""), (NVTX, ""), (start_stop, ""), ("Kernel Name", "")],
        [
            [
                "0",
                '640 "llm_perf_opt:a:b:none:none:RGB:0xff:REGISTERED:a:b"  '
                '"torch:aten::mm:none:none:RGB:0x0:REGISTERED:aten::mm"',
                '"7:llm_perf_opt:capture:none:none:RGB:0xff:REGISTERED:capture"',
                "k",
            ]
        ],
    )
    table, rows = read_table(text, "made up")
    assert nvtx_stack(table, rows[0], "llm_perf_opt") == ("a:b", "capture")  # a colon in a range name survives
    assert nvtx_stack(table, rows[0], "torch") == ("aten::mm",)
    assert read_table("", "empty")[1] == []  # nothing profiled: no rows

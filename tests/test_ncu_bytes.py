"""Nsight Compute's bytes pass: its raw CSV parsed per launch (units, NVTX stack of the toolkit's domain) and summed
per NVTX range, each launch counting for every range around it."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.nsight.ncu_bytes import BYTES_METRICS, bytes_by_range, parse_launch_bytes, read_launch_bytes

NCU = Path(__file__).parent / "fixtures" / "ncu"
PREFILL = NCU / "synthetic_bytes_prefill_raw.csv"
DECODE = NCU / "synthetic_bytes_decode_raw.csv"
MB = 1e6


def test_launches_of_the_prefill_pass_with_units_and_nvtx_stacks() -> None:
    launches = read_launch_bytes(PREFILL)
    assert len(launches) == 8
    first = launches[0]
    assert first.name == "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
    assert first.ranges == ("prefill", "vision/sam")
    assert first.dram_read_bytes == pytest.approx(8 * MB)  # Mbyte
    assert first.dram_write_bytes == pytest.approx(2 * MB)  # "2,000.000000" Kbyte
    assert first.duration_s == pytest.approx(100e-6)  # us
    assert launches[1].name == "cunn_SoftMaxForward" and "SoftMaxForwardEpilogue" in launches[1].full_name
    assert launches[2].name == "unrolled_elementwise_kernel" and "direct_copy_kernel_cuda" in launches[2].full_name
    assert launches[6].ranges == ("prefill",)  # torch's own range (another domain) is not a stage


def test_prefill_sums_per_range_nest_like_nsys() -> None:
    sums = bytes_by_range(read_launch_bytes(PREFILL))
    assert list(sums) == ["prefill", "vision/sam", "vision/encoder", "vision/projector"]
    sam, prefill = sums["vision/sam"], sums["prefill"]
    assert sam.kernels == 3
    assert sam.dram_read_bytes == pytest.approx(14 * MB) and sam.dram_write_bytes == pytest.approx(8 * MB)
    assert sam.dram_bytes == pytest.approx(22 * MB) and sam.duration_s == pytest.approx(170e-6)
    assert prefill.kernels == 8  # every kernel of the instance, vision included
    assert prefill.dram_bytes == pytest.approx(36 * MB) and prefill.duration_s == pytest.approx(300e-6)
    assert sums["vision/encoder"].dram_bytes == pytest.approx(5 * MB)
    assert sums["vision/projector"].dram_bytes == pytest.approx(1 * MB)
    # top kernels by DRAM bytes, one entry per function name with its launches
    top = prefill.top_kernels[0]
    assert (top.name, top.launches) == ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", 4)
    assert top.dram_bytes == pytest.approx((10 + 4 + 1 + 6) * MB)
    assert [k.name for k in sam.top_kernels] == [
        "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN",
        "cunn_SoftMaxForward",
        "unrolled_elementwise_kernel [direct_copy_kernel_cuda]",  # the functor keeps a copy apart from an add
    ]
    assert prefill.top_kernels[3].name == "vectorized_elementwise_kernel [CUDAFunctorOnSelf_add]"


def test_decode_step_pass_in_other_units() -> None:
    sums = bytes_by_range(read_launch_bytes(DECODE))
    assert list(sums) == ["decode", "decode/step"]
    step = sums["decode/step"]
    assert step.kernels == 4
    assert step.dram_read_bytes == pytest.approx(30 * MB)  # Gbyte
    assert step.dram_write_bytes == pytest.approx(1 * MB)  # byte, with thousands separators
    assert step.duration_s == pytest.approx(100e-6)  # msecond
    assert attrs.evolve(sums["decode"], stage="decode/step") == step


def test_nothing_profiled_gives_no_launches() -> None:
    assert parse_launch_bytes("==PROF== Disconnected from process 1\n") == []
    assert bytes_by_range([]) == {}


def test_an_export_without_the_byte_metrics_is_a_user_error() -> None:
    text = PREFILL.read_text().replace("dram__bytes_write.sum", "dram__bytes.sum")
    with pytest.raises(UserError, match=r"lacks dram__bytes_write\.sum") as err:
        parse_launch_bytes(text, source="raw.csv")
    assert ",".join(BYTES_METRICS) in err.value.fix


def test_a_launch_without_a_value_is_a_user_error() -> None:
    lines = DECODE.read_text().splitlines()
    lines[2] = lines[2].replace('"0.020000"', '"n/a"')
    with pytest.raises(UserError, match="launch 1 \\(nvjet_sm90"):
        parse_launch_bytes("\n".join(lines), source="raw.csv")


def test_other_domains_can_be_read() -> None:
    launches = parse_launch_bytes(PREFILL.read_text(), domain="torch")
    assert [x.ranges for x in launches if x.ranges] == [("aten::add",)]

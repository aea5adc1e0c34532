"""Argument lists for nsys/ncu (exact), NVTX filters, kernel regexes and the steady-state launch skip."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llm_perf_opt.nsight import commands

NSYS = Path("/opt/nsys/bin/nsys")
NCU = Path("/opt/ncu/ncu")
WORKLOAD = ["python", "-m", "llm_perf_opt.cli.stage1", "model=deepseek_ocr2_tiny"]


def test_nsys_profile_argv_defaults() -> None:
    argv = commands.nsys_profile_argv(NSYS, Path("/run/nsys/report"), WORKLOAD)
    assert argv == [
        "/opt/nsys/bin/nsys",
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--sample=none",
        "--cpuctxsw=none",
        "--cuda-graph-trace=node",
        "--force-overwrite=true",
        "-o",
        "/run/nsys/report",
        *WORKLOAD,
    ]


def test_nsys_profile_argv_capture_range_is_range_at_domain() -> None:
    argv = commands.nsys_profile_argv(
        NSYS,
        Path("out"),
        ["w"],
        trace=["cuda", "nvtx"],
        sample="cpu",
        cpuctxsw="process-tree",
        cuda_graph_trace=None,
        capture_range="decode",
        extra=["--stats=false"],
    )
    assert argv == [
        "/opt/nsys/bin/nsys",
        "profile",
        "--trace=cuda,nvtx",
        "--sample=cpu",
        "--cpuctxsw=process-tree",
        "--capture-range=nvtx",
        "--nvtx-capture=decode@llm_perf_opt",
        "--capture-range-end=stop",
        "--stats=false",
        "--force-overwrite=true",
        "-o",
        "out",
        "w",
    ]
    custom = commands.nsys_profile_argv(NSYS, Path("out"), ["w"], capture_range="prefill", domain="other")
    assert "--nvtx-capture=prefill@other" in custom
    given = commands.nsys_profile_argv(NSYS, Path("out"), ["w"], capture_range="step@*")
    assert "--nvtx-capture=step@*" in given


def test_nsys_stats_export_help_argv() -> None:
    rep, base = Path("/r/report.nsys-rep"), Path("/r/stats/report")
    assert commands.nsys_stats_argv(NSYS, rep, ["cuda_gpu_kern_sum", "nvtx_sum"], base) == [
        "/opt/nsys/bin/nsys",
        "stats",
        "--report",
        "cuda_gpu_kern_sum,nvtx_sum",
        "--format",
        "csv",
        "--output",
        "/r/stats/report",
        "--force-export=true",
        "--force-overwrite=true",
        "/r/report.nsys-rep",
    ]
    with pytest.raises(ValueError):
        commands.nsys_stats_argv(NSYS, rep, [], base)
    # from the SQLite export, read as it is (nothing exported again: it runs beside other readers of the file)
    from_export = commands.nsys_stats_argv(NSYS, Path("/r/report.sqlite"), ["nvtx_sum"], base)
    assert "--force-export=true" not in from_export and from_export[-1] == "/r/report.sqlite"
    assert commands.nsys_export_sqlite_argv(NSYS, rep, Path("/r/report.sqlite")) == [
        "/opt/nsys/bin/nsys",
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        "--output",
        "/r/report.sqlite",
        "/r/report.nsys-rep",
    ]
    assert commands.nsys_help_reports_argv(NSYS) == ["/opt/nsys/bin/nsys", "stats", "--help-reports"]


def test_ncu_argv_full() -> None:
    argv = commands.ncu_argv(
        NCU,
        Path("/run/ncu/decode/report"),
        WORKLOAD,
        kernel_regex="^(gemv|reduce_kernel)$",
        launch_skip=14,
        launch_count=3,
        nvtx_include=["decode"],
        sections=["SpeedOfLight", "SpeedOfLight_RooflineChart"],
        metrics=["gpu__time_duration.sum", "dram__bytes_read.sum"],
        cache_control="all",
        extra=["--replay-mode", "kernel"],
    )
    assert argv == [
        "/opt/ncu/ncu",
        "--target-processes",
        "all",
        "--clock-control",
        "none",
        "--cache-control",
        "all",
        "--kernel-name-base",
        "function",
        "-k",
        "regex:^(gemv|reduce_kernel)$",
        "--launch-skip",
        "14",
        "--launch-count",
        "3",
        "--nvtx",
        "--nvtx-include",
        "llm_perf_opt@decode/",
        "--section",
        "SpeedOfLight",
        "--section",
        "SpeedOfLight_RooflineChart",
        "--metrics",
        "gpu__time_duration.sum,dram__bytes_read.sum",
        "--replay-mode",
        "kernel",
        "-f",
        "-o",
        "/run/ncu/decode/report",
        *WORKLOAD,
    ]


def test_ncu_argv_minimal_has_no_filters() -> None:
    argv = commands.ncu_argv(
        NCU,
        Path("o"),
        ["w"],
        kernel_regex=None,
        launch_skip=0,
        launch_count=1,
        clock_control="base",
        target_processes="application-only",
    )
    assert argv == [
        "/opt/ncu/ncu",
        "--target-processes",
        "application-only",
        "--clock-control",
        "base",
        "--launch-skip",
        "0",
        "--launch-count",
        "1",
        "-f",
        "-o",
        "o",
        "w",
    ]


@pytest.mark.parametrize(("skip", "count"), [(-1, 1), (0, 0)])
def test_ncu_argv_rejects_unbounded_or_negative(skip: int, count: int) -> None:
    with pytest.raises(ValueError):
        commands.ncu_argv(NCU, Path("o"), ["w"], kernel_regex=None, launch_skip=skip, launch_count=count)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("decode", "llm_perf_opt@decode/"),
        ("decode/", "llm_perf_opt@decode/"),
        ("prefill/vision", "llm_perf_opt@prefill/vision/"),
        ("other@step", "other@step/"),
        ("other@step/", "other@step/"),
    ],
)
def test_nvtx_include_gets_domain_and_trailing_slash(given: str, expected: str) -> None:
    assert commands.nvtx_include_spec(given) == expected
    argv = commands.ncu_argv(
        NCU, Path("o"), ["w"], kernel_regex=None, launch_skip=0, launch_count=1, nvtx_include=[given]
    )
    assert argv[argv.index("--nvtx-include") + 1] == expected


def test_nvtx_include_custom_domain_and_empty() -> None:
    assert commands.nvtx_include_spec("decode", domain="app") == "app@decode/"
    with pytest.raises(ValueError):
        commands.nvtx_include_spec("  ")


def test_kernel_regex_function_base_reduces_and_escapes() -> None:
    names = [
        "void at::native::elementwise_kernel<128, 4>(int, T3)",
        "void at::native::elementwise_kernel<(int)128, (int)4, at::native::MulFunctor<float>>(int, T3)",
        "void at::native::<unnamed>::indexSelectSmallIndex<c10::BFloat16, long>(at::cuda::TensorInfo<T1, T3>)",
        "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(T1::Params)",
    ]
    regex = commands.kernel_regex_for(names)
    assert regex == "^(elementwise_kernel|indexSelectSmallIndex|nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN|device_kernel)$"
    for hit in ("elementwise_kernel", "device_kernel"):
        assert re.match(regex, hit)
    assert not re.match(regex, "vectorized_elementwise_kernel")


def test_kernel_regex_demangled_escapes_full_names() -> None:
    name = "void at::native::elementwise_kernel<128, 4>"
    regex = commands.kernel_regex_for([name, "a.b(c)"], base="demangled")
    assert regex == "^(" + re.escape(name) + "|" + re.escape("a.b(c)") + ")$"
    assert re.match(regex, name)
    assert not re.match(regex, "void at::native::elementwise_kernel<128, 4>(int)")
    assert re.match(regex, "a.b(c)") and not re.match(regex, "aXb(c)")
    with pytest.raises(ValueError):
        commands.kernel_regex_for([])
    with pytest.raises(ValueError):
        commands.kernel_regex_for(["x"], base="short")


def test_ncu_import_raw_csv_argv() -> None:
    assert commands.ncu_import_raw_csv_argv(NCU, Path("/r/report.ncu-rep")) == [
        "/opt/ncu/ncu",
        "--import",
        "/r/report.ncu-rep",
        "--csv",
        "--page",
        "raw",
    ]


def test_shell_line_quotes_for_copy_paste() -> None:
    argv = commands.ncu_argv(
        NCU,
        Path("/run dir/report"),
        ["python", "-c", "print('hi')"],
        kernel_regex="^(a|b)$",
        launch_skip=0,
        launch_count=1,
    )
    line = commands.shell_line(argv)
    assert shlex.split(line) == argv
    assert "'regex:^(a|b)$'" in line


def test_ncu_bytes_argv_profiles_every_kernel_of_the_profiler_window_without_flushing_caches() -> None:
    argv = commands.ncu_bytes_argv(NCU, Path("/run/ncu/bytes/report"), WORKLOAD)
    assert argv == [
        "/opt/ncu/ncu",
        "--target-processes",
        "all",
        "--clock-control",
        "none",
        "--cache-control",
        "none",
        "--profile-from-start",
        "off",
        "--nvtx",
        "--metrics",
        "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
        "--replay-mode",
        "kernel",
        "-f",
        "-o",
        "/run/ncu/bytes/report",
        *WORKLOAD,
    ]
    # every kernel of the window (no filter, no count), no section (one counter pass), NVTX kept to tell stages apart
    assert "-k" not in argv and "--section" not in argv and "--launch-count" not in argv


def test_ncu_bytes_argv_passes_its_settings_on() -> None:
    argv = commands.ncu_bytes_argv(
        NCU, Path("o"), ["w"], clock_control="base", target_processes="application-only", cache_control="all"
    )
    assert argv[1:7] == ["--target-processes", "application-only", "--clock-control", "base", "--cache-control", "all"]


def test_a_targets_round_takes_each_launch_configuration_in_the_window() -> None:
    argv = commands.ncu_argv(
        NCU,
        Path("o"),
        ["w"],
        kernel_regex="^(a|b)$",
        launch_skip=0,
        launch_count=1,
        filter_mode="per-launch-config",
        nvtx=True,
        profile_from_start=False,
        sections=["SpeedOfLight"],
    )
    line = " ".join(argv)
    assert "--profile-from-start off" in line and "--filter-mode per-launch-config" in line
    assert "--launch-skip 0 --launch-count 1 --nvtx --section SpeedOfLight" in line and "--nvtx-include" not in line
    with pytest.raises(ValueError, match="launch_count"):
        commands.ncu_argv(NCU, Path("o"), ["w"], kernel_regex=None, launch_skip=0, launch_count=0)

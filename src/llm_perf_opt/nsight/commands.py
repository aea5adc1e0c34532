"""Argument lists for nsys and ncu (never shell strings), and the launch arithmetic around them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.nsight.ncu_bytes import BYTES_METRICS
from llm_perf_opt.nsight.ncu_report import function_name
from llm_perf_opt.records.vocabulary import NVTX_DOMAIN


def shell_line(argv: Sequence[str | Path]) -> str:
    """`argv` as one copy-pasteable shell line (for cmd.txt files)."""
    return shlex.join(str(a) for a in argv)


# ---- Nsight Systems ---------------------------------------------------------------------------------------


def nsys_profile_argv(
    nsys: Path,
    output_base: Path,
    workload: Sequence[str],
    *,
    trace: Sequence[str] = ("cuda", "nvtx", "osrt"),
    sample: str = "none",
    cpuctxsw: str = "none",
    cuda_graph_trace: str | None = "node",
    capture_range: str | None = None,
    gpu_metrics_hz: int | None = None,
    gpu_metrics_devices: str = "all",
    domain: str = NVTX_DOMAIN,
    extra: Sequence[str] = (),
) -> list[str]:
    """`nsys profile ... -o <output_base> <workload>`; nsys adds `.nsys-rep` to `output_base`. `capture_range` names
    an NVTX push/pop range (e.g. "decode"): collection starts when it opens and stops when it closes; nsys spells the
    trigger `range@domain` (the reverse of ncu's `domain@range`). `gpu_metrics_hz`: sample the GPU metrics (DRAM
    throughput among them) of `gpu_metrics_devices` that often (nsys takes 10 to 200,000)."""
    if gpu_metrics_hz is not None and not 10 <= gpu_metrics_hz <= 200_000:
        raise ValueError(f"gpu_metrics_hz must be within 10 and 200000 (nsys's range), got {gpu_metrics_hz}")
    argv = [str(nsys), "profile", f"--trace={','.join(trace)}", f"--sample={sample}", f"--cpuctxsw={cpuctxsw}"]
    if cuda_graph_trace:
        argv.append(f"--cuda-graph-trace={cuda_graph_trace}")
    if gpu_metrics_hz is not None:
        argv += [f"--gpu-metrics-devices={gpu_metrics_devices}", f"--gpu-metrics-frequency={gpu_metrics_hz}"]
    if capture_range:
        trigger = capture_range if "@" in capture_range else f"{capture_range}@{domain}"
        argv += ["--capture-range=nvtx", f"--nvtx-capture={trigger}", "--capture-range-end=stop"]
    return [*argv, *map(str, extra), "--force-overwrite=true", "-o", str(output_base), *map(str, workload)]


def nsys_stats_argv(nsys: Path, report_path: Path, reports: Sequence[str], output_base: Path) -> list[str]:
    """`nsys stats` writing one `<output_base>_<report>.csv` per report. `report_path`: a `.nsys-rep` (exported to
    SQLite again first) or its SQLite export, read as it is (so the stats can run beside other readers of it)."""
    if not reports:
        raise ValueError("nsys stats needs at least one report name")
    export = [] if Path(report_path).suffix == ".sqlite" else ["--force-export=true"]
    argv = [str(nsys), "stats", "--report", ",".join(reports), "--format", "csv", "--output", str(output_base)]
    return [*argv, *export, "--force-overwrite=true", str(report_path)]


def nsys_export_sqlite_argv(nsys: Path, report_path: Path, sqlite_path: Path) -> list[str]:
    """`nsys export --type sqlite` of a report into `sqlite_path`."""
    argv = [str(nsys), "export", "--type=sqlite", "--force-overwrite=true"]
    return [*argv, "--output", str(sqlite_path), str(report_path)]


def nsys_help_reports_argv(nsys: Path) -> list[str]:
    """`nsys stats --help-reports`: the report names this nsys version knows (names change between versions)."""
    return [str(nsys), "stats", "--help-reports"]


# ---- Nsight Compute -------------------------------------------------------------------------------------


def nvtx_include_spec(range_name: str, domain: str = NVTX_DOMAIN) -> str:
    """An ncu `--nvtx-include` filter for a push/pop range: `domain@range/` (push/pop needs the trailing slash).
    ncu reads `/` as nesting (`outer/inner/`): a range whose own name has a slash cannot be matched literally; filter
    on its outermost range instead."""
    spec = range_name.strip()
    if not spec:
        raise ValueError("empty NVTX range name")
    if "@" not in spec:
        spec = f"{domain}@{spec}"
    return spec if spec.endswith("/") else spec + "/"


def ncu_argv(
    ncu: Path,
    output_base: Path,
    workload: Sequence[str],
    *,
    kernel_regex: str | None,
    launch_skip: int,
    launch_count: int | None,
    nvtx_include: Sequence[str] = (),
    nvtx: bool = False,
    profile_from_start: bool = True,
    filter_mode: str | None = None,
    sections: Sequence[str] = (),
    metrics: Sequence[str] = (),
    clock_control: str = "none",
    target_processes: str = "all",
    cache_control: str | None = None,
    kernel_name_base: str = "function",
    domain: str = NVTX_DOMAIN,
    extra: Sequence[str] = (),
) -> list[str]:
    """`ncu ... -f -o <output_base> <workload>`; ncu adds `.ncu-rep`. `kernel_regex` is matched against the name form
    `kernel_name_base` selects: "function" (ncu's default, the bare function name such as `elementwise_kernel`) or
    "demangled" (ncu's demangled name, which differs in detail from nsys's). Launch skip/count apply to launches that
    pass the kernel and NVTX filters (`filter_mode` "per-launch-config": to each launch configuration's launches apart);
    `launch_count` None profiles every one, for a window the workload bounds itself. `nvtx` records the NVTX ranges of
    each launch without filtering on them; `profile_from_start` False profiles only between the workload's
    cudaProfilerStart and Stop."""
    if launch_skip < 0:
        raise ValueError(f"launch_skip must be >= 0, got {launch_skip}")
    if launch_count is not None and launch_count < 1:
        raise ValueError(f"launch_count must be >= 1 (bound the replayed work), got {launch_count}")
    argv = [str(ncu), "--target-processes", target_processes, "--clock-control", clock_control]
    if cache_control:
        argv += ["--cache-control", cache_control]
    if not profile_from_start:
        argv += ["--profile-from-start", "off"]
    if kernel_regex:
        argv += ["--kernel-name-base", kernel_name_base, "-k", f"regex:{kernel_regex}"]
    if filter_mode:
        argv += ["--filter-mode", filter_mode]
    if launch_skip or launch_count is not None:
        argv += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        argv += ["--launch-count", str(launch_count)]
    if nvtx or nvtx_include:
        argv.append("--nvtx")
        for name in nvtx_include:
            argv += ["--nvtx-include", nvtx_include_spec(name, domain)]
    for section in sections:
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    return [*argv, *map(str, extra), "-f", "-o", str(output_base), *map(str, workload)]


def ncu_bytes_argv(
    ncu: Path,
    output_base: Path,
    workload: Sequence[str],
    *,
    clock_control: str = "none",
    target_processes: str = "all",
    cache_control: str = "none",
) -> list[str]:
    """The bytes pass: EVERY kernel inside the workload's CUDA profiler window (`run.profiler_window`: its first prefill
    and middle decode step; no kernel filter, no launch count), with only duration and DRAM read/write bytes (one
    counter pass, no sections) and each launch's NVTX ranges, which tell the stages apart. `cache_control` "none" leaves
    L1/L2 as the previous kernel left them, so a kernel's DRAM bytes are those of the real kernel sequence; ncu's
    default "all" flushes the caches before each kernel, which sends every input to DRAM again and overstates the
    traffic of kernels whose inputs the previous kernel left in L2."""
    return ncu_argv(
        ncu,
        output_base,
        workload,
        kernel_regex=None,
        launch_skip=0,
        launch_count=None,
        nvtx=True,
        profile_from_start=False,
        metrics=BYTES_METRICS,
        clock_control=clock_control,
        target_processes=target_processes,
        cache_control=cache_control,
        extra=("--replay-mode", "kernel"),
    )


def kernel_regex_for(names: Sequence[str], *, base: str = "function") -> str:
    """An anchored ncu kernel regex `^(a|b)$` matching exactly these kernels. base="function" (ncu's default
    `--kernel-name-base`) reduces each name to its bare function name first (`void at::native::elementwise_kernel<128,
    4>(int, T3)` -> `elementwise_kernel`): the only form nsys and ncu spell alike; "demangled" takes them as given."""
    if base not in ("function", "demangled", "mangled"):
        raise ValueError(f"unknown kernel name base {base!r}")
    reduced = [function_name(n) if base == "function" else n.strip() for n in names]
    unique = list(dict.fromkeys(n for n in reduced if n))
    if not unique:
        raise ValueError("kernel_regex_for needs at least one kernel name")
    return "^(" + "|".join(re.escape(n) for n in unique) + ")$"


def ncu_import_raw_csv_argv(ncu: Path, report_path: Path) -> list[str]:
    """`ncu --import <rep> --csv --page raw`: every metric of every profiled launch, with a units row."""
    return [str(ncu), "--import", str(report_path), "--csv", "--page", "raw"]

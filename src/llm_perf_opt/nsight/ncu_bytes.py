"""Nsight Compute's bytes pass: every kernel of one stage instance with its duration and DRAM bytes, summed per
NVTX range.

The export (`ncu --import <rep> --csv --page raw`) has one row per profiled launch with an NVTX column holding the
push/pop ranges open around it (`"llm_perf_opt:prefill:..."  "llm_perf_opt:vision/sam:..."`). A launch counts for
every range of the toolkit's domain on that stack, the rule nsys's NVTX attribution follows: a vision/sam kernel
adds to vision/sam and to prefill, a decode/step kernel to decode/step and to decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.kernel_names import kernel_label
from llm_perf_opt.nsight.ncu_report import (
    DRAM_READ,
    DRAM_WRITE,
    DURATION,
    check_width,
    function_name,
    launch_name,
    nvtx_stack,
    read_table,
)
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage2 import KernelBytes, RangeBytes

#: The metrics of the bytes pass, and all it needs: one counter pass, so ncu replays nothing.
BYTES_METRICS = (DURATION, DRAM_READ, DRAM_WRITE)
TOP_KERNELS = 5  # per range: the kernel functions that moved the most DRAM bytes


@attrs.frozen
class LaunchBytes:
    """One profiled launch: its bare function name, NVTX ranges (outermost first), duration and DRAM bytes."""

    name: str
    full_name: str  # ncu's name, template arguments included (`elementwise_kernel<direct_copy_kernel_cuda...>`)
    ranges: tuple[str, ...]
    duration_s: float
    dram_read_bytes: float
    dram_write_bytes: float


def parse_launch_bytes(text: str, source: str = "ncu raw CSV", domain: str = vocab.NVTX_DOMAIN) -> list[LaunchBytes]:
    """Every launch of a bytes-pass export, in profiling order ([] when nothing was profiled)."""
    table, rows = read_table(text, source)
    missing = [m for m in BYTES_METRICS if m not in table.index]
    if rows and missing:
        raise UserError(
            f"{source} lacks {', '.join(missing)}: not an export of the bytes pass",
            f"Profile with `--metrics {','.join(BYTES_METRICS)}` and export with `ncu --import <rep> --csv --page raw`",
        )
    out = []
    for number, row in enumerate(rows, start=1):
        check_width(table, row, number, source)
        values = [table.value(row, m) for m in BYTES_METRICS]
        full = launch_name(table, row)
        if any(v is None for v in values):
            raise UserError(
                f"{source}: launch {number} ({function_name(full)}) has no value for one of {', '.join(BYTES_METRICS)}",
                "Export the report again; if the values are missing in ncu's own view, profile again",
            )
        duration, read, write = (float(v or 0.0) for v in values)
        out.append(
            LaunchBytes(
                name=function_name(full),
                full_name=full,
                ranges=nvtx_stack(table, row, domain),
                duration_s=duration,
                dram_read_bytes=read,
                dram_write_bytes=write,
            )
        )
    return out


def read_launch_bytes(path: Path, domain: str = vocab.NVTX_DOMAIN) -> list[LaunchBytes]:
    """The launches of the bytes-pass export saved at `path` (see :func:`parse_launch_bytes`)."""
    path = Path(path)
    return parse_launch_bytes(path.read_text(encoding="utf-8", errors="replace"), source=str(path), domain=domain)


def _top_kernels(launches: Sequence[LaunchBytes]) -> tuple[KernelBytes, ...]:
    """The kernels that moved the most DRAM bytes, by function name and the functor it applies (so a copy and an
    add through `elementwise_kernel` stay apart)."""
    by_name: dict[str, tuple[int, float]] = {}
    for launch in launches:
        label = kernel_label(launch.name, launch.full_name)
        count, moved = by_name.get(label, (0, 0.0))
        by_name[label] = (count + 1, moved + launch.dram_read_bytes + launch.dram_write_bytes)
    ranked = sorted(by_name.items(), key=lambda item: (-item[1][1], item[0]))
    return tuple(KernelBytes(name=n, launches=c, dram_bytes=b) for n, (c, b) in ranked[:TOP_KERNELS])


def bytes_by_range(launches: Sequence[LaunchBytes]) -> dict[str, RangeBytes]:
    """Per NVTX range (in the order ranges first appear): launches, summed duration and DRAM bytes, top kernels."""
    members: dict[str, list[LaunchBytes]] = {}
    for launch in launches:
        for name in dict.fromkeys(launch.ranges):  # a range open twice on one stack counts the launch once
            members.setdefault(name, []).append(launch)
    return {
        name: RangeBytes(
            stage=name,
            kernels=len(group),
            duration_s=sum(x.duration_s for x in group),
            dram_read_bytes=sum(x.dram_read_bytes for x in group),
            dram_write_bytes=sum(x.dram_write_bytes for x in group),
            top_kernels=_top_kernels(group),
        )
        for name, group in members.items()
    }

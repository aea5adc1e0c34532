"""`nsys stats` output: CSV reports as rows of typed values, and report names the installed nsys knows.

nsys renamed its reports in 2023 (`gpukernsum` became `cuda_gpu_kern_sum`, ...) and added some later
(`nvtx_gpu_proj_sum`); :func:`available_reports` reads what `nsys stats --help-reports` lists and
:func:`pick_reports` takes, for each wanted report, the first name of its fallback chain that is there.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)

# Fallbacks, best first: the pre-2023 names of the same report, or a report that answers part of the question.
REPORT_ALTERNATIVES: Mapping[str, tuple[str, ...]] = {
    "cuda_api_gpu_sum": ("apigpusum",),
    "cuda_api_sum": ("cudaapisum",),
    "cuda_api_trace": ("cudaapitrace",),
    "cuda_gpu_kern_sum": ("gpukernsum",),
    "cuda_gpu_mem_size_sum": ("gpumemsizesum",),
    "cuda_gpu_mem_time_sum": ("gpumemtimesum",),
    "cuda_gpu_sum": ("gpusum",),
    "cuda_gpu_trace": ("gputrace",),
    "cuda_kern_exec_sum": ("kernexecsum",),
    "cuda_kern_exec_trace": ("kernexectrace",),
    "nvtx_gpu_proj_sum": ("nvtx_kern_sum", "nvtxkernsum"),
    "nvtx_kern_sum": ("nvtxkernsum",),
    "nvtx_sum": ("nvtxsum", "nvtx_pushpop_sum", "nvtxppsum"),
    "nvtx_pushpop_sum": ("nvtxppsum",),
    "nvtx_pushpop_trace": ("nvtxpptrace",),
    "nvtx_startend_sum": ("nvtxsesum",),
    "osrt_sum": ("osrtsum",),
    "um_cpu_page_faults_sum": ("umcpupagefaults",),
    "um_sum": ("unifiedmemory",),
    "um_total_sum": ("unifiedmemorytotals",),
}

# `  cuda_gpu_kern_sum[:nvtx-name][:base|:mangled] -- CUDA GPU Kernel Summary`
_REPORT_LINE = re.compile(r"^\s*([A-Za-z][\w-]*)((?:\[[^\]]*\])*)\s+--\s")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
# Lines nsys prints around a report when it writes to the console rather than to --output files.
_PREAMBLE = ("Processing [", "Generating ", "** ", "SKIPPED:", "NOTICE:", "WARNING:", "ERROR:")


def read_stats_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of one `nsys stats --format csv` report file (see :func:`parse_stats_csv`)."""
    return parse_stats_csv(Path(path).read_text(encoding="utf-8-sig", errors="replace"))


def parse_stats_csv(text: str) -> list[dict[str, Any]]:
    """Rows of one CSV report as dicts keyed by the column names as printed. A column whose non-empty cells are all
    numbers becomes int (all integers) or float, its empty cells None; other columns stay strings. Console noise before
    the header ("Processing [...]", "** ... (report):", "SKIPPED: ... does not contain ...") is skipped; a report with
    no table gives []. Reading stops at the first blank line after the table (console output of several reports holds
    one per block)."""
    lines = text.splitlines()
    begin = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith(_PREAMBLE)), None)
    if begin is None:
        return []
    end = next((i for i in range(begin, len(lines)) if not lines[i].strip()), len(lines))
    header, *body = csv.reader(io.StringIO("\n".join(lines[begin:end])))  # lines[begin] is not blank: a header
    columns = [_column([row[i] if i < len(row) else "" for row in body]) for i in range(len(header))]
    return [{name: columns[i][r] for i, name in enumerate(header)} for r in range(len(body))]


def _column(cells: list[str]) -> list[Any]:
    """The cells of one column, as ints or floats when every non-empty one is such a number."""
    filled = [c.strip() for c in cells if c.strip()]
    if filled and all(_INT.fullmatch(c) for c in filled):
        return [int(c) if c.strip() else None for c in cells]
    if filled and all(_FLOAT.fullmatch(c) for c in filled):
        return [float(c) if c.strip() else None for c in cells]
    return list(cells)


def available_reports(help_text: str) -> set[str]:
    """Report names listed by `nsys stats --help-reports`, without their `[:option]` suffixes."""
    return {m.group(1) for line in help_text.splitlines() if (m := _REPORT_LINE.match(line))}


class ReportPick(list[str]):
    """The report names to run, in wanted order (a plain list to callers that want only that). `missing`: the wanted
    reports for which neither they nor an alternative are available; `substituted`: wanted report -> the alternative
    that stands in for it."""

    def __init__(
        self, names: Iterable[str] = (), missing: Sequence[str] = (), substituted: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(names)
        self.missing: tuple[str, ...] = tuple(missing)
        self.substituted: dict[str, str] = dict(substituted or {})


def pick_reports(
    available: Iterable[str], wanted: Sequence[str], alternatives: Mapping[str, Sequence[str]] = REPORT_ALTERNATIVES
) -> ReportPick:
    """For each wanted report, the first of it and its alternatives that nsys lists; each name once. A wanted name may
    carry options (`cuda_gpu_kern_sum:base`): the base name is looked up and the options go with whichever name is
    chosen. Reports with no available name are left out, listed in `.missing` and logged."""
    names = set(available)
    chosen: list[str] = []
    missing: list[str] = []
    substituted: dict[str, str] = {}
    for want in wanted:
        base, sep, options = want.partition(":")
        pick = next((c for c in (base, *alternatives.get(base, ())) if c in names), None)
        if pick is None:
            missing.append(want)
            continue
        if pick != base:
            substituted[want] = pick
        full = f"{pick}{sep}{options}"
        if full not in chosen:
            chosen.append(full)
    if missing:
        _log.warning("nsys stats offers no report for %s (nor any alternative)", ", ".join(missing))
    return ReportPick(chosen, missing, substituted)

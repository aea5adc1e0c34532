"""nsys stats CSV parsing and report-name probing, on the CSVs and `--help-reports` text of nsys 2025.3.1."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import pytest

from llm_perf_opt.nsight.nsys_stats import (
    REPORT_ALTERNATIVES,
    available_reports,
    parse_stats_csv,
    pick_reports,
    read_stats_csv,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nsys"
HELP = (FIXTURES / "nsys_2025.3.1_help_reports.txt").read_text()
STAGE2_REPORTS = ["cuda_gpu_kern_sum", "nvtx_sum", "nvtx_gpu_proj_sum", "nvtx_kern_sum", "cuda_api_sum",
                  "cuda_gpu_mem_time_sum"]  # fmt: skip
# `nsys stats --help-reports` of a 2022 nsys, before the reports were renamed.
OLD_HELP = """
The following built-in reports are available:

  apigpusum[:base|:mangled] -- CUDA Summary (API/Kernels/MemOps)
  cudaapisum       -- CUDA API Summary
  gpukernsum[:base|:mangled] -- CUDA GPU Kernel Summary
  gpumemtimesum    -- GPU Memory Operations Summary (by Time)
  nvtxkernsum[:base|:mangled] -- NVTX Range Kernel Summary
  nvtxppsum        -- NVTX Push/Pop Range Summary
  nvtxsum          -- NVTX Range Summary

For more information, use '--help-reports <report_name>'
"""


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("h100_*.csv")), ids=lambda p: p.stem)
def test_every_fixture_csv_keeps_its_columns_and_rows(path: Path) -> None:
    with path.open(newline="") as handle:
        header, *body = list(csv.reader(handle))
    rows = read_stats_csv(path)
    assert len(rows) == len(body) > 0
    assert all(list(row) == header for row in rows)


def test_numeric_columns_become_numbers() -> None:
    rows = read_stats_csv(FIXTURES / "h100_tiny_cuda_gpu_kern_sum.csv")
    first = rows[0]
    assert first["Total Time (ns)"] == 1371420 and isinstance(first["Total Time (ns)"], int)
    assert first["Instances"] == 93 and isinstance(first["Instances"], int)
    assert first["Avg (ns)"] == pytest.approx(14746.5) and isinstance(first["Avg (ns)"], float)
    assert isinstance(first["Med (ns)"], float)  # "2976.0" in the file
    assert first["Name"].startswith("void at::native::elementwise_kernel<(int)128")
    assert sum(r["Time (%)"] for r in rows) == pytest.approx(100, abs=0.5)


def test_text_columns_stay_text_and_ids_become_ints() -> None:
    rows = read_stats_csv(FIXTURES / "h100_tiny_nvtx_kern_sum.csv")
    outside = [r for r in rows if r["NVTX Range"] == ""]
    assert outside and all(r["Style"] == "" for r in outside)  # kernels launched outside every range
    assert {(r["PID"], r["TID"]) for r in rows} == {(506, 506)}
    assert sum(r["Kern Inst"] for r in rows if r["NVTX Range"] == "llm_perf_opt:decode/step") == 1302


def test_console_output_and_empty_cells() -> None:
    table = "Range,Total Time (ns),StdDev (ns),Instances\nllm_perf_opt:prefill,100,nan,2\nllm_perf_opt:decode,50,,1\n"
    console = (
        "Generating SQLite file report.sqlite from report.nsys-rep\n"
        "Processing [report.sqlite] with [/opt/nvidia/nsys/reports/nvtx_sum.py]... \n\n"
        " ** NVTX Range Summary (nvtx_sum):\n\n" + table + "\n"
        "Processing [report.sqlite] with [/opt/nvidia/nsys/reports/osrt_sum.py]... \n"
        "SKIPPED: report.sqlite does not contain OS Runtime trace data.\n"
    )
    rows = parse_stats_csv(console)
    assert repr(rows) == repr(parse_stats_csv(table))  # nan != nan, so compare the printed rows
    assert [r["Range"] for r in rows] == ["llm_perf_opt:prefill", "llm_perf_opt:decode"]
    assert math.isnan(rows[0]["StdDev (ns)"])
    assert rows[1]["StdDev (ns)"] is None
    assert rows[1]["Instances"] == 1


def test_skipped_or_empty_report_has_no_rows(tmp_path: Path) -> None:
    skipped = tmp_path / "report_osrt_sum.csv"
    skipped.write_text("SKIPPED: report.sqlite does not contain OS Runtime trace data.\n")
    assert read_stats_csv(skipped) == []
    assert parse_stats_csv("") == []
    assert parse_stats_csv("Time (%),Name\n") == []


def test_available_reports_of_nsys_2025() -> None:
    names = available_reports(HELP)
    assert len(names) == 40
    assert set(STAGE2_REPORTS) <= names
    assert {"cuda_gpu_kern_gb_sum", "um_sum", "network_congestion", "nvtx_pushpop_trace"} <= names
    assert not any(c in name for name in names for c in "[]: ")
    assert not {"The", "For"} & names


def test_available_reports_of_an_old_nsys() -> None:
    assert available_reports(OLD_HELP) == {
        "apigpusum", "cudaapisum", "gpukernsum", "gpumemtimesum", "nvtxkernsum", "nvtxppsum", "nvtxsum"
    }  # fmt: skip


def test_pick_reports_takes_current_names_when_present() -> None:
    picked = pick_reports(available_reports(HELP), STAGE2_REPORTS, REPORT_ALTERNATIVES)
    assert list(picked) == STAGE2_REPORTS
    assert picked.missing == ()
    assert picked.substituted == {}


def test_pick_reports_falls_back_on_an_old_nsys() -> None:
    picked = pick_reports(available_reports(OLD_HELP), ["cuda_gpu_kern_sum:base", *STAGE2_REPORTS[1:]])
    # nvtx_gpu_proj_sum and nvtx_kern_sum both land on nvtxkernsum, which runs once.
    assert list(picked) == ["gpukernsum:base", "nvtxsum", "nvtxkernsum", "cudaapisum", "gpumemtimesum"]
    assert picked.substituted["nvtx_gpu_proj_sum"] == "nvtxkernsum"
    assert picked.substituted["cuda_gpu_kern_sum:base"] == "gpukernsum"
    assert picked.missing == ()


def test_pick_reports_reports_what_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    alternatives = {"nvtx_gpu_proj_sum": ["nvtx_kern_sum"]}
    with caplog.at_level(logging.WARNING):
        picked = pick_reports(
            {"nvtx_kern_sum", "cuda_api_sum"}, ["nvtx_gpu_proj_sum", "cuda_gpu_kern_sum"], alternatives
        )
    assert list(picked) == ["nvtx_kern_sum"]
    assert picked.missing == ("cuda_gpu_kern_sum",)
    assert "cuda_gpu_kern_sum" in caplog.text

"""hardware.peaks: the setting is checked, a CPU run falls back to the datasheet, and a run with measured peaks
shows MFU/MBU against both denominators."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from helpers import run_main
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.stage1 import MeasuredPeaks
from llm_perf_opt.report.stage1_reports import report_md

H100 = Path(__file__).parent / "fixtures" / "metrics" / "h100_full_stage1.json"


def test_report_shows_both_denominators() -> None:
    m = load_stage1_metrics(H100)
    assert m.compute_peak is not None and m.bandwidth_peak is not None
    compute = attrs.evolve(m.compute_peak, value=m.compute_peak.value * 0.75, source="measured on this device: test")
    bandwidth = attrs.evolve(
        m.bandwidth_peak, value=m.bandwidth_peak.value * 0.9, source="measured on this device: test"
    )
    mfu = tuple(attrs.evolve(r, peak=compute, mfu=r.mfu / 0.75 if r.mfu else None) for r in m.mfu)
    eff = tuple(attrs.evolve(e, mbu=e.mbu / 0.9 if e.mbu else None) for e in m.efficiency)
    text = report_md(attrs.evolve(m, measured_peaks=MeasuredPeaks(compute, bandwidth, mfu, eff)), None, [])
    section = text.split("## Against this GPU's measured peaks", 1)[1].split("\n## ", 1)[0]
    assert f"{compute.value / 1e12:,.1f} TFLOP/s (measured on this device: test)" in section
    prefill = next(line for line in section.splitlines() if line.startswith("|prefill"))
    sheet = m.mfu_of("prefill")
    assert sheet is not None and sheet.mfu is not None
    assert f"|{sheet.mfu:.2%}|{sheet.mfu / 0.75:.2%}|" in prefill
    assert "Against this GPU's measured peaks" not in report_md(m, None, [])


@pytest.mark.slow
def test_peaks_setting_is_checked_and_cpu_keeps_the_datasheet(tmp_path: Path) -> None:
    bad = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "hardware.peaks=fastest",
        f"hydra.run.dir={tmp_path / 'bad'}",
    )
    assert bad.returncode == 2 and "hardware.peaks" in bad.stderr
    done = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "hardware.peaks=measured",
        "infer.max_new_tokens=2",
        "pipeline.torch_profiler.enable=false",
        f"hydra.run.dir={tmp_path / 'cpu'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = load_stage1_metrics(tmp_path / "cpu" / "metrics.json")
    assert metrics.measured_peaks is None
    assert any(w.startswith("hardware.peaks=measured needs a CUDA device") for w in metrics.warnings)


def test_peak_figure_is_a_record() -> None:
    figure = PeakFigure(value=1.0, unit="B/s", dtype_key=None, source="s", device_name="d")
    assert attrs.has(type(figure))

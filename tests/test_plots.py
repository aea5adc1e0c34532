"""Stage 1 plots on two real metrics.json files: an H100 run of the full-size model and a CPU run of the tiny one."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import attrs
import matplotlib.pyplot as plt
import pytest
from PIL import Image

from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report import plots

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
RUNS = ("h100_full_stage1", "cpu_tiny_stage1")
NAMES = ("stage_breakdown", "decode_latency", "roofline", "operator_shares")


def load(run: str) -> Stage1Metrics:
    return load_stage1_metrics(FIXTURES / f"{run}.json")


def raw(run: str) -> dict[str, Any]:
    """The fixture as plain JSON, to check the plots' arithmetic independently of the records."""
    return dict(json.loads((FIXTURES / f"{run}.json").read_text()))


def without_peaks(m: Stage1Metrics) -> Stage1Metrics:
    """The run as if no peak were known (CPU without hardware.peak_* overrides)."""
    return attrs.evolve(m, bandwidth_peak=None, mfu=tuple(attrs.evolve(r, peak=None, mfu=None) for r in m.mfu))


def assert_real_png(path: Path) -> None:
    assert path.is_file()
    assert path.stat().st_size > 5_000
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width > 400 and image.height > 200
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # not a blank or single-colour image


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", NAMES)
def test_each_plot_writes_a_png(run: str, name: str, tmp_path: Path) -> None:
    target = tmp_path / f"{name}.png"
    assert getattr(plots, name)(load(run), target) == target
    assert_real_png(target)


@pytest.mark.parametrize("run", RUNS)
def test_write_stage1_plots_writes_all_and_closes_figures(run: str, tmp_path: Path) -> None:
    before = len(plt.get_fignums())
    written = plots.write_stage1_plots(load(run), tmp_path)
    assert written == {name: tmp_path / "plots" / f"{name}.png" for name in NAMES}
    for path in written.values():
        assert_real_png(path)
    assert len(plt.get_fignums()) == before


@pytest.mark.parametrize("name", NAMES)
def test_a_plot_that_fails_half_drawn_leaves_no_figure_open(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(fig: object, path: Path) -> Path:
        raise OSError(f"disk full writing {path}")

    monkeypatch.setattr(plots, "save_figure", fail)
    before = set(plt.get_fignums())
    with pytest.raises(OSError, match="disk full"):
        getattr(plots, name)(load("h100_full_stage1"), tmp_path / f"{name}.png")
    assert set(plt.get_fignums()) == before


def test_roofline_needs_peaks(tmp_path: Path) -> None:
    h100 = load("h100_full_stage1")
    assert h100.device.type == "cuda" and h100.bandwidth_peak
    assert plots.roofline(h100, tmp_path / "h100.png") == tmp_path / "h100.png"
    cpu = without_peaks(load("cpu_tiny_stage1"))
    assert plots.roofline(cpu, tmp_path / "cpu.png") is None
    assert not (tmp_path / "cpu.png").exists()
    written = plots.write_stage1_plots(cpu, tmp_path / "run")
    assert set(written) == {"stage_breakdown", "decode_latency", "operator_shares"}


@pytest.mark.parametrize("run", RUNS)
def test_stacked_segments_add_up_to_median_e2e_without_double_counting_vision(run: str) -> None:
    segments = plots.stage_segments(load(run))
    m = raw(run)
    images = {r["image"] for r in m["records"]}
    assert set(segments) == images
    for image, seg in segments.items():
        recs = [r for r in m["records"] if r["image"] == image]
        e2e = statistics.median(r["e2e_ms"] for r in recs)
        assert sum(seg.values()) == pytest.approx(e2e, rel=0.01)
        assert list(seg) == [
            "preprocess",
            "vision/sam",
            "vision/encoder",
            "vision/projector",
            "prefill (rest)",
            "decode",
        ]
        assert all(v >= 0 for v in seg.values())
        vision = seg["vision/sam"] + seg["vision/encoder"] + seg["vision/projector"]
        ordered = sorted(recs, key=lambda r: r["e2e_ms"])
        mid = len(ordered) // 2
        median_pass = ordered[mid : mid + 1] if len(ordered) % 2 else ordered[mid - 1 : mid + 1]
        prefill = statistics.fmean(r["prefill_ms"] for r in median_pass)
        assert vision + seg["prefill (rest)"] == pytest.approx(prefill)  # vision is inside prefill, counted once


def test_decode_series_are_medians_over_repeats_at_prompt_plus_step() -> None:
    series = plots.decode_step_medians(load("h100_full_stage1"))
    m = raw("h100_full_stage1")
    recs = [r for r in m["records"] if r["image"] == "receipt_long.png"]
    ctx, ms = series["receipt_long.png"]
    assert ctx[0] == recs[0]["prompt_tokens"] and ctx == list(range(ctx[0], ctx[0] + len(recs[0]["decode_step_ms"])))
    assert ms[3] == pytest.approx(statistics.median(r["decode_step_ms"][3] for r in recs))


def test_absent_data_gives_none(tmp_path: Path) -> None:
    empty = attrs.evolve(
        load("cpu_tiny_stage1"), records=(), efficiency=(), mfu=(), top_operators=(), operator_sort_key=None
    )
    assert plots.write_stage1_plots(empty, tmp_path) == {}
    assert not (tmp_path / "plots").exists()

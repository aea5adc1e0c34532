"""The Stage 2 kernel roofline, rendered from real H100 exports: the tiny model's nsys trace and decode ncu round,
plus the full-size model's prefill GEMM ncu round (the only fixture with tensor-core FLOP counters)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text

from helpers import run_main, unpack_nsys_fixture
from llm_perf_opt.nsight.ncu_report import read_ncu_raw_csv
from llm_perf_opt.pipeline.stage2 import CAPTURE_FILE, TARGETS_FILE, render
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.stage2 import NcuKernelRow, Stage2Metrics
from llm_perf_opt.report import stage2_plots
from llm_perf_opt.report.stage2_reports import kernels_md
from test_plots import assert_real_png
from test_stage2_pipeline import stage2_metrics, write_workload

FIXTURES = Path(__file__).parent / "fixtures"
NCU = {"decode": "h100_tiny_decode_raw.csv", "prefill": "h100_full_prefill_gemm_raw.csv"}
GEMM = "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
# NVIDIA H100 SXM5 datasheet (gpus.yaml, h100_sxm): dense BF16 tensor core 989.4 TFLOP/s, FP32 67 TFLOP/s, 3.35 TB/s.
H100_BF16, H100_FP32, H100_BW = 989.4e12, 67e12, 3.35e12


def _round(stage: str) -> dict[str, Any]:
    return {"folder": f"ncu/{stage}", "kernels": [], "launch_skip": 0, "launch_count": 8, "regex": ""}


def stage2_folder(root: Path) -> Path:
    """A Stage 2 folder as stage2-profile leaves it, from the H100 fixtures: one ncu round per stage."""
    folder = root / "run"
    unpack_nsys_fixture(folder)
    for stage, export in NCU.items():
        (folder / "ncu" / stage).mkdir(parents=True)
        shutil.copy(FIXTURES / "ncu" / export, folder / "ncu" / stage / "raw.csv")
    (folder / CAPTURE_FILE).write_text(
        json.dumps({"run_id": "fixture", "mode": "light", "ncu_clock_control": "none", "tools": {}, "runs": {}})
    )
    targets = {
        "prefill": {"kernels": [GEMM], "calls": {}, "instances": 2, "rounds": [_round("prefill")]},
        "decode": {"kernels": ["indexSelectSmallIndex"], "calls": {}, "instances": 6, "rounds": [_round("decode")]},
    }
    (folder / TARGETS_FILE).write_text(json.dumps({"mode": "light", "stages": targets}))
    return folder


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(stage2_folder(tmp_path_factory.mktemp("s2")))


def metrics_of(folder: Path) -> Stage2Metrics:
    return stage2_metrics(folder)


def expected_plottable() -> int:
    """Kernels of the fixture CSVs with FLOPs > 0, DRAM bytes > 0 and a tensor-core counter in the export header."""
    count = 0
    for export in NCU.values():
        path = FIXTURES / "ncu" / export
        tensor = "sm__ops_path_tensor_src_" in path.read_text().split("\n", 1)[0]
        count += sum(1 for k in read_ncu_raw_csv(path) if tensor and (k.flops or 0) > 0 and k.dram_bytes > 0)
    return count


def nsys_stats_decode_ms(kernel: str) -> tuple[float, float]:
    """(ms of the kernels whose name contains `kernel`, ms of all kernels) in the decode range, from the fixture's
    `nsys stats --report nvtx_kern_sum` CSV: a source independent of the SQL over the sqlite export."""
    with (FIXTURES / "nsys" / "h100_tiny_nvtx_kern_sum.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["NVTX Range"] == "llm_perf_opt:decode"]
    ns = [(float(r["Total Time (ns)"]), kernel in r["Kernel Name"]) for r in rows]
    return sum(t for t, hit in ns if hit) / 1e6, sum(t for t, _ in ns) / 1e6


def scatter_points(fig: Figure) -> list[tuple[float, float]]:
    return [tuple(xy) for c in fig.axes[0].collections if isinstance(c, PathCollection) for xy in c.get_offsets()]


def kernel_labels(fig: Figure) -> list[Annotation]:
    return [t for t in fig.axes[0].texts if isinstance(t, Annotation) and not t.get_text().startswith("ridge")]


def test_render_writes_the_chart_and_kernels_md_embeds_it(rendered: Path) -> None:
    assert_real_png(rendered / "kernel_roofline.png")
    assert (rendered / "kernel_roofline.png").stat().st_size > 30_000  # roofs, point, legends and text drawn
    kernels = (rendered / "kernels.md").read_text()
    assert "## Roofline of the profiled kernels" in kernels
    assert "![Profiled kernels on the device's roofline](kernel_roofline.png)" in kernels
    assert kernels.index("kernel_roofline.png") < kernels.index("## prefill")  # chart before the tables
    assert "Plotted: 1 of the 6 profiled kernels; left out: 5 kernels with no tensor-core FLOP counter" in kernels
    assert "[kernel_roofline.png](kernel_roofline.png)" in (rendered / "report.md").read_text()


def test_plotted_kernels_are_those_with_flops_and_bytes(rendered: Path) -> None:
    m = metrics_of(rendered)
    before = len(plt.get_fignums())
    fig = stage2_plots.kernel_roofline_figure(m)
    assert fig is not None
    try:
        points = scatter_points(fig)
        title = fig.axes[0].get_title()
        labels = [t.get_text() for t in kernel_labels(fig)]
    finally:
        plt.close(fig)
    assert len(plt.get_fignums()) == before
    assert len(points) == expected_plottable() == 1
    gemm = next(r for r in m.ncu_kernels if r.name == GEMM)
    assert gemm.achieved_tflops is not None
    assert points[0] == pytest.approx((gemm.arithmetic_intensity, gemm.achieved_tflops * 1e12))
    intensity, achieved = points[0]
    assert achieved <= min(H100_BF16, intensity * H100_BW)  # a measured kernel sits under the roof
    assert labels == [GEMM[: stage2_plots.LABEL_CHARS - 1] + "…"]
    assert "NVIDIA H100 80GB HBM3" in title and "datasheet: NVIDIA H100 SXM5 (https://" in title
    assert "1 of 6 profiled kernels plotted; left out: 5" in title


def test_ncu_rows_carry_nsys_share_and_tensor_counter_flag(rendered: Path) -> None:
    rows = {r.name: r for r in metrics_of(rendered).ncu_kernels}
    assert rows[GEMM].tensor_ops_counted is True
    assert rows[GEMM].stage_share is None  # a full-size-model kernel: absent from the tiny model's trace
    decode = [r for r in rows.values() if r.stage == "decode"]
    assert len(decode) == 5 and not any(r.tensor_ops_counted for r in decode)
    reduce_ms, decode_ms = nsys_stats_decode_ms("::reduce_kernel<")  # every instantiation of the name summed
    assert reduce_ms == pytest.approx(0.302, abs=0.001)  # 4 instantiations: 160.1 + 92.0 + 34.0 + 16.0 µs
    assert rows["reduce_kernel"].stage_gpu_ms == pytest.approx(reduce_ms, rel=1e-6)
    assert rows["reduce_kernel"].stage_share == pytest.approx(reduce_ms / decode_ms, rel=1e-6)
    assert rows["reduce_kernel"].stage_instantiations == 4


def test_roofs_without_workload_metrics_come_from_the_gpu_table(rendered: Path) -> None:
    m = metrics_of(rendered)
    assert [(r.dtype_key, r.value) for r in m.compute_roofs] == [("bf16", H100_BF16), ("fp32", H100_FP32)]
    assert m.bandwidth_peak is not None and m.bandwidth_peak.value == H100_BW
    roofs = [*m.compute_roofs, m.bandwidth_peak]
    assert all(r.source.startswith("datasheet: NVIDIA H100 SXM5") for r in roofs)


def test_workload_peaks_win_over_the_table(tmp_path: Path) -> None:
    folder = stage2_folder(tmp_path)
    override = PeakFigure(value=500e12, unit="FLOP/s", dtype_key="bf16", source="user override: x=500", device_name="x")
    bandwidth = PeakFigure(value=2e12, unit="B/s", dtype_key=None, source="user override: y=2000", device_name="x")
    write_workload(folder, override, bandwidth)
    m = metrics_of(render(folder))
    assert [(r.dtype_key, r.value) for r in m.compute_roofs] == [("bf16", 500e12), ("fp32", H100_FP32)]
    assert m.bandwidth_peak is not None and m.bandwidth_peak.value == 2e12
    caption = stage2_plots.roofline_caption(m)
    assert "user override: x=500" in caption and "user override: y=2000" in caption


def _gemm_variant(m: Stage2Metrics, **changes: Any) -> NcuKernelRow:
    return attrs.evolve(next(r for r in m.ncu_kernels if r.name == GEMM), **changes)


def test_incomplete_kernels_are_left_out_with_their_reason(rendered: Path, tmp_path: Path) -> None:
    m = metrics_of(rendered)
    m = attrs.evolve(
        m,
        ncu_kernels=(
            _gemm_variant(m, name="no_flops", flops=None, achieved_tflops=None, arithmetic_intensity=None),
            _gemm_variant(m, name="cuda_cores_only", tensor_ops_counted=False),
            _gemm_variant(m, name="zero_flops", flops=0.0, achieved_tflops=0.0, arithmetic_intensity=0.0),
            _gemm_variant(m, name="zero_bytes", dram_bytes=0.0, arithmetic_intensity=None),
        ),
    )
    points, left_out = stage2_plots.kernel_points(m)
    assert points == []
    assert left_out == {
        stage2_plots.NO_FLOPS: 1,
        stage2_plots.NO_TENSOR: 1,
        stage2_plots.ZERO_FLOPS: 1,
        stage2_plots.ZERO_BYTES: 1,
    }
    stale = tmp_path / stage2_plots.KERNEL_ROOFLINE
    stale.write_bytes(b"old chart")
    assert stage2_plots.write_stage2_plots(m, tmp_path) == {}
    assert not stale.exists()  # a re-render leaves no chart that no longer applies
    text = kernels_md(m, {})
    assert "No kernel roofline chart: no profiled kernel has complete figures" in text
    assert "1 kernel with 0 DRAM bytes" in text and "![" not in text


def test_no_chart_without_peaks(rendered: Path) -> None:
    m = attrs.evolve(metrics_of(rendered), compute_roofs=(), bandwidth_peak=None)
    assert stage2_plots.kernel_roofline_figure(m) is None
    assert "no compute or bandwidth peak is known for NVIDIA H100 80GB HBM3" in stage2_plots.missing_reason(m)


def test_labels_name_the_hottest_kernels_without_overlapping(rendered: Path) -> None:
    m = metrics_of(rendered)
    rows = []
    for i in range(9):  # the real GEMM, spread along the memory roof's side, hotter with i
        scale = 0.5 ** (i % 5)
        rows.append(
            _gemm_variant(
                m,
                name=f"kernel_{i}",
                stage="decode" if i % 2 else "prefill",
                arithmetic_intensity=730 * scale,
                achieved_tflops=600 * scale * (0.9 if i > 4 else 1.0),
                stage_gpu_ms=float(i),
                stage_share=i / 40,
            )
        )
    m = attrs.evolve(m, ncu_kernels=tuple(rows))
    fig = stage2_plots.kernel_roofline_figure(m)
    assert fig is not None
    try:
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        notes = kernel_labels(fig)
        boxes = [Text.get_window_extent(n, renderer) for n in notes]
        texts = sorted(n.get_text().split(" (")[0] for n in notes)
        plotted = len(scatter_points(fig))
    finally:
        plt.close(fig)
    assert plotted == 9
    assert texts == sorted(f"kernel_{i}" for i in range(3, 9))  # the LABELLED = 6 with most GPU time
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1 :])


def test_stage2_report_command_rerenders_the_chart(rendered: Path, tmp_path: Path) -> None:
    copy_dir = tmp_path / "copied"
    shutil.copytree(rendered, copy_dir)
    (copy_dir / "kernel_roofline.png").unlink()
    # In this process: test_stage2_pipeline runs the real stage2-report process.
    done = run_main("llm_perf_opt.cli.stage2_report", str(copy_dir))
    assert done.returncode == 0, done.stderr
    assert_real_png(copy_dir / "kernel_roofline.png")
    assert "](kernel_roofline.png)" in (copy_dir / "kernels.md").read_text()


def test_a_function_name_shared_by_instantiations_is_marked(rendered: Path) -> None:
    """ncu measures one instantiation of a function name; the nsys share sums all of them: the label says so."""
    m = metrics_of(rendered)
    row = next(r for r in m.ncu_kernels if stage2_plots._left_out_reason(r) is None)
    single = stage2_plots._point(attrs.evolve(row, stage_instantiations=1))
    shared = stage2_plots._point(attrs.evolve(row, stage_instantiations=3))
    assert not single.label.endswith("†")
    assert shared.label == single.label + " †"
    assert "† marks a function name shared" in stage2_plots.roofline_caption(m)

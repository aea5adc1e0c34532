"""The shipped Stage 2 example folder (examples/stage2-h100-tiny): it loads as records, and `stage2-report` renders
it from its gzipped nsys export into exactly the Markdown and metrics it ships."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs

from helpers import run_cli
from llm_perf_opt.records import folders
from llm_perf_opt.records.folders import METRICS_FILE, Stage2Folder, load_stage2_metrics
from test_records_stage2 import assert_round_trips

EXAMPLE = Path(__file__).parents[1] / "examples" / "stage2-h100-tiny"
RENDERED = ("report.md", "kernels.md", "stakeholder_summary.md")


def test_the_example_is_a_complete_stage2_folder(tmp_path: Path) -> None:
    folder = folders.load(EXAMPLE)
    assert isinstance(folder, Stage2Folder) and folders.is_complete(folder)
    assert folder.capture is not None and folder.targets is not None and folder.workload is None
    assert folder.metrics.device.name == "NVIDIA H100 80GB HBM3" and folder.metrics.decode_steps is not None
    assert {r.stage for r in folder.metrics.ncu_kernels} == {"decode"}
    assert set(folder.status.files) <= {str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*") if p.is_file()}
    for record in (folder.status, folder.metrics, folder.capture, folder.targets):
        assert_round_trips(record, tmp_path)


def test_stage2_report_renders_the_example_as_shipped(tmp_path: Path) -> None:
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    done = run_cli("llm_perf_opt.cli.stage2_report", str(copy), timeout=180)
    assert done.returncode == 0, done.stderr
    for name in RENDERED:
        assert (copy / name).read_text() == (EXAMPLE / name).read_text(), f"{name} differs: re-render the example"
    shipped, rendered = load_stage2_metrics(EXAMPLE / METRICS_FILE), load_stage2_metrics(copy / METRICS_FILE)
    assert attrs.evolve(rendered, created=shipped.created) == shipped
    assert not (copy / "nsys" / "report.sqlite").exists()  # the gzipped export is read where it lies
    assert not (copy / "kernel_roofline.png").exists()  # no profiled kernel has tensor-core FLOPs

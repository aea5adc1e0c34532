"""The shipped Stage 2 example folder (examples/stage2-h100-tiny) loads as complete records (that `stage2-report`
renders it, from its gzipped nsys export, into exactly the Markdown and metrics it ships: tests/test_examples.py)."""

from __future__ import annotations

from pathlib import Path

from llm_perf_opt.records import folders
from llm_perf_opt.records.folders import Stage2Folder
from test_records_stage2 import assert_round_trips

EXAMPLE = Path(__file__).parents[1] / "examples" / "stage2-h100-tiny"


def test_the_example_is_a_complete_stage2_folder(tmp_path: Path) -> None:
    folder = folders.load(EXAMPLE)
    assert isinstance(folder, Stage2Folder) and folders.is_complete(folder)
    assert folder.capture is not None and folder.targets is not None and folder.workload is None
    assert folder.metrics.device.name == "NVIDIA H100 80GB HBM3" and folder.metrics.decode_steps is not None
    assert {r.stage for r in folder.metrics.ncu_kernels} == {"decode"}
    assert folder.metrics.created == folder.status.started  # the run's time, however often stage2-report runs
    assert set(folder.status.files) <= {str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*") if p.is_file()}
    for record in (folder.status, folder.metrics, folder.capture, folder.targets):
        assert_round_trips(record, tmp_path)

"""Stage 2 folders as typed records: the real H100 runs (trimmed metrics) and a folder rendered from the H100
exports load, round-trip through plain data and through files, and damaged or foreign files fail naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import run_main
from llm_perf_opt.pipeline.stage2 import render
from llm_perf_opt.records import folders
from llm_perf_opt.records.folders import CAPTURE_FILE, METRICS_FILE, NCU_TARGETS_FILE, Stage2Folder
from llm_perf_opt.records.io import RecordError, converter, load_file, save, to_plain
from llm_perf_opt.records.stage2 import Capture, NcuTargets, Stage2Metrics
from test_stage2_pipeline import _stage2_folder

COMPARE = Path(__file__).parent / "fixtures" / "compare"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H100 exports folder of the Stage 2 pipeline tests, rendered, with its run status."""
    folder = render(_stage2_folder(tmp_path_factory.mktemp("s2")))
    shutil.copy(COMPARE / "s2_light" / "run_status.json", folder / "run_status.json")
    return folder


def assert_round_trips(record: Any, tmp_path: Path) -> None:
    """`record` survives plain data and a file unchanged."""
    cls = type(record)
    assert converter.structure(to_plain(record), cls) == record
    path = save(record, tmp_path / f"{cls.__name__}.json")
    assert load_file(path, cls, versioned=False) == record


@pytest.mark.parametrize("name", ["s2_light", "s2_deep"])
def test_trimmed_h100_runs_load_as_stage2_folders(name: str, tmp_path: Path) -> None:
    folder = folders.load(COMPARE / name)
    assert isinstance(folder, Stage2Folder) and folder.kind == "stage2"
    m = folder.metrics
    assert m.mode == name.removeprefix("s2_") and m.device.name == "NVIDIA H100 80GB HBM3"
    assert m.model is not None and m.model.name == "deepseek_ocr2"
    assert m.workload_settings is not None and m.workload_settings.max_new_tokens == 32
    assert m.decode_steps is not None and m.decode_steps.steps == 155
    # trimmed copies: what they lack reads as empty
    assert m.top_kernels_by_stage == {} and m.ncu_kernels == () and m.tool_runs == {} and m.compute_roofs == ()
    prefill = m.stage_row("prefill")
    assert prefill is not None and prefill.mfu_on_busy_time is not None and 0 < prefill.mfu_on_busy_time < 1
    assert prefill.bytes is None and prefill.mbu_on_busy_time is None  # written before Stage 2 had MBU
    assert folder.capture is None and folder.targets is None and folder.workload is None
    assert folders.is_complete(folder)
    assert_round_trips(m, tmp_path)


def test_rendered_folder_loads_with_its_capture_and_targets(rendered: Path, tmp_path: Path) -> None:
    folder = folders.load(rendered)
    assert isinstance(folder, Stage2Folder)
    assert folder.capture is not None and folder.capture.tools["ncu"].version == "2025.3.1"
    assert folder.capture.runs["nsys_profile"].seconds == 30.0
    assert folder.targets is not None
    assert [r.folder for r in folder.targets.stages["decode"].rounds] == ["ncu/decode"]
    m = folder.metrics
    assert m.tool_runs["nsys_profile"].returncode == 0 and m.device.driver == "580.159.04"
    assert {r.name for r in m.ncu_kernels} >= {"indexSelectSmallIndex", "reduce_kernel"}
    assert list(m.top_kernels_by_stage) == [
        "preprocess",
        "prefill",
        "vision/sam",
        "vision/encoder",
        "vision/projector",
        "decode",
    ]
    for record in (m, folder.capture, folder.targets):
        assert_round_trips(record, tmp_path)


def test_metrics_json_is_the_record_as_written(rendered: Path) -> None:
    """What render writes is exactly the record's plain form (no field lost or added on the way)."""
    m = folders.load_stage2_metrics(rendered / METRICS_FILE)
    assert json.loads((rendered / METRICS_FILE).read_text()) == to_plain(m)


def test_a_damaged_capture_names_the_file(rendered: Path, tmp_path: Path) -> None:
    copy = tmp_path / "damaged"
    shutil.copytree(rendered, copy)
    (copy / CAPTURE_FILE).write_text('{"run_id": "fixture", "mode":')
    with pytest.raises(RecordError, match=r"capture\.json cannot be read as a run record: it is damaged"):
        folders.load_capture(copy)
    with pytest.raises(RecordError, match=re.escape(str(copy / CAPTURE_FILE))):
        render(copy)
    done = run_main("llm_perf_opt.cli.stage2_report", str(copy))
    assert done.returncode == 2 and "capture.json" in done.stderr and "Traceback" not in done.stderr


def test_a_capture_without_its_run_id_names_the_field(tmp_path: Path) -> None:
    (tmp_path / CAPTURE_FILE).write_text(json.dumps({"mode": "light"}))
    with pytest.raises(RecordError, match=r"fit a Capture record.*run_id"):
        folders.load_capture(tmp_path)


def test_metrics_of_another_schema_major_are_refused(rendered: Path, tmp_path: Path) -> None:
    copy = tmp_path / "future"
    shutil.copytree(rendered, copy)
    data = json.loads((copy / METRICS_FILE).read_text())
    (copy / METRICS_FILE).write_text(json.dumps({**data, "schema_version": "2.0"}))
    with pytest.raises(RecordError, match=r"metrics\.json has schema_version 2\.0") as caught:
        folders.load(copy)
    assert str(copy / METRICS_FILE) in str(caught.value)


def test_stage1_metrics_are_not_read_as_stage2(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="holds a stage1 record, not a stage2 one"):
        folders.load_stage2_metrics(COMPARE / "h100_s1final" / METRICS_FILE)


def test_targets_and_capture_written_by_records_read_back(tmp_path: Path) -> None:
    """capture.json and ncu/targets.json as stage2-profile writes them (through save) load as the same records."""
    capture = converter.structure(
        {"run_id": "r", "mode": "deep", "tools": {"nsys": {"path": "/opt/nsys", "version": "2025.3.1"}}}, Capture
    )
    targets = converter.structure(
        {"mode": "deep", "stages": {"prefill": {"kernels": ["gemm"], "calls": {"gemm": 10}, "instances": 5}}},
        NcuTargets,
    )
    save(capture, tmp_path / CAPTURE_FILE)
    save(targets, tmp_path / NCU_TARGETS_FILE)
    assert folders.load_capture(tmp_path) == capture
    assert folders.load_ncu_targets(tmp_path) == targets
    assert folders.load_ncu_targets(tmp_path / "elsewhere") is None


def test_stage2_metrics_need_their_measured_fields(tmp_path: Path) -> None:
    data = json.loads((COMPARE / "s2_light" / METRICS_FILE).read_text())
    del data["stages"]
    (tmp_path / METRICS_FILE).write_text(json.dumps(data))
    with pytest.raises(RecordError, match=f"fit a {Stage2Metrics.__name__} record"):
        folders.load_stage2_metrics(tmp_path / METRICS_FILE)


def test_measured_bytes_and_bytes_passes_round_trip(tmp_path: Path) -> None:
    """A folder with both bytes passes: its targets and metrics carry them through plain data and files, and
    metrics.json is the record as written."""
    from test_stage2_bytes import bytes_folder

    rendered = render(bytes_folder(tmp_path / "s2"))
    shutil.copy(COMPARE / "s2_light" / "run_status.json", rendered / "run_status.json")
    folder = folders.load(rendered)
    assert isinstance(folder, Stage2Folder) and folder.targets is not None
    assert [p.stage for p in folder.targets.bytes_passes] == ["prefill", "decode"]
    measured = folder.metrics.measured_bytes
    assert measured is not None and [r.stage for r in measured.rows][-1] == "decode/step"
    assert measured.rows[0].top_kernels and measured.rows[0].analytic_source
    for record in (folder.metrics, folder.targets):
        assert_round_trips(record, tmp_path)
    written = json.loads((folder.path / METRICS_FILE).read_text())
    assert written == to_plain(folder.metrics) and written["measured_bytes"]["cache_control"] == "none"


def test_folders_from_before_the_bytes_pass_load_without_it(tmp_path: Path) -> None:
    targets = converter.structure({"mode": "light", "stages": {}}, NcuTargets)
    assert targets.bytes_passes == ()
    for name in ("s2_light", "s2_deep"):
        data = json.loads((COMPARE / name / METRICS_FILE).read_text())
        assert "measured_bytes" not in data
        assert folders.load_stage2_metrics(COMPARE / name / METRICS_FILE).measured_bytes is None

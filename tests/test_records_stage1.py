"""Stage 1 records: every Stage 1 folder and metrics file the project has written loads as typed records,
round-trips exactly, and re-renders its reports byte for byte; bad files fail with one clear paragraph."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli, run_main
from llm_perf_opt.pipeline.stage1_render import render
from llm_perf_opt.records import io
from llm_perf_opt.records.folders import Stage1Folder, load, load_stage1_metrics
from llm_perf_opt.records.io import RecordError, converter, to_plain
from llm_perf_opt.records.stage1 import Stage1Metrics
from whatif_fixtures import copy_stage1_run

FIXTURES = Path(__file__).parent / "fixtures"
METRICS = [
    FIXTURES / "metrics" / "h100_full_stage1.json",
    FIXTURES / "metrics" / "cpu_tiny_stage1.json",
    FIXTURES / "metrics" / "cpu_tiny_batch2_stage1.json",
    *(FIXTURES / "compare" / name / "metrics.json" for name in ("h100_s1final", "h100_s1sol", "cpu_tiny")),
    FIXTURES / "runs" / "cpu_tiny_v1_stage1" / "metrics.json",
]
RUN = FIXTURES / "runs" / "cpu_tiny_v1_stage1"
REPORTS = ("report.md", "stakeholder_summary.md", "assumptions.md", "operators.md", "viz/predictions.md")


@pytest.mark.parametrize("path", METRICS, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_stage1_metrics_file_round_trips(path: Path, tmp_path: Path) -> None:
    metrics = load_stage1_metrics(path)
    assert isinstance(metrics, Stage1Metrics) and metrics.stages
    assert converter.structure(to_plain(metrics), Stage1Metrics) == metrics
    assert load_stage1_metrics(io.save(metrics, tmp_path / "metrics.json")) == metrics


def test_the_real_h100_run_reads_as_typed_records() -> None:
    m = load_stage1_metrics(METRICS[0])
    assert m.settings.repeats == 5 and m.settings.sources["run.repeats"] == "device default (cuda)"
    assert m.vision_stages == ("vision/sam", "vision/encoder", "vision/projector")
    assert len(m.images) == 5 and len(m.records) == 25
    peak = m.compute_peak
    assert peak is not None and peak.dtype_key == "bf16" and peak.value == pytest.approx(989.4e12)
    decode = m.efficiency_of("decode")
    assert decode is not None and decode.mbu is not None and 0 < decode.mbu < 1
    assert m.profiler is not None and m.profiler.decode_steps == 4


def test_a_whole_run_folder_loads_and_round_trips(tmp_path: Path) -> None:
    folder = load(copy_stage1_run(tmp_path / "run"))
    assert isinstance(folder, Stage1Folder) and folder.status.state == "complete"
    assert folder.inputs is not None and folder.inputs.count == 1 and folder.operators is not None
    assert [p.image for p in folder.predictions] == list(folder.metrics.images)
    for record in (folder.status, folder.metrics, folder.inputs, folder.operators, *folder.predictions):
        assert converter.structure(to_plain(record), type(record)) == record
    assert io.dumps_yaml(folder.inputs) == (tmp_path / "run" / "inputs.yaml").read_text()


def test_reports_rendered_from_the_records_are_byte_identical(tmp_path: Path) -> None:
    folder = copy_stage1_run(tmp_path / "run")
    before = {name: (folder / name).read_text() for name in REPORTS}
    render(folder)
    for name in REPORTS:
        assert (folder / name).read_text() == before[name], name  # the samples folder named by its resolver


def test_a_newer_schema_is_refused_with_one_paragraph(tmp_path: Path) -> None:
    data = json.loads(METRICS[1].read_text())
    data["schema_version"] = "2.0"
    (tmp_path / "metrics.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"schema_version 2\.0.*reads 1\.x") as err:
        load_stage1_metrics(tmp_path / "metrics.json")
    assert str(tmp_path / "metrics.json") in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "why"),
    [("{not json", "damaged"), ('{"schema_version": "1.0", "stage": "stage1"}', "do not fit a Stage1Metrics")],
)
def test_damaged_or_incomplete_metrics_name_the_file(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "metrics.json").write_text(text)
    with pytest.raises(RecordError, match=why) as err:
        load_stage1_metrics(tmp_path / "metrics.json")
    assert str(tmp_path / "metrics.json") in str(err.value)


def test_a_folder_without_metrics_says_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"no metrics\.json"):
        load(tmp_path)


@pytest.mark.slow
def test_stage1_report_rebuilds_a_copied_folder(tmp_path: Path) -> None:
    folder = copy_stage1_run(tmp_path / "run")
    (folder / "report.md").unlink()
    done = run_cli("llm_perf_opt.cli.stage1_report", str(folder))
    assert done.returncode == 0, done.stderr
    assert (folder / "report.md").read_text() == (RUN / "report.md").read_text()
    missing = run_main("llm_perf_opt.cli.stage1_report", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "is not a folder" in missing.stderr


def test_rebuilding_a_report_imports_no_torch(tmp_path: Path) -> None:
    """`stage1-report` needs no model and no GPU: rebuilding a folder's reports imports neither torch nor
    transformers (the record and report layers import none)."""
    folder = copy_stage1_run(tmp_path / "run")
    probe = (
        "import sys\n"
        "from llm_perf_opt.cli.stage1_report import main\n"
        f"main([{str(folder)!r}])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
    assert (folder / "report.md").is_file()

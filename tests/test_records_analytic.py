"""The analytic report read back as a typed record: config reports of both models and a Stage 1 run report."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from llm_perf_opt.analytic.workload import MeasuredInput, RunWorkload
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.pipeline.analytic import write_analytic_report, write_analytic_report_for_run
from llm_perf_opt.records.analytic import (
    REPORT_FILE,
    AnalyticReport,
    ModeSweepRow,
    TileSweepRow,
    ViewsPrice,
    load_analytic_report,
)
from llm_perf_opt.records.io import RecordError, converter, dumps, save, to_plain

# v1 Gundam, as the bundled snippet (no tiles) and A4 page (2x3 tiles) run with the default prompt
RUN = RunWorkload(
    inputs=(
        MeasuredInput(
            "snippet_small.png", tiles=0, image_tokens=273, prompt_tokens=286, new_tokens=8, crop_grid=(1, 1)
        ),
        MeasuredInput(
            "page_portrait.png", tiles=6, image_tokens=903, prompt_tokens=916, new_tokens=8, crop_grid=(2, 3)
        ),
    ),
    dtype="float32",
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """report.json as analytic-report writes it (v1, OCR-2) and as a Stage 1 run would (v1, two inputs)."""
    root = tmp_path_factory.mktemp("analytic")
    out = {}
    for name, overrides in (("v1", ()), ("ocr2", ("model=deepseek_ocr2", "analytic.tiles=2")), ("run", ())):
        art = ArtifactsManager(root / name, stage="analytic")
        art.start(name)
        cfg = command_config(compose_config("analytic", *overrides))
        if name == "run":
            write_analytic_report_for_run(art, cfg, RUN)
        else:
            write_analytic_report(art, cfg)
        out[name] = root / name / REPORT_FILE
    return out


def test_written_reports_load_as_typed_records(written: dict[str, Path]) -> None:
    v1 = load_analytic_report(written["v1"])
    assert v1.model == "deepseek_ocr" and v1.tile_sweep is None and v1.run is None
    assert v1.mode_sweep is not None and all(isinstance(row, ModeSweepRow) for row in v1.mode_sweep.rows)
    assert isinstance(v1.mode_sweep.rows[0].price, ViewsPrice)
    assert (v1.workload.crop_grid, v1.workload.image_tokens) == ((2, 3), 903)
    ocr2 = load_analytic_report(written["ocr2"])
    assert ocr2.tile_sweep is not None and all(isinstance(row, TileSweepRow) for row in ocr2.tile_sweep.rows)
    assert ocr2.mode_sweep is None and ocr2.workload.tiles == 2
    run = load_analytic_report(written["run"])
    assert run.run is not None and [i.workload.tiles for i in run.run.inputs] == [0, 6]
    assert run.workload.dtype == "float32"
    # The JSON keeps its flat rows and leaves out the sections a report does not have.
    for name, absent in (("v1", {"tile_sweep", "run"}), ("ocr2", {"mode_sweep", "run"}), ("run", {"tile_sweep"})):
        data = json.loads(written[name].read_text())
        assert not absent & set(data), name
    row = json.loads(written["ocr2"].read_text())["tile_sweep"]["rows"][0]
    assert list(row) == ["tiles", *(f.name for f in attrs.fields(ViewsPrice))]  # the row's price written inline


@pytest.mark.parametrize("name", ["v1", "ocr2", "run"])
def test_report_round_trips(written: dict[str, Path], name: str, tmp_path: Path) -> None:
    report = load_analytic_report(written[name])
    assert converter.structure(to_plain(report), AnalyticReport) == report
    copy = save(report, tmp_path / "report.json")
    assert load_analytic_report(copy) == report
    assert copy.read_text() == written[name].read_text() == dumps(report)  # rewritten byte for byte


def test_unreadable_report_is_a_record_error(written: dict[str, Path], tmp_path: Path) -> None:
    data = json.loads(written["ocr2"].read_text())
    other = tmp_path / "v2.json"
    other.write_text(json.dumps({**data, "schema_version": "2.0"}))
    with pytest.raises(RecordError, match=r"schema_version 2\.0"):
        load_analytic_report(other)
    damaged = tmp_path / "damaged.json"
    damaged.write_text(written["ocr2"].read_text()[:500])
    with pytest.raises(RecordError, match="damaged"):
        load_analytic_report(damaged)
    del data["tile_sweep"]["rows"][0]["prefill_bytes"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="do not fit a AnalyticReport record"):
        load_analytic_report(missing)

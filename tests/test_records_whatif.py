"""`whatif.json`: a `WhatIfRecord` round-trips through records/io, loads by folder or file, and a damaged or foreign
file is refused with one paragraph naming it; a run folder inside a what-if folder finds it."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from llm_perf_opt.records import io
from llm_perf_opt.records.folders import WHATIF_FILE, enclosing_whatif, load_whatif, whatif_for
from llm_perf_opt.records.io import RecordError, converter, to_plain
from llm_perf_opt.records.whatif import FAILED, SKIPPED, BaselineSettings, WhatIfRecord
from whatif_fixtures import minimal, realistic, whatif_tree


@pytest.mark.parametrize("make", [realistic, minimal], ids=["realistic", "minimal"])
def test_a_whatif_record_round_trips(make: object, tmp_path: Path) -> None:
    record = make()  # type: ignore[operator]
    assert converter.structure(to_plain(record), WhatIfRecord) == record
    saved = io.save(record, tmp_path / WHATIF_FILE)
    assert io.load_file(saved, WhatIfRecord) == record
    assert load_whatif(tmp_path) == record and load_whatif(saved) == record


def test_the_loaded_record_answers_its_lookups(tmp_path: Path) -> None:
    record = load_whatif(io.save(realistic(), tmp_path / WHATIF_FILE))
    reused = record.rung("ladder 1: static_cache")
    assert reused is not None and reused.figures is not None
    assert record.figures_of(reused) is not None and record.figures_of(reused).decode_ms_per_token.p50 == 18.5
    best = record.best_rung
    assert best is not None and best.outputs is not None and best.outputs.identical
    assert {r.name: r.state for r in record.rungs}["batch_16"] == FAILED
    assert record.device_phrase == "this GPU (NVIDIA H100 80GB HBM3)"
    assert minimal().device_phrase == "this CPU (AMD EPYC)" and minimal().rung("cuda_graphs").state == SKIPPED


def test_an_older_record_without_the_optional_fields_loads(tmp_path: Path) -> None:
    data = to_plain(realistic())
    for key in ("notes", "settings", "device_type"):
        del data[key]
    (tmp_path / WHATIF_FILE).write_text(json.dumps(data))
    record = load_whatif(tmp_path)
    assert record.device_type is None and record.notes == () and record.device_phrase.startswith("this device")


@pytest.mark.parametrize(
    ("settings", "written"),
    [
        (BaselineSettings(), {}),
        (BaselineSettings(5, 2, 32, 1), {"repeats": 5, "warmup": 2, "max_new_tokens": 32, "inputs": 1}),
    ],
    ids=["no baseline", "baseline"],
)
def test_baseline_settings_keep_their_json(settings: BaselineSettings, written: dict[str, int], tmp_path: Path) -> None:
    """`settings` is a record now; the file holds what it held as a plain dict: `{}` without a baseline."""
    record = attrs.evolve(minimal(), settings=settings)
    saved = io.save(record, tmp_path / WHATIF_FILE)
    assert json.loads(saved.read_text())["settings"] == written
    assert load_whatif(saved).settings == settings


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "damaged"),
        ('{"schema_version": "1.1", "stage": "whatif"}', "do not fit a WhatIfRecord"),
        ('{"schema_version": "1.1", "stage": "stage1"}', "holds a stage1 record, not a whatif one"),
        ('{"schema_version": "2.0", "stage": "whatif"}', r"schema_version 2\.0"),
    ],
)
def test_a_bad_whatif_file_names_itself(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / WHATIF_FILE).write_text(text)
    with pytest.raises(RecordError, match=why) as err:
        load_whatif(tmp_path)
    assert str(tmp_path / WHATIF_FILE) in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_whatif_json_says_so(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="not a finished perf-whatif folder"):
        load_whatif(tmp_path)


def test_a_run_folder_inside_a_whatif_folder_finds_it(tmp_path: Path) -> None:
    whatif_tree(tmp_path / "wi", realistic(), rungs=())
    child, grandchild, outside = tmp_path / "wi" / "run", tmp_path / "wi" / "rungs" / "00", tmp_path / "other"
    for folder in (child, grandchild, outside):
        folder.mkdir(parents=True)
    assert enclosing_whatif(child) == (tmp_path / "wi").resolve()
    assert enclosing_whatif(grandchild) == (tmp_path / "wi").resolve()
    assert enclosing_whatif(outside) is None and whatif_for(outside) is None
    assert whatif_for(grandchild) == realistic()
    assert whatif_for(outside, tmp_path / "wi") == realistic()  # given explicitly, wherever the run lies

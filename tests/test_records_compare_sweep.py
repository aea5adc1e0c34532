"""The comparison (`compare.json`) and the sweep summary (`sweep_summary.json`) as typed records: written, read back,
round-tripped; damaged run files in a compared or swept folder are skipped with a reason naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline import compare as cmp
from llm_perf_opt.pipeline.sweep import SUMMARY_MD, summarize_sweep
from llm_perf_opt.records.comparison import Comparison, StageTimeRow, load_comparison
from llm_perf_opt.records.folders import SWEEP_SUMMARY_FILE
from llm_perf_opt.records.io import converter, dumps, save, to_plain
from llm_perf_opt.records.sweep import JobFigures, SweepSummary, load_sweep_summary
from llm_perf_opt.report.comparison import comparison_markdown

FIXTURES = Path(__file__).parent / "fixtures" / "compare"
H100_A = FIXTURES / "h100_s1final"
H100_B = FIXTURES / "h100_s1sol"
CPU_TINY = FIXTURES / "cpu_tiny"
S2_LIGHT = FIXTURES / "s2_light"
S2_DEEP = FIXTURES / "s2_deep"


def _damaged_copy(tmp_path: Path, source: Path, file: str, text: str = '{"stage": "stage1", ') -> Path:
    folder = tmp_path / f"damaged_{file.split('.')[0]}"
    shutil.copytree(source, folder)
    (folder / file).write_text(text)
    return folder


def test_comparison_record_written_next_to_markdown_and_round_trips(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    out = tmp_path / "out" / "runs.md"
    written = cmp.write_comparison([H100_A, H100_B, gone, CPU_TINY, S2_LIGHT, S2_DEEP], out)
    assert cmp.record_path(out) == tmp_path / "out" / "runs.json"

    loaded = load_comparison(tmp_path / "out" / "runs.json")
    assert isinstance(loaded, Comparison) and loaded == written
    assert converter.structure(to_plain(written), Comparison) == written
    assert load_comparison(save(loaded, tmp_path / "again.json")) == written
    # the record holds everything the Markdown shows
    assert comparison_markdown(loaded) == out.read_text()

    assert [r.label for r in loaded.runs_of("stage1")] == ["h100_s1final", "h100_s1sol", "cpu_tiny"]
    assert [(s.path, s.reason) for s in loaded.skipped] == [(gone, "the folder does not exist")]
    assert loaded.stage1 is not None and loaded.stage2 is not None
    prefill = next(r for r in loaded.stage1.stage_times if r.stage == "prefill")
    assert isinstance(prefill, StageTimeRow) and prefill.base_p50_ms == pytest.approx(98.42, abs=0.005)
    assert [c.beyond_noise for c in prefill.others] == ["within noise", "beyond noise"]
    assert prefill.others[1].ratio == pytest.approx(21.75, abs=0.005)
    assert [t.other for t in loaded.stage1.operators] == ["h100_s1sol", "cpu_tiny"]
    assert loaded.stage1.operators[1].other_key == "self_cpu_ms"
    assert [d.field for d in loaded.stage2.differences] == ["mode"]
    assert [t.kernel_launches for t in loaded.stage2.totals] == [346470, 346470]


def test_out_ending_in_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"ends in \.json"):
        cmp.write_comparison([H100_A, H100_B], tmp_path / "compare.json")
    assert not (tmp_path / "compare.json").exists()


@pytest.mark.parametrize("file", ["metrics.json", "run_status.json"])
def test_damaged_file_in_compared_folder_is_skipped_naming_it(tmp_path: Path, file: str) -> None:
    damaged = _damaged_copy(tmp_path, H100_B, file)
    result = cmp.compare([H100_A, damaged, CPU_TINY])
    [skipped] = result.skipped
    assert skipped.path == damaged
    assert skipped.reason.startswith(f"{file} cannot be read as a run record: it is damaged (JSONDecodeError")
    assert [r.label for r in result.runs] == ["h100_s1final", "cpu_tiny"]
    assert f"`{damaged}`: {file} cannot be read" in comparison_markdown(result)


def test_metrics_that_do_not_fit_the_record_are_skipped(tmp_path: Path) -> None:
    metrics = json.loads((H100_B / "metrics.json").read_text())
    misfit = _damaged_copy(tmp_path, H100_B, "metrics.json", json.dumps({**metrics, "stages": [{"stage": "x"}]}))
    loaded = cmp.load_run(misfit)
    assert isinstance(loaded, cmp.Skipped)
    assert loaded.reason.startswith("metrics.json cannot be read as a run record: its fields do not fit")


def _sweep(tmp_path: Path, sources: list[Path]) -> Path:
    sweep = tmp_path / "sweep"
    for i, source in enumerate(sources):
        job = sweep / str(i)
        shutil.copytree(source, job)
        (job / ".hydra").mkdir()
        (job / ".hydra" / "overrides.yaml").write_text(f"- model.mode=m{i}\n- device=cuda\n")
    return sweep


def test_sweep_summary_record_round_trips(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, [H100_A, H100_B, CPU_TINY])
    summarize_sweep(sweep)
    text = (sweep / SWEEP_SUMMARY_FILE).read_text()
    summary = load_sweep_summary(sweep / SWEEP_SUMMARY_FILE)
    assert isinstance(summary, SweepSummary) and dumps(summary) == text  # the file is exactly the record
    assert converter.structure(to_plain(summary), SweepSummary) == summary
    assert load_sweep_summary(save(summary, tmp_path / "copy.json")) == summary

    assert summary.swept_keys == ("model.mode",) and summary.sweep_dir == str(sweep)
    assert [dict(j.swept) for j in summary.jobs] == [{"model.mode": f"m{i}"} for i in range(3)]
    figures = [m for _, m in summary.summarised]
    assert all(isinstance(m, JobFigures) for m in figures) and len(figures) == 3
    assert figures[0].prefill_p50_ms == pytest.approx(98.42, abs=0.005) and figures[0].decode_mbu is None
    assert figures[1].decode_mbu == pytest.approx(0.0184, abs=1e-4)


@pytest.mark.parametrize("file", ["metrics.json", "run_status.json"])
def test_damaged_file_in_sweep_job_is_skipped_naming_it(tmp_path: Path, file: str) -> None:
    sweep = _sweep(tmp_path, [H100_A, H100_B])
    (sweep / "1" / file).write_text("{")
    summarize_sweep(sweep)
    summary = load_sweep_summary(sweep / SWEEP_SUMMARY_FILE)
    job = summary.jobs[1]
    assert job.metrics is None and job.skipped_reason is not None
    assert job.skipped_reason.startswith(f"{file} cannot be read as a run record: it is damaged")
    assert [j.num for j, _ in summary.summarised] == [0]
    assert "|1|m1|" in (sweep / SUMMARY_MD).read_text()

"""The multirun summary: a real two-job sweep through the Hydra callback, and a synthetic sweep with bad jobs."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from helpers import run_main
from llm_perf_opt.measure.sweep import swept_keys
from llm_perf_opt.pipeline.sweep import SUMMARY_MD, SUMMARY_PNG, SWEEP_FAILED_EXIT, main, summarize_sweep
from llm_perf_opt.records.common import RunStatus, Summary
from llm_perf_opt.records.folders import SWEEP_SUMMARY_FILE, load_stage1_metrics
from llm_perf_opt.records.io import save
from llm_perf_opt.records.stage1 import MfuRecord, Stage1Metrics, StageEfficiency, StageStat, Throughput

#: Runs the console scripts in child processes (seconds to a minute each).
pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


STAGE1_METRICS = load_stage1_metrics(Path(__file__).parent / "fixtures" / "compare" / "h100_s1sol" / "metrics.json")


def _summary(p50: dict[str, float]) -> tuple[StageStat, ...]:
    return tuple(StageStat(s, None, Summary(1, v, 0.0, v, v, v, v, None, v, v, "ms")) for s, v in p50.items())


def _metrics(prefill: float, decode: float, tokens: int) -> Stage1Metrics:
    """A real Stage 1 record with these stage times, 42% prefill MFU at 415.8 TFLOP/s and 60% decode MBU."""
    step = decode / tokens
    return attrs.evolve(
        STAGE1_METRICS,
        stages=_summary(
            {"prefill": prefill, "ttft": prefill + 5, "decode": decode, "decode/step": step, "e2e": prefill + decode}
        ),
        mfu=(
            MfuRecord("prefill", 1.0, 1.0, achieved_tflops=415.8, peak=None, mfu=0.42, flops_source="test"),
            MfuRecord("decode", 1.0, 1.0, achieved_tflops=0.1, peak=None, mfu=0.01, flops_source="test"),
        ),
        efficiency=(
            StageEfficiency(
                stage="decode",
                time_ms=1.0,
                flops=1.0,
                bytes=1.0,
                arithmetic_intensity=None,
                ridge_point=None,
                bound=None,
                mfu=None,
                mbu=0.6,
                speed_of_light_ms=None,
                gap=1.7,
                flops_source="test",
            ),
        ),
        throughput=Throughput(decode_tokens_per_s=1000 / step, e2e_images_per_s=1.0, e2e_tokens_per_s=1.0),
    )


def _job(sweep: Path, num: int, overrides: list[str], state: str, metrics: Stage1Metrics | None, msg: str = "") -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    status = RunStatus("stage1", f"job{num}", state, started="2026-11-22T12:00:00+00:00", message=msg or None)
    save(status, job / "run_status.json")
    if metrics is not None:
        save(metrics, job / "metrics.json")
        (job / "report.md").write_text("# report\n")


def test_a_run_folder_is_not_summarised_as_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: an empty sweep summary was written into a run folder, exit 0."""
    run = tmp_path / "run"
    _job(tmp_path, 0, ["model=deepseek_ocr2_tiny"], "complete", _metrics(100.0, 80.0, 8))
    (tmp_path / "0").rename(run)
    before = sorted(p.name for p in run.iterdir())
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "holds no sweep jobs" in err and "it is a run folder" in err and "stage1-run -m" in err
    assert len(err.strip().splitlines()) == 1  # one paragraph
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written


def test_summarize_sweep_skips_failed_and_incomplete_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    base = ["model=deepseek_ocr2_tiny", "device=cpu"]
    _job(sweep, 0, [*base, "infer.max_new_tokens=8"], "complete", _metrics(100.0, 80.0, 8))
    _job(sweep, 1, [*base, "infer.max_new_tokens=16"], "failed", None, msg="CUDA out of memory")
    _job(sweep, 2, [*base, "infer.max_new_tokens=32"], "complete", None)  # no metrics.json
    _job(sweep, 3, [*base, "infer.max_new_tokens=64"], "complete", _metrics(110.0, 640.0, 64))
    (sweep / "4").mkdir()  # never started: no status, no overrides
    (sweep / "multirun.yaml").write_text("{}\n")  # not a job folder

    assert main([str(sweep)]) == 0
    md_path = Path(capsys.readouterr().out.strip())
    assert md_path == sweep / SUMMARY_MD and summarize_sweep(sweep) == md_path
    md = md_path.read_text()
    data = json.loads((sweep / SWEEP_SUMMARY_FILE).read_text())

    assert data["swept_keys"] == ["infer.max_new_tokens"]
    jobs = {j["num"]: j for j in data["jobs"]}
    assert [n for n, j in jobs.items() if j["skipped_reason"] is None] == [0, 3]
    assert jobs[1]["status"] == "failed" and "marked failed" in jobs[1]["skipped_reason"]
    assert jobs[1]["message"] == "CUDA out of memory"
    assert jobs[2]["skipped_reason"] == "no metrics.json"
    assert jobs[4]["skipped_reason"].startswith("no run_status.json")
    assert jobs[3]["metrics"]["decode_ms_per_token_p50"] == pytest.approx(10.0)

    assert "|0|8|complete|180.0|100.0|10.00|105.0|42.00%|416 TFLOP/s|60.00%|100.0|[report](0/report.md)|" in md
    assert "|3|64|complete|" in md
    assert "|1|16|failed|the run is marked failed, not complete|CUDA out of memory|" in md
    assert "|2|32|complete|no metrics.json||" in md
    assert "|4|?|unknown|no run_status.json" in md and jobs[4]["overrides"] is None
    assert (sweep / SUMMARY_PNG).read_bytes().startswith(PNG_MAGIC)


def test_swept_keys_ignore_shared_overrides(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _job(sweep, 0, ["device=cpu", "+x=1", "run.repeats=1"], "complete", _metrics(1.0, 1.0, 1))
    _job(sweep, 1, ["device=cpu", "+x=1", "run.repeats=2"], "complete", _metrics(1.0, 1.0, 1))
    summarize_sweep(sweep)
    data = json.loads((sweep / SWEEP_SUMMARY_FILE).read_text())
    assert data["swept_keys"] == ["run.repeats"]
    assert swept_keys([]) == []


def test_multirun_writes_sweep_summary_and_a_failing_job_does_not_stop_it(tmp_path: Path) -> None:
    """A real sweep through the Hydra callback: two jobs complete and one with a bad value fails cleanly; the summary
    lists all three and the command exits non-zero after writing it. (The launch check refuses a swept value out of its
    range before any job starts, and checks the model's positions on the first value only: 999,999 tokens, within the
    range but more than the tiny model's 8,192 positions, comes last, so only its own job can refuse it.) One multirun
    for both cases. In this process (Hydra's basic launcher runs the jobs in the command's own): the multirun's
    summary and exit code, not the console script's process."""
    sweep = tmp_path / "sweep"
    done = run_main(
        "llm_perf_opt.cli.stage1",
        "-m",
        "model=deepseek_ocr2_tiny",
        "device=cpu",
        "run.repeats=1",
        "infer.max_new_tokens=2,3,999999",
        "pipeline/torch_profiler=min",
        "dataset.max_images=1",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == SWEEP_FAILED_EXIT, done.stderr[-2000:]  # non-zero, after writing the summary
    assert "infer.max_new_tokens=999999 is more than the model takes" in done.stderr
    assert done.stderr.rstrip().endswith(
        f"error: 1 of 3 sweep job(s) did not complete: job 2 (failed). {sweep / 'sweep_summary.md'} lists the "
        "reason of each."
    )
    data = json.loads((sweep / SWEEP_SUMMARY_FILE).read_text())
    assert data["swept_keys"] == ["infer.max_new_tokens"]
    assert [j["swept"] for j in data["jobs"]] == [{"infer.max_new_tokens": v} for v in ("2", "3", "999999")]
    complete, failed = data["jobs"][:2], data["jobs"][2]
    assert all(j["status"] == "complete" and j["skipped_reason"] is None for j in complete)
    assert all(j["metrics"]["prefill_p50_ms"] > 0 and j["metrics"]["decode_ms_per_token_p50"] > 0 for j in complete)
    assert failed["status"] == "failed" and "infer.max_new_tokens=999999 is more than" in json.dumps(failed)
    md = (sweep / SUMMARY_MD).read_text()
    rows = [line for line in md.splitlines() if line.startswith("|") and "|complete|" in line]
    assert len(rows) == 2  # the failed job's row says "not complete"
    assert rows[0].startswith("|0|2|complete|") and rows[1].startswith("|1|3|complete|")
    assert "[report](0/report.md)" in md and "[report](1/report.md)" in md
    assert "|infer.max_new_tokens|" in md and "|model|" not in md  # only swept keys become columns
    assert (sweep / SUMMARY_PNG).read_bytes().startswith(PNG_MAGIC)
    assert (sweep / "0" / "report.md").is_file()
    # stdout's last line is the sweep summary's bare path, after each job's own summary
    lines = done.stdout.splitlines()
    assert lines[-1] == str(sweep / "sweep_summary.md")
    assert str(sweep / "0" / "report.md") in lines

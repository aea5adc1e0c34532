"""End-to-end `perf-whatif` on the tiny model (CPU) with a user preset: the baseline, a lever that helps or not,
a rung that crashes, a CUDA-only lever skipped, a lever refused by validation, a workload-changing lever; a failing
baseline; and SIGTERM mid-rung."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import preset_dir, run_main, run_whatif, wait_for_log
from llm_perf_opt.measure.outputs import load_top_two
from llm_perf_opt.records.folders import load_stage1, read_status
from llm_perf_opt.records.io import load_file
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    FAILED,
    INTERRUPTED,
    INVALID,
    MEASURED,
    SKIPPED,
    WhatIfRecord,
)

#: Runs the console scripts in child processes (seconds to a minute each).
pytestmark = pytest.mark.slow

PRESET = """\
name: tiny-test
objective: decode_ms_per_token
levers:
  static_cache:
    about: static KV cache
    overrides: [runtime.kv_cache=static]
  too_short_cache:
    about: a static cache shorter than the prompt (fails while running)
    overrides: [runtime.kv_cache=static, runtime.static_cache_len=4]
  graphs:
    overrides: [runtime.kv_cache=static, runtime.compile=decode, runtime.compile_mode=reduce-overhead]
    needs: cuda
  misspelt:
    overrides: [runtime.kv_cahce=static]
  one_tile_less:
    overrides: [model.preprocess.max_tiles=2]
    changes: workload
"""
WORKLOAD = (
    "model=deepseek_ocr_tiny",
    "run.repeats=3",
    "run.warmup=0",
    "infer.max_new_tokens=3",
    "pipeline.torch_profiler.enable=false",
)


whatif = run_whatif


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return preset_dir(tmp_path_factory.mktemp("levers"), "tiny_test", PRESET)


@pytest.fixture(scope="module")
def ladder(config_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("whatif") / "run"
    done = whatif(config_dir, "whatif=tiny_test", *WORKLOAD, "whatif_run.reuse_model=true", f"hydra.run.dir={out}")
    return out, done


def test_every_rung_ends_as_it_should(ladder: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = ladder
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_status(out).state == "complete"
    record = load_file(out / "whatif.json", WhatIfRecord)
    rungs = {r.name: r for r in record.rungs}
    assert rungs["baseline"].phase == BASELINE and rungs["baseline"].state == MEASURED
    assert rungs["static_cache"].phase == ALONE and rungs["static_cache"].state == MEASURED
    # outputs against the baseline: a static cache gives exactly the dynamic cache's tokens and logits on CPU
    outputs = rungs["static_cache"].outputs
    assert outputs is not None and outputs.identical and outputs.compared_tokens == 3
    assert outputs.prefill_logits_max_abs_diff is not None and outputs.prefill_logits_max_abs_diff < 1e-4
    speedup = rungs["static_cache"].speedup
    assert speedup is not None and speedup.ci95_low is not None  # 3 passes each: an interval
    # the crash is recorded with the run's own message; the ladder went on
    assert rungs["too_short_cache"].state == FAILED
    assert "static_cache_len" in (rungs["too_short_cache"].reason or "")
    assert rungs["graphs"].state == SKIPPED and "CUDA" in (rungs["graphs"].reason or "")
    assert rungs["misspelt"].state == INVALID and "runtime.kv_cache" in (rungs["misspelt"].reason or "")
    assert rungs["one_tile_less"].changes_workload and rungs["one_tile_less"].state == MEASURED
    # the workload-changing lever is never stacked on the ladder
    assert all("one_tile_less" not in r.levers for r in record.rungs if r.phase == "ladder")
    assert {v.lever for v in record.verdicts} == {
        "static_cache",
        "too_short_cache",
        "graphs",
        "misspelt",
        "one_tile_less",
    }
    for rung in record.rungs:
        if rung.state == MEASURED and rung.reused is None:
            assert rung.folder is not None and read_status(out / rung.folder).state == "complete"
            assert (out / rung.folder / "prefill_logits.pt").is_file()
            # rungs write records only; the what-if renders each once at its end, in a forked process
            assert (out / rung.folder / "report.md").is_file()
            assert (out / "logs" / f"render-{Path(rung.folder).name}.log").is_file()
    assert (out / "whatif.md").is_file()
    # the baseline alone keeps the top two logits behind its tokens, by which departures are judged near-ties or not
    assert record.near_tie_tolerance == 0.01
    top2 = load_top_two(out / str(rungs["baseline"].folder))
    assert len(top2) == 1 and all(len(t.ids) == 3 for t in top2.values())
    assert not (out / str(rungs["static_cache"].folder) / "top2_logits.json").exists()
    assert "its top logit and the rung took the other one (a near-tie" in (out / "whatif.md").read_text()


def test_the_last_line_is_whatif_md_after_the_time_budget_by_phase(
    ladder: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = ladder
    lines = done.stdout.splitlines()
    assert lines[-1] == str(out / "whatif.md")
    budget = load_file(out / "whatif.json", WhatIfRecord).time_budget
    assert budget is not None and lines[-2].strip() == budget.line
    parts = {p.name: p.seconds for p in budget.parts}
    assert {"start", "baseline", "levers", "reports", "other"} <= set(parts)
    assert all(seconds >= 0 for seconds in parts.values()) and sum(parts.values()) == pytest.approx(budget.total_s)
    assert budget.note is not None and "rung(s)" in budget.note


def test_a_finished_folder_is_judged_again_from_its_rung_folders(
    ladder: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """`python -m llm_perf_opt.pipeline.whatif_judge <folder>`: the rungs judged again from their folders by the
    analysis the run judged them with give exactly the run's record (each attribution against the rung it was
    attributed against; a reused ladder rung with that of the rung it reuses), and the report is rewritten."""
    import shutil

    from llm_perf_opt.pipeline.whatif_judge import main

    out, done = ladder
    assert done.returncode == 0, done.stderr[-3000:]
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    (copy / "whatif.md").unlink()
    main([str(copy)])
    before = load_file(out / "whatif.json", WhatIfRecord)
    record = load_file(copy / "whatif.json", WhatIfRecord)
    assert record == before and (copy / "whatif.md").read_text() == (out / "whatif.md").read_text()
    for rung in record.rungs:
        if rung.state == MEASURED and rung.phase != BASELINE:
            assert rung.judgements and rung.attribution is not None
        if rung.reused is not None:
            source = record.rung(rung.reused)
            assert source is not None and rung.attribution == source.attribution


def test_the_rungs_build_the_model_once(ladder: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """The baseline builds and saves the random-weights model; every later rung loads it (issue 25); the run's
    saved model is gone once it ends."""
    out, done = ladder
    assert done.returncode == 0, done.stderr[-3000:]
    logs = sorted((out / "logs").glob("*.log"))
    said = {log.name: log.read_text(errors="replace") for log in logs}
    assert "saved the model to" in said[logs[0].name]
    loaded = [name for name, text in said.items() if "model loaded from the saved model cache" in text]
    assert len(loaded) >= 2 and logs[0].name not in loaded
    assert not any("saved the model to" in text for name, text in said.items() if name != logs[0].name)
    assert not (out / "model_cache").exists()
    record = load_file(out / "whatif.json", WhatIfRecord)
    measured = [r for r in record.rungs if r.state == MEASURED and r.reused is None and r.folder]
    details = [load_stage1(out / str(r.folder)).metrics.model.weights_detail for r in measured]
    assert sum("loaded from the run's saved model cache" in d for d in details) == len(details) - 1


def test_a_failing_baseline_stops_the_run(config_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = whatif(config_dir, "whatif=tiny_test", *WORKLOAD, "model.path=/does/not/exist", f"hydra.run.dir={out}")
    assert done.returncode == 2
    assert "baseline failed" in done.stderr
    assert read_status(out).state == "failed"
    record = load_file(out / "whatif.json", WhatIfRecord)
    rungs = {r.name: r for r in record.rungs}
    assert rungs["baseline"].state == FAILED and "/does/not/exist" in (rungs["baseline"].reason or "")
    assert rungs["static_cache"].state == SKIPPED and "baseline failed" in (rungs["static_cache"].reason or "")


# A lever whose rung runs long enough to be stopped mid-way, and one that the stop leaves unstarted.
STOPPED_PRESET = """\
name: tiny-stopped
objective: decode_ms_per_token
levers:
  many_passes:
    about: forty timed passes, stopped by SIGTERM after a few
    overrides: [run.repeats=40]
  never_started:
    overrides: [runtime.kv_cache=static]
"""


@pytest.mark.slow
def test_sigterm_mid_rung_keeps_the_rungs_passes(tmp_path: Path) -> None:
    """A scheduler's stop (SIGTERM) ends the run as interrupted; the rung in flight is stopped, writes the passes it
    measured and is recorded as interrupted with them (before: the rung died at once, left `running` with no
    figures, and the record called it "pending: not run yet")."""
    config_dir = preset_dir(tmp_path / "levers", "tiny_stopped", STOPPED_PRESET)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "llm_perf_opt.cli.whatif", "--config-dir", str(config_dir), "whatif=tiny_stopped"]
    process = subprocess.Popen(
        [*args, *WORKLOAD, f"hydra.run.dir={out}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_log(out / "logs", "repeat 2/40", process, timeout_s=600)  # the lever's rung has measured 2 passes
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 130, err[-3000:]
    status = read_status(out)
    assert status.state == "interrupted" and status.message == "stopped by SIGTERM; the rungs so far were written"
    record = load_file(out / "whatif.json", WhatIfRecord)
    assert record.baseline is not None and record.baseline.state == MEASURED
    assert any("did not finish" in note for note in record.notes)
    rungs = {r.name: r for r in record.rungs}
    stopped = rungs["many_passes"]
    assert stopped.state == INTERRUPTED and stopped.folder is not None
    figures = stopped.figures
    assert figures is not None and 2 <= figures.objective.n < 40  # the passes it measured, one value each
    assert f"stopped with the what-if run after {figures.objective.n} of 40 timed passes" in (stopped.reason or "")
    assert stopped.speedup is None  # a partial rung is not judged against the baseline
    rung = read_status(out / stopped.folder)
    assert (rung.state, rung.message) == ("interrupted", "stopped by SIGTERM; results so far were written")
    assert rungs["never_started"].state == SKIPPED
    assert rungs["never_started"].reason == "not run: the what-if run was stopped first"
    assert not (out / "rungs" / "02-never_started").exists()
    report = (out / "whatif.md").read_text()
    assert "pending" not in report and "not run yet" not in report
    assert f"interrupted: stopped with the what-if run after {figures.objective.n} of 40 timed passes" in report
    folders = sorted((out / "rungs").iterdir())
    assert len(folders) >= 2  # the baseline's and the stopped lever's
    for folder in folders:  # no rung folder is left claiming to run (one stopped before it started has no status)
        if (folder / "run_status.json").is_file():
            assert read_status(folder).state != "running"


def test_a_lever_name_that_is_a_path_is_refused_before_any_rung(tmp_path: Path) -> None:
    """A lever named like a path once wrote its rung's folder and log two levels above the what-if folder, exit 0."""
    escaping = "x/../../../../escaped_whatif"
    preset = f"name: evil\nobjective: decode_ms_per_token\nlevers:\n  {escaping}:\n    overrides: [run.warmup=0]\n"
    config = preset_dir(tmp_path / "levers", "evil", preset)
    out = tmp_path / "a" / "b" / "run"
    done = run_main(
        "llm_perf_opt.cli.whatif", "--config-dir", str(config), "whatif=evil", *WORKLOAD, f"hydra.run.dir={out}"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().endswith(
        f"error: the lever '{escaping}' has a name that cannot name its rung's folder and log: a lever name takes "
        "letters, digits, _ and - only. Rename the lever in the what-if preset (whatif.levers), e.g. to "
        "x_escaped_whatif."
    )
    assert not [p for p in tmp_path.rglob("*escaped_whatif*")]
    assert not out.exists()  # refused when the config is composed (check_whatif_settings), before any folder

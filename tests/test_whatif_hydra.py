"""`perf-whatif whatif_run.launcher=hydra`: each phase one `stage1-run -m` multirun whose rungs are generated
configs; the rung folders, record and report come out as with the local launcher. On CPU with the tiny model and
Hydra's basic launcher (joblib too where its plugin is installed)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import attrs
import pytest
import torch
import yaml

from helpers import preset_dir, run_whatif
from llm_perf_opt.pipeline import whatif_hydra
from llm_perf_opt.pipeline.whatif_hydra import NotExpressible, phase_command, run_phase, rung_config
from llm_perf_opt.pipeline.whatif_rungs import PAST_LIMIT_FIX, RungJob
from llm_perf_opt.records import common
from llm_perf_opt.records.folders import load_stage1, read_status
from llm_perf_opt.records.io import load_file
from llm_perf_opt.records.whatif import ALONE, BASELINE, INVALID, LADDER, MEASURED, PENDING, WhatIfRecord
from llm_perf_opt.report.whatif_report import launcher_text
from whatif_fixtures import realistic

#: Runs the console scripts in child processes (seconds to a minute each).
pytestmark = pytest.mark.slow

PRESET = """\
name: two-levers
objective: decode_ms_per_token
levers:
  static_cache:
    overrides: [runtime.kv_cache=static]
  profiler_min:
    about: a config-group lever (the min profiler preset)
    overrides: [pipeline/torch_profiler=min]
  deleted_key:
    about: a deletion, which a rung config cannot express
    overrides: [~model.preprocess.device=cpu]
"""
WORKLOAD = ("model=deepseek_ocr_tiny", "run.repeats=1", "run.warmup=0", "infer.max_new_tokens=2")


# ---- overrides -> rung configs ---------------------------------------------------------------------------
def test_values_keep_their_types_and_nest() -> None:
    text = rung_config(
        "01-x",
        [
            "runtime.kv_cache=static",
            "run.repeats=5",
            "run.cv_warn=0.25",
            "run.save_prefill_logits=true",
            "+run.extra=[1,2]",
            "model.path=null",
            "model.preprocess.max_tiles=2",
        ],
    )
    assert text.startswith("# @package _global_\n")
    body = yaml.safe_load(text)
    assert body == {
        "runtime": {"kv_cache": "static"},
        "run": {"repeats": 5, "cv_warn": 0.25, "save_prefill_logits": True, "extra": [1, 2]},
        "model": {"path": None, "preprocess": {"max_tiles": 2}},
    }


def test_a_group_choice_becomes_a_defaults_override() -> None:
    body = yaml.safe_load(rung_config("02-g", ["pipeline/torch_profiler=max", "model=deepseek_ocr2_tiny"]))
    assert body == {
        "defaults": [{"override /pipeline/torch_profiler": "max"}, {"override /model": "deepseek_ocr2_tiny"}, "_self_"]
    }


def test_the_baseline_config_is_empty() -> None:
    assert yaml.safe_load(rung_config("00-baseline", [])) is None


@pytest.mark.parametrize(
    ("name", "levers", "workload", "said"),
    [
        ("03-d", ["~run.cv_warn"], (), "deletes a key"),
        ("03-d", ["~run.cv_warn=0.1"], (), "deletes a key"),
        ("03-s", ["run.repeats=1,2"], (), "cannot be written"),
        ("03-h", ["hydra.job.chdir=true"], (), "cannot be written"),
        ("03-w", ["runtime.kv_cache=static"], ("runtime.kv_cache=dynamic",), "the workload overrides set too"),
        ("03 bad name", ["runtime.kv_cache=static"], (), "cannot name a config file"),
    ],
)
def test_what_a_rung_config_cannot_express_is_refused(
    name: str, levers: list[str], workload: tuple[str, ...], said: str
) -> None:
    with pytest.raises(NotExpressible, match=said) as raised:
        rung_config(name, levers, workload)
    assert "whatif_run.launcher=local" in str(raised.value)


def _job(tmp_path: Path, name: str, workload: tuple[str, ...] = WORKLOAD, levers: tuple[str, ...] = ()) -> RungJob:
    return RungJob(name, workload, levers, tmp_path / "rungs" / name, tmp_path / "logs" / "phase.log")


def test_the_phase_command_sweeps_the_rung_configs_into_the_rung_folders(tmp_path: Path) -> None:
    jobs = [_job(tmp_path, "00-baseline"), _job(tmp_path, "01-static_cache", levers=("runtime.kv_cache=static",))]
    command = phase_command(jobs, [], tmp_path / "rung_configs", tmp_path / "rungs")
    assert command[command.index("--config-dir") + 1] == str(tmp_path / "rung_configs")
    assert "+whatif_rung=00-baseline,01-static_cache" in command
    assert "hydra.sweep.subdir=${hydra:runtime.choices.whatif_rung}" in command
    assert f"hydra.sweep.dir={tmp_path / 'rungs'}" in command
    assert "runtime.kv_cache=static" not in command  # in the rung's config, not on the command line
    assert whatif_hydra.JOB_DEVICE not in command  # the basic launcher runs one job at a time
    joblib = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    assert whatif_hydra.JOB_DEVICE in phase_command(jobs, joblib, tmp_path, tmp_path)
    pinned = [_job(tmp_path, "00-baseline", workload=(*WORKLOAD, "device=cuda:1"))]
    assert whatif_hydra.JOB_DEVICE not in phase_command(pinned, joblib, tmp_path, tmp_path)
    assert command[-2:] != joblib and phase_command(jobs, joblib, tmp_path, tmp_path)[-2:] == joblib


def test_a_phase_past_its_limit_is_stopped_and_its_rungs_failed(tmp_path: Path) -> None:
    # Rungs long enough that neither can end within the stop's grace period: on a loaded machine the SIGTERM can reach
    # the multirun before its jobs run and be lost (the first CI run of 2026-11-26 saw both rungs complete); then
    # SIGKILL ends it after the grace period, and the rungs still count as failed.
    slow = tuple("run.repeats=400" if o == "run.repeats=1" else o for o in WORKLOAD)
    jobs = [
        _job(tmp_path, "00-baseline", workload=slow),
        _job(tmp_path, "01-static_cache", workload=slow, levers=("runtime.kv_cache=static",)),
    ]
    started = time.monotonic()
    outcomes = run_phase(jobs, [], tmp_path / "logs" / "phase-alone.log", timeout_s=1.0)
    assert time.monotonic() - started < 60
    assert {o.state for o in outcomes.values()} == {common.FAILED}
    assert all("ran past its limit (2 s" in (o.message or "") for o in outcomes.values())
    assert all(PAST_LIMIT_FIX in (o.message or "") for o in outcomes.values())  # and what to do about it
    for job in jobs:  # no rung folder is left claiming to run
        if (job.folder / "run_status.json").is_file():
            assert read_status(job.folder).state == common.FAILED
    assert (tmp_path / "rung_configs" / "whatif_rung" / "01-static_cache.yaml").is_file()


# ---- end to end ------------------------------------------------------------------------------------------
whatif = run_whatif


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return preset_dir(tmp_path_factory.mktemp("levers"), "two_levers", PRESET)


@pytest.fixture(scope="module")
def hydra_run(config_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif") / "hydra"
    done = whatif(config_dir, "whatif=two_levers", *WORKLOAD, "whatif_run.launcher=hydra", f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _shape(out: Path, record: WhatIfRecord) -> dict[str, tuple[str, str, str | None, tuple[str, ...]]]:
    """Per baseline/alone rung: phase, state, folder and the files its folder holds (logs aside)."""
    shape = {}
    for rung in record.rungs:
        if rung.phase in (BASELINE, ALONE):
            files: tuple[str, ...] = ()
            if rung.folder is not None:
                found = (out / rung.folder).rglob("*")
                files = tuple(sorted(p.relative_to(out / rung.folder).as_posix() for p in found if p.is_file()))
            shape[rung.name] = (rung.phase, rung.state, rung.folder, files)
    return shape


def test_the_hydra_launcher_runs_every_phase(hydra_run: Path) -> None:
    out = hydra_run
    assert read_status(out).state == "complete"
    record = load_file(out / "whatif.json", WhatIfRecord)
    assert record.launcher == "hydra" and record.launcher_overrides == ()
    rungs = {r.name: r for r in record.rungs}
    assert rungs["baseline"].state == MEASURED and rungs["baseline"].folder == "rungs/00-baseline"
    assert rungs["static_cache"].state == MEASURED and rungs["static_cache"].folder == "rungs/01-static_cache"
    outputs = rungs["static_cache"].outputs
    assert outputs is not None and outputs.identical and outputs.compared_tokens == 2
    # the config-group lever really ran with its preset: the min profiler profiles 2 decode steps, not 4
    assert rungs["profiler_min"].state == MEASURED
    chosen = yaml.safe_load((out / "rungs" / "02-profiler_min" / "config.yaml").read_text())
    assert chosen["pipeline"]["torch_profiler"]["decode_steps"] == 2
    baseline_cfg = yaml.safe_load((out / "rungs" / "00-baseline" / "config.yaml").read_text())
    assert baseline_cfg["pipeline"]["torch_profiler"]["decode_steps"] == 4
    # the basic launcher ran both levers in one process: the second started clean and says so
    second = load_stage1(out / "rungs" / "02-profiler_min").metrics
    assert second.host_peak_rss_bytes is None and any("reused launcher worker" in w for w in second.warnings)
    assert load_stage1(out / "rungs" / "01-static_cache").metrics.host_peak_rss_bytes is not None
    no_mod = rungs["deleted_key"]
    assert no_mod.state == INVALID and "whatif_run.launcher=local" in (no_mod.reason or "")
    for rung in record.rungs:
        if rung.state == MEASURED and rung.reused is None:
            assert rung.wall_s is not None and rung.wall_s >= 0  # from the folder's start and end
            assert (out / str(rung.folder) / "prefill_logits.pt").is_file()
        if rung.phase == LADDER and rung.reused is None:
            assert rung.state == MEASURED and (out / "logs" / "phase-ladder.log").is_file()
    assert (out / "logs" / "phase-baseline.log").is_file() and (out / "logs" / "phase-alone.log").is_file()
    assert not (out / "rungs" / "sweep_summary.md").exists()  # the sweep callbacks are off in a phase
    report = (out / "whatif.md").read_text()
    assert "Hydra's basic launcher" in report and "deleted_key" in report


def test_the_rungs_come_out_as_with_the_local_launcher(hydra_run: Path, config_dir: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    done = whatif(config_dir, "whatif=two_levers", *WORKLOAD, "whatif_run.ladder=false", f"hydra.run.dir={local}")
    assert done.returncode == 0, done.stderr[-3000:]
    local_record = load_file(local / "whatif.json", WhatIfRecord)
    hydra_record = load_file(hydra_run / "whatif.json", WhatIfRecord)
    assert local_record.launcher == "local"
    local_shape, hydra_shape = _shape(local, local_record), _shape(hydra_run, hydra_record)
    assert local_shape.keys() == hydra_shape.keys() == {"baseline", "static_cache", "profiler_min", "deleted_key"}
    assert local_shape["deleted_key"][1] != INVALID  # the local launcher passes a deletion to the rung, which runs
    del local_shape["deleted_key"], hydra_shape["deleted_key"]
    assert local_shape == hydra_shape


def test_sigterm_stops_the_phase_and_keeps_what_was_measured(config_dir: Path, tmp_path: Path) -> None:
    """A scheduler's stop (SIGTERM) during the levers' multirun stops it: the run ends interrupted with the
    baseline measured, and no rung folder is left claiming to run."""
    import signal
    import sys

    out = tmp_path / "run"
    args = [sys.executable, "-m", "llm_perf_opt.cli.whatif", "--config-dir", str(config_dir), "whatif=two_levers"]
    process = subprocess.Popen(
        [*args, *WORKLOAD, "whatif_run.launcher=hydra", f"hydra.run.dir={out}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while not (out / "rungs" / "01-static_cache").is_dir() and time.monotonic() < deadline:  # the levers' phase
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=300)
    assert process.returncode == 130
    assert read_status(out).state == "interrupted"
    record = load_file(out / "whatif.json", WhatIfRecord)
    assert record.baseline is not None and record.baseline.state == MEASURED
    assert all(r.state != PENDING for r in record.rungs)  # each stopped rung as its folder tells, or not run
    for folder in (out / "rungs").iterdir():
        if (folder / "run_status.json").is_file():
            assert read_status(folder).state != "running", folder.name
    if shutil.which("pgrep"):
        time.sleep(1)
        running = subprocess.run(["pgrep", "-f", f"hydra.sweep.dir={out / 'rungs'}"], capture_output=True, text=True)
        assert running.stdout.strip() == ""  # the multirun and its workers were stopped


def test_the_report_says_how_the_rungs_ran() -> None:
    old = realistic()
    assert launcher_text(old) is None  # a record that does not say: nothing added
    joblib = attrs.evolve(
        old, launcher="hydra", launcher_overrides=("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    )
    text = launcher_text(joblib) or ""
    assert "joblib launcher" in text and "`hydra.launcher.n_jobs=2`" in text and "reuses its worker" in text
    local = launcher_text(attrs.evolve(old, launcher="local")) or ""
    assert "perf-whatif" in local and "at a time" not in local
    spread = launcher_text(attrs.evolve(old, launcher="local", devices=("cuda:0", "cuda:1"))) or ""
    assert "up to 2 at a time, one per device (cuda:0, cuda:1" in spread
    assert "shared this host's CPU cores" in spread and "`whatif_run.devices=null`" in spread


def test_the_joblib_launcher_runs_the_levers_at_once(config_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = tmp_path / "joblib"
    done = whatif(
        config_dir,
        "whatif=two_levers",
        *WORKLOAD,
        "whatif_run.launcher=hydra",
        'whatif_run.hydra_launcher=["hydra/launcher=joblib","hydra.launcher.n_jobs=2"]',  # quoted: they hold =
        "whatif_run.ladder=false",
        "whatif_run.exclude=[deleted_key]",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = load_file(out / "whatif.json", WhatIfRecord)
    assert record.launcher_overrides == ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert {r.name: r.state for r in record.rungs} == {
        n: MEASURED for n in ("baseline", "static_cache", "profiler_min")
    }
    assert "Joblib.Parallel(n_jobs=2" in (out / "logs" / "phase-alone.log").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_joblib_jobs_on_two_gpus_claim_one_each(config_dir: Path, tmp_path: Path) -> None:
    """Two levers at once on two GPUs: each rung runs on its own GPU, the one its job claimed."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = tmp_path / "joblib-gpus"
    done = whatif(
        config_dir,
        "whatif=two_levers",
        *WORKLOAD,
        "whatif_run.launcher=hydra",
        'whatif_run.hydra_launcher=["hydra/launcher=joblib","hydra.launcher.n_jobs=2"]',
        "whatif_run.ladder=false",
        "whatif_run.exclude=[deleted_key]",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    devices = {
        name: yaml.safe_load((out / "rungs" / name / "config.yaml").read_text())["device"]
        for name in ("01-static_cache", "02-profiler_min")
    }
    assert set(devices.values()) == {"cuda:0", "cuda:1"}, devices

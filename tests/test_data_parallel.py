"""Data parallel over GPUs (`run.data_parallel`): the combination of per-process records (pure functions over
synthetic wall-clock windows), the shards' inputs and meetings, the summary read from run folders (a launcher's and
a sweep's), its Markdown; one end-to-end run of two CPU processes (slow) and one of two GPUs (gpu)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import attrs
import pytest
import torch

from helpers import FIXTURES, TINY_STAGE1, run_cli, run_main
from llm_perf_opt.config_schema import RunSchema
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.data_parallel import (
    ShardRun,
    combine,
    common_window,
    pages_within,
    single_gpu_from_run,
    span_rate,
)
from llm_perf_opt.pipeline.data_parallel import (
    core_shares,
    resummarize,
    shard_command,
    shard_devices,
    single_gpu,
    summarize_folders,
    summarize_sweep_shards,
)
from llm_perf_opt.pipeline.shard import READY, ShardSync, shard_inputs, shard_of
from llm_perf_opt.records.common import RunStatus
from llm_perf_opt.records.data_parallel import (
    DATA_PARALLEL_FILE,
    PassWindow,
    ShardFigures,
    ShardInfo,
    SingleGpu,
    load_data_parallel,
)
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.io import save
from llm_perf_opt.report.data_parallel_report import data_parallel_markdown, scaling_table

T0 = 1_800_000_000.0  # a wall-clock origin (seconds since the epoch)
METRICS = load_stage1_metrics(FIXTURES / "compare" / "h100_s1sol" / "metrics.json")


def _passes(start: float, seconds: float, count: int, pages: int = 32) -> tuple[PassWindow, ...]:
    """`count` back-to-back passes of `seconds` each from T0 + start, `pages` inputs each."""
    return tuple(PassWindow(T0 + start + i * seconds, T0 + start + (i + 1) * seconds, pages) for i in range(count))


def _run(shard: int, windows: tuple[PassWindow, ...], device: str | None = None, **kw: object) -> ShardRun:
    figures = ShardFigures(shard=shard, folder=f"shard-{shard}", status="complete", device=device or f"cuda:{shard}")
    return ShardRun(attrs.evolve(figures, **kw), windows)


# ---- the combination --------------------------------------------------------------------------------------
def test_common_window_is_the_time_every_process_was_timing() -> None:
    assert common_window([(0.0, 10.0), (2.0, 12.0), (1.0, 9.0)]) == (2.0, 9.0)
    assert common_window([(0.0, 5.0), (5.0, 9.0)]) is None  # touching is not overlapping
    assert common_window([]) is None


def test_pages_within_counts_a_cut_pass_by_its_share_inside() -> None:
    windows = _passes(0.0, 2.0, 3, pages=10)  # 0-2, 2-4, 4-6 s
    assert pages_within(windows, T0 + 1.0, T0 + 5.0) == pytest.approx(5 + 10 + 5)
    assert pages_within(windows, T0 + 10.0, T0 + 11.0) == 0.0


def test_combined_rate_is_the_sum_of_each_process_over_the_common_window() -> None:
    # GPU 0: 32 pages every 2 s from t=0 to 10; GPU 1: 32 pages every 4 s from t=1 to 13 -> window 1..10 s
    runs = [_run(1, _passes(1.0, 4.0, 3)), _run(0, _passes(0.0, 2.0, 5))]
    single = SingleGpu(16.0, "given")
    summary = combine("dp", 2, runs, single)
    assert summary.problem is None
    assert (summary.window_start_s, summary.window_end_s) == (T0 + 1.0, T0 + 10.0)
    gpu0, gpu1 = summary.shards  # in shard order
    assert gpu0.window_pages == pytest.approx(16 + 32 * 4)  # half of 0-2, then 2-4 .. 8-10
    assert gpu1.window_pages == pytest.approx(32 + 32 + 32 * 1 / 4)  # 1-5, 5-9, a quarter of 9-13
    assert gpu0.window_pages_per_s == pytest.approx(144 / 9)
    assert summary.combined_pages_per_s == pytest.approx((144 + 72) / 9)
    assert summary.scaling_efficiency == pytest.approx((216 / 9) / (2 * 16.0))
    assert (gpu0.timed_from_s, gpu0.timed_to_s, gpu0.passes) == (T0, T0 + 10.0, 5)


def test_processes_that_did_not_time_at_once_get_no_combined_figure() -> None:
    summary = combine("dp", 2, [_run(0, _passes(0.0, 2.0, 2)), _run(1, _passes(30.0, 2.0, 2))], SingleGpu(16, "x"))
    assert summary.combined_pages_per_s is None and summary.scaling_efficiency is None
    assert summary.problem is not None and "did not time at the same time" in summary.problem
    assert "shard 1 30.0–34.0 s" in summary.problem
    md = data_parallel_markdown(summary)
    assert "**No combined pages/s**" in md and "pages/s** from" not in md


def test_a_failed_or_missing_process_leaves_no_combined_figure() -> None:
    failed = _run(1, (), skipped_reason="marked failed: out of memory")
    summary = combine("dp", 3, [_run(0, _passes(0.0, 2.0, 2)), failed])
    assert summary.combined_pages_per_s is None
    assert summary.problem is not None
    assert "1 of 3 processes" in summary.problem and "out of memory" in summary.problem
    assert "shard 2: no run" in summary.problem


def test_two_processes_on_one_gpu_are_not_data_parallel() -> None:
    runs = [_run(0, _passes(0.0, 2.0, 2), "cuda:0"), _run(1, _passes(0.0, 2.0, 2), "cuda:0")]
    summary = combine("dp", 2, runs)
    assert (
        summary.problem is not None and "shared a GPU" in summary.problem and "shards 0, 1 on cuda:0" in summary.problem
    )
    cpu = combine("dp", 2, [_run(0, _passes(0.0, 2.0, 2), "cpu"), _run(1, _passes(0.0, 2.0, 2), "cpu")])
    assert cpu.problem is None  # processes on the CPU share it by design


def test_a_process_without_wall_clock_times_is_left_out() -> None:
    summary = combine("dp", 2, [_run(0, _passes(0.0, 2.0, 2)), _run(1, ())])
    assert summary.shards[1].skipped_reason == "no wall-clock times of its timed passes"
    assert summary.combined_pages_per_s is None


def test_single_gpu_rate_is_pages_over_the_span_of_its_passes() -> None:
    windows = _passes(0.0, 2.0, 4, pages=8)
    assert span_rate(windows) == pytest.approx(32 / 8)
    found = single_gpu_from_run("gpu1", windows, 5.0)
    assert found is not None and found.pages_per_s == pytest.approx(4.0) and "32 pages" in found.source
    older = single_gpu_from_run("old", (), 5.0)
    assert older is not None and older.pages_per_s == 5.0 and "no wall-clock times" in older.source
    assert single_gpu_from_run("none", (), None) is None


# ---- the shards -------------------------------------------------------------------------------------------
def test_each_shard_takes_every_nth_input_or_all_when_too_few() -> None:
    items = list("abcdefg")
    assert shard_inputs(items, 0, 3) == (("a", "d", "g"), False)
    assert shard_inputs(items, 2, 3) == (("c", "f"), False)
    assert shard_inputs(["page"], 1, 4) == (("page",), True)


def test_shard_out_of_range_is_one_paragraph() -> None:
    assert shard_of(RunSchema(data_parallel=4, shard=3)) == 3
    assert shard_of(RunSchema(data_parallel=1)) is None
    with pytest.raises(UserError, match=r"run.shard=4 is not one of the 4 shards"):
        shard_of(RunSchema(data_parallel=4, shard=4))


def test_more_processes_than_gpus_is_refused_before_starting() -> None:
    assert shard_devices("auto", 2, 4) == ["cuda:0", "cuda:1"]
    assert shard_devices("cpu", 3, 0) == ["cpu"] * 3
    with pytest.raises(UserError) as raised:
        shard_devices("cuda", 4, 2)
    text = str(raised.value)
    assert "run.data_parallel=4" in text and "shows 2 GPUs" in text and "at most 2" in text and "\n" not in text
    with pytest.raises(UserError, match="names one device"):
        shard_devices("cuda:1", 2, 4)
    with pytest.raises(UserError, match="device=cpu"):
        shard_devices("auto", 2, 0)


def test_shard_command_replaces_the_keys_it_sets() -> None:
    cmd = shard_command(["model=x", "device=cuda", "run.data_parallel=2", "hydra.run.dir=/a"], 1, "cuda:1", Path("/b"))
    args = cmd[3:]
    assert args[:2] == ["model=x", "run.data_parallel=2"]
    assert args[2:4] == ["run.shard=1", "device=cuda:1"] and args[4].startswith("hydra.run.dir=")


def test_each_gpu_process_gets_its_own_share_of_the_host_cores() -> None:
    cuda = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert core_shares("none", cuda, range(64)) == ["1-15", "16-30", "31-45", "46-60"]  # core 0 left to the system
    assert core_shares("none", cuda[:2], range(4)) == ["0-1", "2-3"]  # too few to leave one: all are shared out
    assert core_shares("false", cuda, range(64)) == core_shares("none", cuda, range(64))  # off, as the pin reads it
    assert core_shares("auto", cuda, range(64)) == [None] * 4  # the user's own setting is kept
    assert core_shares("none", ["cpu", "cpu"], range(64)) == [None, None]  # CPU processes compute on every core
    assert core_shares("none", cuda, range(2)) == [None] * 4  # fewer cores than processes: not pinned
    cmd = shard_command(["run.cpu_affinity=none", "model=x"], 2, "cuda:2", Path("/b"), "31-45")
    assert "run.cpu_affinity=none" not in cmd and cmd[-2] == "run.cpu_affinity='31-45'"


def test_processes_meet_and_a_failed_one_releases_the_others(tmp_path: Path) -> None:
    run_dirs = [tmp_path / "run" / f"shard-{k}" for k in range(2)]
    syncs = [ShardSync.for_run(d, k, 2) for k, d in enumerate(run_dirs)]
    waiter = threading.Thread(target=syncs[0].meet, args=(READY, 30.0))
    waiter.start()
    syncs[1].meet(READY, 30.0)
    waiter.join(timeout=30)
    assert not waiter.is_alive() and syncs[0].note is None and READY in syncs[0].waited
    lone = ShardSync.for_run(tmp_path / "other" / "shard-0", 0, 2)
    lone.meet(READY, 0.05)  # shard 1 never comes: gives up with a note
    assert lone.note is not None and "shard 1" in lone.note
    gone = ShardSync.for_run(tmp_path / "third" / "shard-1", 1, 2)
    gone.abandon()
    waiting = ShardSync.for_run(tmp_path / "third" / "shard-0", 0, 2)
    waiting.meet(READY, 30.0)
    assert waiting.note is None


# ---- folders: a launcher's and a sweep's --------------------------------------------------------------------
def _folder(path: Path, shard: int | None, windows: tuple[PassWindow, ...], state: str = "complete") -> Path:
    path.mkdir(parents=True)
    save(
        RunStatus("stage1", path.name, state, started="2026-11-28T12:00:00+00:00", message=None),
        path / "run_status.json",
    )
    info = None if shard is None else ShardInfo(shard, 2, "host", f"cuda:{shard}", 1)
    save(attrs.evolve(METRICS, timed_windows=windows, data_parallel=info), path / "metrics.json")
    return path


def test_summary_from_the_launchers_folders_with_a_baseline_folder(tmp_path: Path) -> None:
    baseline = _folder(tmp_path / "gpu1", None, _passes(0.0, 2.0, 5))  # 160 pages over 10 s
    root = tmp_path / "dp"
    shards = {k: _folder(root / f"shard-{k}", k, _passes(0.0, 2.0, 5)) for k in range(2)}
    summary = summarize_folders(root, shards, 2, single_gpu(str(baseline)))
    assert summary.problem is None
    assert summary.combined_pages_per_s == pytest.approx(32.0)
    assert summary.scaling_efficiency == pytest.approx(1.0)
    assert [f.device for f in summary.shards] == ["cuda:0", "cuda:1"]
    with pytest.raises(UserError, match="one of 2 data-parallel processes"):
        single_gpu(str(shards[0]))
    assert single_gpu(12.5) == SingleGpu(12.5, "given: run.data_parallel_baseline=12.5 pages/s")


def test_sweep_over_run_shard_writes_the_data_parallel_summary(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for num in range(2):
        _folder(sweep / str(num), num, _passes(0.5 * num, 2.0, 5))
    overrides = {n: {"run.shard": str(n), "run.data_parallel": "2", "device": "${llo_job_device:}"} for n in range(2)}
    target = summarize_sweep_shards(sweep, overrides)
    assert target is not None and target.name == "data_parallel.md"
    summary = load_data_parallel(sweep / DATA_PARALLEL_FILE)
    assert summary.processes == 2 and summary.problem is None and summary.window_s == pytest.approx(9.5)
    assert summarize_sweep_shards(sweep, {0: {"model": "x"}}) is None  # not a data-parallel sweep
    mixed = {n: {**o, "infer.max_new_tokens": str(8 * (n + 1))} for n, o in overrides.items()}
    assert summarize_sweep_shards(sweep, mixed) is not None
    assert "varies only run.shard" in (load_data_parallel(sweep / DATA_PARALLEL_FILE).problem or "")
    again = resummarize(sweep)  # the shard folders read again: the sweep's problem stays
    assert again.problem is not None and "varies only run.shard" in again.problem


def test_markdown_and_scaling_table_show_each_gpu_the_sum_per_day_and_efficiency() -> None:
    runs = [_run(k, _passes(0.0, 2.0, 5)) for k in range(2)]
    summary = combine("dp", 2, runs, SingleGpu(16.0, "run folder gpu1"), "tiny model")
    md = data_parallel_markdown(summary)
    assert "**32.00 pages/s** from 2 processes" in md and "2.76 million pages per day" in md
    assert "Scaling efficiency **100.0%**" in md and "2 × 16.00 pages/s on one GPU" in md
    assert "|0|cuda:0|" in md and "|16.00|[report](shard-0/report.md)|" in md
    table = scaling_table([summary])
    assert "|2|16.00, 16.00|32.00|2.76 million|16.00|100.0%||dp|" in table


# ---- whole runs ---------------------------------------------------------------------------------------------
def _check_run(folder: Path, devices: list[str]) -> dict[str, object]:
    data = json.loads((folder / DATA_PARALLEL_FILE).read_text())
    assert data["problem"] is None, data["problem"]
    assert [s["device"] for s in data["shards"]] == devices
    assert all(s["status"] == "complete" and s["window_pages_per_s"] > 0 for s in data["shards"])
    assert data["combined_pages_per_s"] == pytest.approx(sum(s["window_pages_per_s"] for s in data["shards"]))
    assert data["window_end_s"] > data["window_start_s"]
    assert json.loads((folder / "run_status.json").read_text())["state"] == "complete"
    return data


@pytest.mark.slow
def test_two_cpu_processes_time_at_once(tmp_path: Path) -> None:
    """The coordinating stage1-run in this process (it starts the two shard processes; what it records is checked,
    not its own process)."""
    folder = tmp_path / "dp"
    proc = run_main(
        "llm_perf_opt.cli.stage1",
        *TINY_STAGE1,
        "run.data_parallel=2",
        "run.data_parallel_baseline=1.0",
        "pipeline.memory.enable=false",
        "pipeline.energy.enable=false",
        "report.render=false",
        f"hydra.run.dir={folder}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = _check_run(folder, ["cpu", "cpu"])
    assert data["scaling_efficiency"] is not None
    assert proc.stdout.strip().splitlines()[-1].endswith("data_parallel.md")
    assert "combined pages/s" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpus_time_at_once_against_one(tmp_path: Path) -> None:
    tiny = (
        "model=deepseek_ocr_tiny",
        "infer.max_new_tokens=16",
        "run.repeats=5",
        "pipeline.torch_profiler.enable=false",
    )
    one = run_cli("llm_perf_opt.cli.stage1", *tiny, "device=cuda:0", f"hydra.run.dir={tmp_path / 'gpu1'}")
    assert one.returncode == 0, one.stderr[-3000:]
    proc = run_cli(
        "llm_perf_opt.cli.stage1",
        *tiny,
        "run.data_parallel=2",
        f"run.data_parallel_baseline={tmp_path / 'gpu1'}",
        f"hydra.run.dir={tmp_path / 'gpu2'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = _check_run(tmp_path / "gpu2", ["cuda:0", "cuda:1"])
    assert data["scaling_efficiency"] is not None and data["scaling_efficiency"] > 0

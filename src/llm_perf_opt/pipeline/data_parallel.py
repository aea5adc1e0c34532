"""Data parallel over GPUs: `stage1-run run.data_parallel=N` starts N `stage1-run` processes at once, one per GPU
(`cuda:0` to `cuda:N-1`; `device=cpu`: N on the CPU), each with `run.shard=K` in `<run>/shard-K/` and its output in
`<run>/logs/shard-K.log`, then writes `data_parallel.json` and `data_parallel.md` in the run folder. A Hydra
multirun over `run.shard` (joblib, submitit) gets the same two files in its sweep folder from the sweep callback
(`summarize_sweep_shards`). The processes meet before their first and after their last timed pass (`pipeline.shard`).

Rebuild a folder's summary, or print the scaling table of several (`bench/data_parallel.sh`):
`python -m llm_perf_opt.pipeline.data_parallel <folder> [<folder> ...]`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from llm_perf_opt import artifacts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import CommandConfig
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.data_parallel import ShardRun, combine, single_gpu_from_run
from llm_perf_opt.override_text import override_key, quoted_override
from llm_perf_opt.pipeline.rung_forks import ENTRY_MODULE as STAGE1_MODULE
from llm_perf_opt.pipeline.shard import data_parallel_count
from llm_perf_opt.records.common import COMPLETE, RUNNING
from llm_perf_opt.records.data_parallel import (
    DATA_PARALLEL_FILE,
    DataParallelSummary,
    ShardFigures,
    SingleGpu,
    load_data_parallel,
)
from llm_perf_opt.records.folders import STATUS_FILE, Stage1Folder, load, read_status, skip_reason, writer_note
from llm_perf_opt.records.io import RecordError, save
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report.data_parallel_report import data_parallel_markdown, scaling_table

log = logging.getLogger("llm_perf_opt.data_parallel")

SUMMARY_MD = "data_parallel.md"
SHARD_PREFIX = "shard-"
LOGS_DIR = "logs"
SHARD_KEY, COUNT_KEY, BASELINE_KEY = "run.shard", "run.data_parallel", "run.data_parallel_baseline"
DEVICE_KEY, RUN_DIR_KEY, AFFINITY_KEY = "device", "hydra.run.dir", "run.cpu_affinity"
FAILED_EXIT = 1  # no combined figure: a process failed, or they did not time at once (after the summary is written)


# ---- the processes' devices --------------------------------------------------------------------------------
def shard_devices(device: str, count: int, visible_gpus: int) -> list[str]:
    """The device of each of `count` processes for the run's `device` setting: the first `count` GPUs (`auto`,
    `cuda`), or the CPU for each (`cpu`); UserError for more processes than GPUs, or a device naming one GPU."""
    spec = str(device).strip().lower()
    if spec == "cpu":
        return ["cpu"] * count
    if spec not in ("auto", "cuda"):
        raise UserError(
            f"run.data_parallel={count} runs one process per GPU, but device={device} names one device",
            "Leave device=auto (or cuda): the processes take cuda:0 to cuda:N-1; choose the GPUs with "
            "CUDA_VISIBLE_DEVICES, or use device=cpu for N processes on the CPU",
        )
    if count > visible_gpus:
        seen = f"{visible_gpus} GPU{'s' * (visible_gpus != 1)}" if visible_gpus else "no GPU"
        raise UserError(
            f"run.data_parallel={count} asks for {count} processes, one per GPU, but this machine shows {seen} "
            "(torch.cuda.device_count(), after CUDA_VISIBLE_DEVICES): two processes on one GPU would share it, "
            "and their pages/s would not be data parallel",
            f"Set run.data_parallel to at most {visible_gpus or 1}"
            + ("" if visible_gpus else ", or device=cpu to run the processes on the CPU"),
        )
    return [f"cuda:{k}" for k in range(count)]


def shard_command(
    overrides: Sequence[str], shard: int, device: str, folder: Path, cores: str | None = None
) -> list[str]:
    """One process's `stage1-run` command: the run's overrides (less those set here), its shard, device and folder,
    and its share of the host's cores (`cores`, as `run.cpu_affinity`) when given."""
    mine = {SHARD_KEY, DEVICE_KEY, RUN_DIR_KEY} | ({AFFINITY_KEY} if cores is not None else set())
    kept = [o for o in overrides if override_key(o) not in mine]
    pinned = [] if cores is None else [quoted_override(AFFINITY_KEY, cores)]
    return [
        sys.executable, "-m", STAGE1_MODULE, *kept,
        f"{SHARD_KEY}={shard}", f"{DEVICE_KEY}={device}", *pinned, quoted_override(RUN_DIR_KEY, folder),
    ]  # fmt: skip


def core_shares(setting: object, devices: Sequence[str], visible: Sequence[int]) -> list[str | None]:
    """Each process's cores as `run.cpu_affinity` where the run left it at none and the processes run on GPUs, so
    that N processes of one host do not crowd each other's torch threads; None for each to keep the user's setting."""
    from llm_perf_opt.session.cpu_affinity import format_cores, is_off, shares

    split = shares(visible, len(devices)) if is_off(setting) and all(d.startswith("cuda") for d in devices) else None
    return [None] * len(devices) if split is None else [format_cores(cores) for cores in split]


# ---- reading what the processes did ------------------------------------------------------------------------
def _status_figures(shard: int, folder: Path, relative: str) -> tuple[ShardFigures, Stage1Metrics | None]:
    """A process's folder: its figures so far (skipped with the reason where it did not complete), its metrics."""
    figures = ShardFigures(shard=shard, folder=relative, status="unknown")
    if not (folder / STATUS_FILE).is_file():
        return attrs.evolve(figures, skipped_reason="no run_status.json (the process never started its run)"), None
    try:
        status = read_status(folder)
    except RecordError as exc:
        return attrs.evolve(figures, skipped_reason=skip_reason(exc, folder)), None
    figures = attrs.evolve(figures, status=status.state, started=status.started, ended=status.ended)
    if status.state != COMPLETE:
        marked = f"marked {status.state}" + (f" ({writer_note(status)})" if status.state == RUNNING else "")
        return attrs.evolve(figures, skipped_reason=f"{marked}: {status.message or 'no message'}"), None
    try:
        loaded = load(folder)
    except RecordError as exc:
        return attrs.evolve(figures, skipped_reason=skip_reason(exc, folder)), None
    if not isinstance(loaded, Stage1Folder):
        return attrs.evolve(figures, skipped_reason=f"a {loaded.kind} folder, not a stage1-run"), None
    return figures, loaded.metrics


def read_shard(shard: int, folder: Path, root: Path) -> ShardRun:
    """One process's folder as the combination reads it."""
    figures, metrics = _status_figures(shard, folder, folder.relative_to(root).as_posix())
    if metrics is None:
        return ShardRun(figures)
    info = metrics.data_parallel
    figures = attrs.evolve(
        figures,
        device=info.device if info is not None else metrics.device.name,
        host=info.host if info is not None else None,
        inputs=info.inputs if info is not None else len(metrics.images),
        replicated=info.replicated if info is not None else False,
        pages_per_s_alone=metrics.pages.pages_per_s.p50 if metrics.pages is not None else None,
    )
    if info is not None and info.shard != shard:
        figures = attrs.evolve(figures, skipped_reason=f"its run timed shard {info.shard}, not {shard}")
    return ShardRun(figures, metrics.timed_windows)


def workload_words(metrics: Stage1Metrics) -> str:
    """What a process ran, in words (the summary's heading line)."""
    s = metrics.settings
    return (
        f"{metrics.model.name} ({metrics.model.dtype}), {s.runtime.label}, {s.max_new_tokens} new tokens, "
        f"{s.repeats} timed pass{'es' * (s.repeats != 1)}, on {metrics.device.name}"
    )


def single_gpu(baseline: object) -> SingleGpu | None:
    """`run.data_parallel_baseline`: a number (pages/s) or a stage1-run folder of one process; None when unset."""
    if baseline is None or baseline == "":
        return None
    if isinstance(baseline, int | float) and not isinstance(baseline, bool):
        if baseline <= 0:
            raise UserError(f"run.data_parallel_baseline={baseline} is not a rate", "Give pages/s above 0, or a folder")
        return SingleGpu(float(baseline), f"given: run.data_parallel_baseline={baseline:g} pages/s")
    folder = Path(str(baseline)).expanduser()
    fix = "Give a complete stage1-run folder of the same workload on one GPU, or its pages/s as a number"
    try:
        loaded = load(folder)
    except RecordError as exc:
        raise UserError(f"run.data_parallel_baseline={baseline}: {exc.problem}", fix) from exc
    if not isinstance(loaded, Stage1Folder) or loaded.status.state != COMPLETE:
        raise UserError(f"run.data_parallel_baseline={baseline} is not a complete stage1-run folder", fix)
    info = loaded.metrics.data_parallel
    if info is not None and info.count > 1:
        raise UserError(f"run.data_parallel_baseline={baseline} is one of {info.count} data-parallel processes", fix)
    pages = loaded.metrics.pages
    found = single_gpu_from_run(str(folder), loaded.metrics.timed_windows, pages.pages_per_s.p50 if pages else None)
    if found is None:
        raise UserError(f"run.data_parallel_baseline={baseline} timed no pages", fix)
    return found


def summarize_folders(
    root: Path,
    shards: Mapping[int, Path],
    processes: int,
    single: SingleGpu | None = None,
    problem: str | None = None,
) -> DataParallelSummary:
    """The summary of the processes whose folders are `shards` (under `root`) against the single-GPU rate `single`;
    `problem`: a reason found before reading them that there is no combined figure."""
    runs = [read_shard(shard, folder, root) for shard, folder in sorted(shards.items())]
    words = None
    for folder in shards.values():
        try:
            loaded = load(folder)
        except RecordError:
            continue
        if isinstance(loaded, Stage1Folder):
            words = workload_words(loaded.metrics)
            break
    summary = combine(str(root), processes, runs, single, words)
    if problem is not None:
        summary = attrs.evolve(summary, problem=problem, combined_pages_per_s=None, scaling_efficiency=None)
    return summary


def write_summary(root: Path, summary: DataParallelSummary) -> Path:
    """`data_parallel.json` and `data_parallel.md` in `root`; returns the Markdown's path."""
    save(summary, root / DATA_PARALLEL_FILE)
    target = root / SUMMARY_MD
    target.write_text(data_parallel_markdown(summary), encoding="utf-8")
    return target


# ---- stage1-run run.data_parallel=N ------------------------------------------------------------------------
class DataParallelRun:
    """`stage1-run run.data_parallel=N` (no -m): N processes at once, one per device, and their summary."""

    def __init__(self, command: CommandConfig, run_dir: Path, run_id: str, overrides: Sequence[str]) -> None:
        self.device = command.device
        self.run = command.nodes.run  # the typed `run` node (the command read it once)
        self.run_id = run_id
        self.overrides = tuple(overrides)
        self.art = ArtifactsManager(run_dir, stage="data_parallel")
        self.count = data_parallel_count(self.run)

    def execute(self) -> Path:
        """Run the processes to their end; the folder ends complete (a combined figure), failed or interrupted."""
        import torch

        from llm_perf_opt.pipeline.whatif_rungs import log_tail  # (not imported with the sweep callback)

        devices = shard_devices(self.device, self.count, torch.cuda.device_count())
        single = single_gpu(self.run.data_parallel_baseline)  # refused before any process starts
        self.art.start(self.run_id)
        root = self.art.run_dir
        folders = {k: root / f"{SHARD_PREFIX}{k}" for k in range(self.count)}
        print(f"stage1-run: {self.count} data-parallel processes on {', '.join(devices)}; logs in {root / LOGS_DIR}")
        try:
            codes = self._run_all(devices, folders)
        except KeyboardInterrupt:
            self.art.finish(artifacts.INTERRUPTED, "stopped with its processes")
            raise
        for shard, code in codes.items():
            if code not in (0, None):
                log.warning("shard %d exited %s: %s", shard, code, log_tail(self._log(shard)))
        summary = summarize_folders(root, folders, self.count, single)
        target = write_summary(root, summary)
        self.art.record(DATA_PARALLEL_FILE)
        self.art.record(SUMMARY_MD)
        self.art.finish(artifacts.FAILED if summary.problem else artifacts.COMPLETE, summary.problem)
        print(scaling_table([summary]))
        print(target, flush=True)
        if summary.problem:
            print(f"\nerror: no combined pages/s: {summary.problem}. {target} says more.", file=sys.stderr)
            sys.exit(FAILED_EXIT)
        return target

    def _log(self, shard: int) -> Path:
        return self.art.run_dir / LOGS_DIR / f"{SHARD_PREFIX}{shard}.log"

    def _run_all(self, devices: Sequence[str], folders: Mapping[int, Path]) -> dict[int, int | None]:
        """Start every process at once and wait for all of them (their exit status by shard)."""
        from llm_perf_opt.pipeline.whatif_rungs import run_process, stop_all

        codes: dict[int, int | None] = {}
        visible = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        cores = core_shares(self.run.cpu_affinity, devices, visible)
        if any(cores):
            log.info(
                "each process on its share of the host's cores: %s",
                ", ".join(f"{d} {c}" for d, c in zip(devices, cores, strict=True)),
            )

        def one(shard: int) -> None:
            command = shard_command(self.overrides, shard, devices[shard], folders[shard], cores[shard])
            codes[shard] = run_process(command, self._log(shard), None)

        threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(self.count)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:  # the processes must not outlive the run
            stop_all()
            raise
        return codes


# ---- a Hydra multirun over run.shard ----------------------------------------------------------------------
def summarize_sweep_shards(sweep_dir: Path, jobs: Mapping[int, Mapping[str, str] | None]) -> Path | None:
    """`data_parallel.{json,md}` in a sweep folder whose jobs (number -> overrides) set `run.shard`; None: none do."""
    shard_jobs = {num: o for num, o in jobs.items() if o is not None and SHARD_KEY in o}
    if not shard_jobs:
        return None
    shards: dict[int, Path] = {}
    problem = None
    for num, overrides in shard_jobs.items():
        shard = _whole(overrides[SHARD_KEY])
        if shard is None:
            continue
        if shard in shards:
            problem = f"shard {shard} ran in more than one job: each of the shards must run once"
        shards[shard] = sweep_dir / str(num)
    others = {
        key
        for overrides in shard_jobs.values()
        for key in overrides
        if key not in (SHARD_KEY, DEVICE_KEY) and len({o.get(key) for o in shard_jobs.values()}) > 1
    }
    if others:
        problem = (
            f"the shard jobs differ in {', '.join(sorted(others))}: a data-parallel sweep varies only run.shard; "
            "sweep one setting per command"
        )
    first = next(iter(shard_jobs.values()))
    count = _whole(first.get(COUNT_KEY)) or len(shard_jobs)
    try:
        single = single_gpu(_baseline(first))
    except UserError as exc:  # the sweep has run: its summary is written without the efficiency
        log.warning("no scaling efficiency: %s", exc)
        single = None
    return write_summary(sweep_dir, summarize_folders(sweep_dir, shards, count, single, problem))


def _whole(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _baseline(overrides: Mapping[str, str]) -> float | str | None:
    value = overrides.get(BASELINE_KEY)
    try:
        return None if value is None else float(value)
    except ValueError:
        return value


# ---- rebuilding a summary, the scaling table -----------------------------------------------------------------
def resummarize(root: Path) -> DataParallelSummary:
    """A data-parallel folder's summary written again from its processes' folders, with its first baseline."""
    old = load_data_parallel(root / DATA_PARALLEL_FILE)
    shards = {f.shard: root / f.folder for f in old.shards}
    runs_problem = None if old.problem is None or not old.problem.startswith("the shard jobs") else old.problem
    summary = summarize_folders(root, shards, old.processes, old.single_gpu, runs_problem)
    write_summary(root, summary)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llm_perf_opt.pipeline.data_parallel <folder> ...`: write each data-parallel folder's summary
    again from its processes' folders and print the scaling table of all of them."""
    parser = argparse.ArgumentParser(prog="python -m llm_perf_opt.pipeline.data_parallel", description=main.__doc__)
    parser.add_argument("folders", type=Path, nargs="+", help="folders holding data_parallel.json")
    args = parser.parse_args(argv)
    summaries = []
    for folder in args.folders:
        try:
            summaries.append(resummarize(folder))
        except RecordError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(scaling_table(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

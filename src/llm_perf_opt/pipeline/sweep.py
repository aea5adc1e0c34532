"""Summary of a Hydra multirun of `stage1-run`: one row per job, the swept keys, a plot.

`SweepSummaryCallback` (registered in conf/stage1.yaml) calls `summarize_sweep` when the multirun ends; rerun it
by hand with `python -m llm_perf_opt.pipeline.sweep <sweep_dir>`. Each numeric job folder is read as typed records
plus its `.hydra/overrides.yaml`; a job that cannot be summarised is listed as skipped.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.sweep import job_figures, summarize
from llm_perf_opt.override_text import deletes, override_key, override_value
from llm_perf_opt.pipeline.data_parallel import summarize_sweep_shards
from llm_perf_opt.records.common import COMPLETE, RUNNING
from llm_perf_opt.records.folders import (
    METRICS_FILE,
    REPORT_FILE,
    STATUS_FILE,
    SWEEP_SUMMARY_FILE,
    Stage1Folder,
    load,
    read_status,
    skip_reason,
    writer_note,
)
from llm_perf_opt.records.io import RecordError, read_yaml, save
from llm_perf_opt.records.sweep import SweepJob, SweepSummary
from llm_perf_opt.report.sweep_report import sweep_markdown, sweep_plot, throughput_latency_plot

log = logging.getLogger("llm_perf_opt.pipeline.sweep")

SUMMARY_MD = "sweep_summary.md"
SUMMARY_PNG = "sweep_summary.png"
CURVE_PNG = "throughput_latency.png"  # a sweep over run.batch_size


def _override_item(override: str) -> tuple[str, str]:
    """`key=value` (with `+`, `++` or `~` prefixes) as (key, value as the summary shows it)."""
    value = override_value(override)
    if deletes(override):
        return override_key(override), "(deleted)" if value is None else f"(deleted)={value}"
    return override_key(override), value or ""


def read_overrides(job_dir: Path) -> dict[str, str] | None:
    """The job's command-line overrides from `.hydra/overrides.yaml` (None when missing or unreadable)."""
    try:
        items = read_yaml(job_dir / ".hydra" / "overrides.yaml")
    except RecordError:
        return None
    return dict(_override_item(str(item)) for item in items) if isinstance(items, list) else None


def load_job(sweep_dir: Path, job_dir: Path) -> SweepJob:
    """One job folder as a summarised entry, or as skipped with the reason."""
    job = SweepJob(
        num=int(job_dir.name), folder=job_dir.name, swept={}, overrides=read_overrides(job_dir), status="unknown"
    )
    if not (job_dir / STATUS_FILE).is_file():
        return attrs.evolve(job, skipped_reason="no run_status.json (the job never started a run)")
    try:
        status = read_status(job_dir)
    except RecordError as exc:
        return attrs.evolve(job, skipped_reason=skip_reason(exc, job_dir))
    job = attrs.evolve(job, status=status.state, message=status.message or None)
    if status.state != COMPLETE:
        note = f" ({writer_note(status)})" if status.state == RUNNING else ""
        return attrs.evolve(job, skipped_reason=f"the run is marked {status.state}{note}, not complete")
    if not (job_dir / METRICS_FILE).is_file():
        return attrs.evolve(job, skipped_reason="no metrics.json")
    try:
        folder = load(job_dir)
    except RecordError as exc:
        return attrs.evolve(job, skipped_reason=skip_reason(exc, job_dir))
    if not isinstance(folder, Stage1Folder):
        return attrs.evolve(job, skipped_reason=f"metrics.json is for {folder.kind}, not a stage1-run")
    report = job_dir / REPORT_FILE
    return attrs.evolve(
        job,
        metrics=job_figures(folder.metrics),
        report=report.relative_to(sweep_dir).as_posix() if report.is_file() else None,
    )


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The numeric job folders of a sweep, in job order."""
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def summarize_sweep(sweep_dir: Path) -> Path:
    """Write `sweep_summary.md`, `.json` and `.png` into `sweep_dir`; returns the Markdown path."""
    return _summarize(Path(sweep_dir))[0]


def _summarize(sweep_dir: Path) -> tuple[Path, SweepSummary]:
    summary = summarize(sweep_dir, [load_job(sweep_dir, d) for d in job_dirs(sweep_dir)])
    plot = sweep_plot(summary, sweep_dir / SUMMARY_PNG)
    curve = throughput_latency_plot(summary, sweep_dir / CURVE_PNG)
    save(summary, sweep_dir / SWEEP_SUMMARY_FILE)
    # jobs over run.shard: data_parallel.{md,json}, the processes' pages/s combined
    data_parallel = summarize_sweep_shards(sweep_dir, {job.num: job.overrides for job in summary.jobs})
    target = sweep_dir / SUMMARY_MD
    names = [None if path is None else path.name for path in (plot, curve, data_parallel)]
    target.write_text(sweep_markdown(summary, *names), encoding="utf-8")
    return target, summary


SWEEP_FAILED_EXIT = 1  # exit status of a multirun with a job that did not complete (after its summary is written)


class SweepSummaryCallback(Callback):
    """Hydra callback: summarise the sweep folder when a multirun ends, its path the sweep's last line on stdout
    (after every job's own summary); exit 1 when a job did not complete."""

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            target, summary = _summarize(sweep_dir)
        except (OSError, ValueError) as exc:  # a summary must never turn a finished sweep into a failure
            log.warning("sweep summary not written for %s: %s", sweep_dir, exc)
            return
        print(f"stage1-run sweep: {len(summary.jobs) - len(summary.skipped)} of {len(summary.jobs)} job(s) complete")
        print(target, flush=True)
        if failed := summary.skipped:
            listed = ", ".join(f"{job.num} ({job.status})" for job in failed)
            print(
                f"\nerror: {len(failed)} of {len(summary.jobs)} sweep job(s) did not complete: job {listed}. "
                f"{target} lists the reason of each.",
                file=sys.stderr,
            )
            sys.exit(SWEEP_FAILED_EXIT)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llm_perf_opt.pipeline.sweep <sweep_dir>`: (re)write the summary of a finished sweep."""
    parser = argparse.ArgumentParser(prog="python -m llm_perf_opt.pipeline.sweep", description=main.__doc__)
    parser.add_argument("sweep_dir", type=Path, help="the multirun folder (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a folder")
    try:
        require_jobs(args.sweep_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(summarize_sweep(args.sweep_dir))
    return 0


def require_jobs(sweep_dir: Path) -> None:
    """UserError when `sweep_dir` holds no job folders (0, 1, ...): an empty summary would be written into it."""
    if job_dirs(sweep_dir):
        return
    what = "a run folder (it holds run_status.json)" if (sweep_dir / STATUS_FILE).exists() else "no multirun folder"
    raise UserError(
        f"{sweep_dir.resolve()} holds no sweep jobs (numbered job folders 0, 1, ...): it is {what}; nothing was "
        "written",
        "Pass the folder a `stage1-run -m` sweep wrote (its hydra.sweep.dir, by default multirun/<date>/<time>)",
    )


if __name__ == "__main__":
    raise SystemExit(main())

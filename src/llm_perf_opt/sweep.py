"""Summary of a Hydra multirun of `stage1-run`: one row per job, the swept keys, a plot.

`SweepSummaryCallback` (registered in conf/stage1.yaml) calls `summarize_sweep` when the multirun ends; rerun it
by hand with `python -m llm_perf_opt.sweep <sweep_dir>`. Only `metrics.json`, `run_status.json` and
`.hydra/overrides.yaml` of each numeric job folder are read; a job that cannot be summarised is listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from llm_perf_opt.report.markdown import Doc, flops, ms, pct

log = logging.getLogger("llm_perf_opt.sweep")

SUMMARY_MD = "sweep_summary.md"
SUMMARY_JSON = "sweep_summary.json"
SUMMARY_PNG = "sweep_summary.png"
ABSENT = "(default)"  # value shown for a swept key that a job did not override
UNKNOWN = "?"  # value shown when the job's overrides.yaml is missing or unreadable


@attrs.frozen
class JobResult:
    """What one job folder contributes to the summary (`reason` set when it was skipped)."""

    num: int
    folder: str  # relative to the sweep dir
    overrides: Mapping[str, str] | None  # None: `.hydra/overrides.yaml` missing or unreadable
    status: str
    message: str | None = None
    reason: str | None = None
    metrics: Mapping[str, float | None] = attrs.field(factory=dict)
    report: str | None = None  # relative to the sweep dir

    @property
    def ok(self) -> bool:
        return self.reason is None

    def value(self, key: str) -> str:
        """This job's value of an override key, as shown in the tables."""
        return UNKNOWN if self.overrides is None else self.overrides.get(key, ABSENT)


# ------------------------------------------------------------------------------------------------ reading


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _override_key(override: str) -> tuple[str, str]:
    """`key=value` (with `+`, `++` or `~` prefixes) as (key, value)."""
    key, sep, value = override.partition("=")
    if key.startswith("~"):
        return key[1:], f"(deleted){'=' + value if sep else ''}"
    return key.lstrip("+"), value


def read_overrides(job_dir: Path) -> dict[str, str] | None:
    """The job's command-line overrides from `.hydra/overrides.yaml` (None when missing or unreadable)."""
    try:
        items = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(items, list):
        return None
    return dict(_override_key(str(item)) for item in items)


def _by_stage(items: Any) -> dict[str, Mapping[str, Any]]:
    return {str(i["stage"]): i for i in items or () if isinstance(i, Mapping) and "stage" in i}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def extract_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """The figures of one row from a parsed `metrics.json` (None where absent)."""
    stages = _by_stage(metrics["stages"])
    mfu = _by_stage(metrics.get("mfu"))
    eff = _by_stage(metrics.get("efficiency"))
    throughput = metrics.get("throughput") or {}

    def p50(stage: str) -> float | None:
        summary = stages.get(stage, {}).get("summary")
        return _number(summary.get("p50")) if isinstance(summary, Mapping) else None

    return {
        "e2e_p50_ms": p50("e2e"),
        "prefill_p50_ms": p50("prefill"),
        "decode_p50_ms": p50("decode"),
        "decode_ms_per_token_p50": p50("decode/step"),
        "ttft_p50_ms": p50("ttft"),
        "prefill_mfu": _number(mfu.get("prefill", {}).get("mfu")),
        "prefill_achieved_tflops": _number(mfu.get("prefill", {}).get("achieved_tflops")),
        "decode_mbu": _number(eff.get("decode", {}).get("mbu")),
        "decode_tokens_per_s": _number(throughput.get("decode_tokens_per_s")),
    }


def load_job(sweep_dir: Path, job_dir: Path) -> JobResult:
    """One job folder as a summarised row, or as skipped with the reason."""
    job = JobResult(num=int(job_dir.name), folder=job_dir.name, overrides=read_overrides(job_dir), status="unknown")
    try:
        status = _read_json(job_dir / "run_status.json")
    except FileNotFoundError:
        return attrs.evolve(job, reason="no run_status.json (the job never started a run)")
    except (OSError, json.JSONDecodeError) as exc:
        return attrs.evolve(job, reason=f"run_status.json cannot be read ({exc})")
    if not isinstance(status, dict):
        return attrs.evolve(job, reason="run_status.json does not hold a JSON object")
    message = status.get("message")
    job = attrs.evolve(job, status=str(status.get("state") or "unknown"), message=str(message) if message else None)
    if job.status != "complete":
        detail = "killed hard while running" if job.status == "running" else f"the run is marked {job.status}"
        return attrs.evolve(job, reason=f"{detail}, not complete")
    try:
        figures = extract_metrics(_read_json(job_dir / "metrics.json"))
    except FileNotFoundError:
        return attrs.evolve(job, reason="no metrics.json")
    except (OSError, json.JSONDecodeError) as exc:
        return attrs.evolve(job, reason=f"metrics.json cannot be read ({exc})")
    except (KeyError, TypeError, AttributeError) as exc:
        return attrs.evolve(job, reason=f"metrics.json is malformed ({type(exc).__name__}: {exc})")
    report = job_dir / "report.md"
    return attrs.evolve(
        job, metrics=figures, report=report.relative_to(sweep_dir).as_posix() if report.is_file() else None
    )


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The numeric job folders of a sweep, in job order."""
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def swept_keys(jobs: Sequence[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (those with readable overrides), in first-seen order."""
    known = [job.overrides for job in jobs if job.overrides is not None]
    keys: list[str] = []
    for overrides in known:
        keys.extend(k for k in overrides if k not in keys)
    return [k for k in keys if len({overrides.get(k, ABSENT) for overrides in known}) > 1]


def _label(job: JobResult, keys: Sequence[str]) -> str:
    if not keys:
        return f"job {job.num}"
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={job.value(k)}" for k in keys)


# ------------------------------------------------------------------------------------------------ writing


def _rate(tflops: float | None) -> str:
    return "n/a" if tflops is None else f"{flops(tflops * 1e12)}/s"


def _write_markdown(sweep_dir: Path, jobs: Sequence[JobResult], keys: Sequence[str], plot: Path | None) -> Path:
    doc = Doc("Sweep summary")
    done = [j for j in jobs if j.ok]
    skipped = [j for j in jobs if not j.ok]
    doc.para(
        f"Sweep folder `{sweep_dir}`: {len(jobs)} job(s), {len(done)} summarised, {len(skipped)} skipped. "
        f"Swept keys: {', '.join(f'`{k}`' for k in keys) or 'none (all jobs share their overrides)'}. "
        "Times are medians (p50) over the timed passes, in ms; MFU and MBU are n/a where the device peak is unknown."
    )
    doc.h2("Jobs")
    header = [
        "job", *keys, "status", "e2e p50 (ms)", "prefill p50 (ms)", "decode p50 (ms/token)", "TTFT p50 (ms)",
        "prefill MFU", "prefill achieved", "decode MBU", "decode tokens/s", "report",
    ]  # fmt: skip
    rows = []
    for job in done:
        m = job.metrics
        rows.append([
            job.num, *(job.value(k) for k in keys), job.status,
            ms(m["e2e_p50_ms"]), ms(m["prefill_p50_ms"]), ms(m["decode_ms_per_token_p50"], 2), ms(m["ttft_p50_ms"]),
            pct(m["prefill_mfu"], 2), _rate(m["prefill_achieved_tflops"]), pct(m["decode_mbu"], 2),
            ms(m["decode_tokens_per_s"]), f"[report]({job.report})" if job.report else "n/a",
        ])  # fmt: skip
    doc.table(header, rows)
    if plot is not None:
        doc.image("prefill and decode p50 per job", plot.name)
    doc.h2("Skipped jobs")
    doc.table(
        ["job", *keys, "status", "reason", "message"],
        [[j.num, *(j.value(k) for k in keys), j.status, j.reason, j.message or ""] for j in skipped],
    )
    target = sweep_dir / SUMMARY_MD
    target.write_text(doc.text(), encoding="utf-8")
    return target


def _write_json(sweep_dir: Path, jobs: Sequence[JobResult], keys: Sequence[str]) -> Path:
    data = {
        "sweep_dir": str(sweep_dir),
        "swept_keys": list(keys),
        "jobs": [
            {
                "num": j.num,
                "folder": j.folder,
                "swept": {k: j.value(k) for k in keys},
                "overrides": None if j.overrides is None else dict(j.overrides),
                "status": j.status,
                "message": j.message,
                "skipped_reason": j.reason,
                "metrics": dict(j.metrics) if j.ok else None,
                "report": j.report,
            }
            for j in jobs
        ],
    }
    target = sweep_dir / SUMMARY_JSON
    target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return target


def _write_plot(sweep_dir: Path, jobs: Sequence[JobResult], keys: Sequence[str]) -> Path | None:
    """Grouped bars of prefill p50 and decode p50 (ms) per summarised job; None when there is nothing to draw."""
    done = [j for j in jobs if j.ok]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = (
        ("prefill p50", "prefill_p50_ms", "#f28e2b"),
        ("decode p50 (all tokens)", "decode_p50_ms", "#59a14f"),
    )
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(done) + 2.5), 4.6))
    try:
        for i, (name, key, colour) in enumerate(series):
            xs = [n + (i - 0.5) * width for n in range(len(done))]
            values = [j.metrics.get(key) or 0.0 for j in done]
            bars = ax.bar(xs, values, width, label=name, color=colour)
            ax.bar_label(bars, labels=[ms(j.metrics.get(key)) for j in done], fontsize=8, padding=2)
        ax.set_xticks(range(len(done)))
        ax.set_xticklabels([_label(j, keys) for j in done], rotation=20 if len(done) > 4 else 0, ha="center")
        ax.set_xlabel(", ".join(keys) if keys else "job")
        ax.set_ylabel("p50 latency (ms)")
        ax.set_title("Prefill and decode p50 latency per sweep job", pad=28)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, fontsize=9, frameon=False)
        fig.tight_layout()
        target = sweep_dir / SUMMARY_PNG
        fig.savefig(target, dpi=110)
    finally:
        plt.close(fig)
    return target


def summarize_sweep(sweep_dir: Path) -> Path:
    """Write `sweep_summary.md`, `.json` and `.png` into `sweep_dir`; returns the Markdown path."""
    return _summarize(Path(sweep_dir))[0]


def _summarize(sweep_dir: Path) -> tuple[Path, list[JobResult]]:
    jobs = [load_job(sweep_dir, d) for d in job_dirs(sweep_dir)]
    keys = swept_keys(jobs)
    plot = _write_plot(sweep_dir, jobs, keys)
    _write_json(sweep_dir, jobs, keys)
    return _write_markdown(sweep_dir, jobs, keys, plot), jobs


SWEEP_FAILED_EXIT = 1  # exit status of a multirun with a job that did not complete (after its summary is written)


class SweepSummaryCallback(Callback):
    """Hydra callback: summarise the sweep folder when a multirun ends; exit 1 when a job did not complete."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            target, jobs = _summarize(sweep_dir)
        except (OSError, ValueError) as exc:  # a summary must never turn a finished sweep into a failure
            log.warning("sweep summary not written for %s: %s", sweep_dir, exc)
            return
        log.info("sweep summary: %s", target)
        failed = [job for job in jobs if not job.ok]
        if failed:
            listed = ", ".join(f"{job.num} ({job.status})" for job in failed)
            print(
                f"\nerror: {len(failed)} of {len(jobs)} sweep job(s) did not complete: job {listed}. "
                f"{target} lists the reason of each.",
                file=sys.stderr,
            )
            sys.exit(SWEEP_FAILED_EXIT)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llm_perf_opt.sweep <sweep_dir>`: (re)write the summary of a finished sweep."""
    parser = argparse.ArgumentParser(prog="python -m llm_perf_opt.sweep", description=main.__doc__)
    parser.add_argument("sweep_dir", type=Path, help="the multirun folder (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a folder")
    print(summarize_sweep(args.sweep_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

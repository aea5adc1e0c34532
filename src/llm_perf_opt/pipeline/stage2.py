"""Stage 2: the Stage 1 workload under Nsight Systems, then Nsight Compute on its hottest kernels.

Capture (needs a GPU and the tools) and rendering (needs only the exported files) are separate, so any
Stage 2 folder can be re-rendered on a machine without Nsight or a GPU (:func:`render`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.analytic.settings import PricedModel
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import plain
from llm_perf_opt.env_info import collect_env
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.gpu_state import clock_state
from llm_perf_opt.nsight import commands
from llm_perf_opt.nsight.kernel_modules import kernel_modules
from llm_perf_opt.nsight.measured_bytes import REPRICED_ADAPTERS, WorkloadModel
from llm_perf_opt.nsight.nsys_stats import REPORT_ALTERNATIVES, available_reports, pick_reports
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.nsight.stage2_analysis import Stage2Analysis
from llm_perf_opt.nsight.tools import Tool, ToolRun, check_nsys_report, require_gpu
from llm_perf_opt.pipeline.stage2_ncu import NSYS_SQLITE, NcuPasses
from llm_perf_opt.pipeline.stage2_settings import Stage2Settings
from llm_perf_opt.pipeline.stage2_tools import ToolRuns
from llm_perf_opt.pipeline.stage2_workload import (
    MODEL_CACHE_DIR,
    forwarded_overrides,
    remove_model_cache,
    run_model_cache,
    workload_argv,
)
from llm_perf_opt.progress import Feedback
from llm_perf_opt.records import folders
from llm_perf_opt.records.common import TimeBudget
from llm_perf_opt.records.folders import (
    CAPTURE_FILE,
    CONFIG_FILE,
    ENV_FILE,
    INPUTS_FILE,
    METRICS_FILE,
    REPORT_FILE,
    STAKEHOLDER_FILE,
    WORKLOAD_METRICS_FILE,
)
from llm_perf_opt.records.folders import NCU_TARGETS_FILE as TARGETS_FILE
from llm_perf_opt.records.io import RecordError, read_json, structure
from llm_perf_opt.records.stage2 import Capture, NcuTargets, NsysReportChoice
from llm_perf_opt.report import stage2_plots, stage2_reports
from llm_perf_opt.report.markdown import present, write_markdown
from llm_perf_opt.session.model_settings import ModelSettings

log = logging.getLogger("llm_perf_opt.stage2")

NSYS_SQLITE_GZ = f"{NSYS_SQLITE}.gz"  # a gzipped copy, read as it is (a shipped example folder keeps one)

__all__ = [
    "CAPTURE_FILE",
    "MODEL_CACHE_DIR",
    "NSYS_SQLITE",
    "TARGETS_FILE",
    "Stage2Run",
    "forwarded_overrides",
    "render",
    "workload_argv",
]


class Stage2Run:
    """One `stage2-profile` invocation over one run folder: its settings (read once by the command), then the schedule
    (`execute`): Nsight Systems over the Stage 1 workload, Nsight Compute on its hottest kernels, the reports."""

    def __init__(
        self,
        settings: Stage2Settings,
        run_dir: Path,
        run_id: str,
        task_overrides: Sequence[str],
        feedback: Feedback | None = None,
    ) -> None:
        self.settings = settings
        self.feedback = feedback or Feedback()
        self.run_id = run_id
        self.user_overrides = forwarded_overrides(task_overrides)
        self.art = ArtifactsManager(run_dir, stage="stage2")
        self.tools = ToolRuns(self.art, self.feedback, Capture(run_id=run_id, mode=settings.mode_name))
        self.model_cache = run_model_cache(settings, self.user_overrides, run_dir)
        self.ncu = NcuPasses(settings, self.tools, self.art, self.user_overrides, self.model_cache)
        self._stats: Future[ToolRun] | None = None  # `nsys stats`, running beside Nsight Compute
        self.time_budget: TimeBudget | None = None  # where the run's time went, as metrics.json records it

    def execute(self) -> Path:
        """Capture with the tools, then render; the folder ends complete, failed or interrupted."""
        self.art.start(self.run_id)
        try:
            with self.feedback.session():
                self._capture()
            with self.feedback.step("analysing the exports, writing the reports", part="reports"):
                render(
                    self.art.run_dir,
                    art=self.art,
                    whatif=self.settings.whatif_dir,
                    stage1=self.settings.stage1_dir,
                    time_budget=self._take_budget,
                )
        except KeyboardInterrupt as stop:
            self.tools.save()
            self.art.finish(artifacts.INTERRUPTED, f"{interrupts.cause(stop)}; exports so far were kept")
            raise
        except Exception as exc:
            self.tools.save()
            why = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            self.art.finish(artifacts.FAILED, why)
            raise
        finally:
            remove_model_cache(self.model_cache)
        self.art.finish(artifacts.COMPLETE)
        report = str(self.art.run_dir / REPORT_FILE)
        self.feedback.summary(f"stage2-profile {self.run_id}: complete", [], report, self.time_budget)
        return self.art.run_dir

    def _take_budget(self) -> TimeBudget:
        """The run's time budget so far, kept for the closing summary."""
        self.time_budget = self.feedback.budget()
        return self.time_budget

    # ---- capture -----------------------------------------------------------------------------------
    def _capture(self) -> None:
        settings = self.settings
        self.art.write_text(CONFIG_FILE, settings.config_text)
        if settings.whatif_dir:
            folders.whatif_for(self.art.run_dir, settings.whatif_dir)  # a folder that cannot be read fails before nsys
        if settings.stage1_dir and not Path(settings.stage1_dir).expanduser().is_dir():
            raise UserError(
                f"report.stage1_dir={settings.stage1_dir} is not a folder",
                "Name a Stage 1 run folder of the same workload (its profiled pass names the kernels by module), "
                "or leave report.stage1_dir out",
            )
        require_gpu()
        import torch

        gpu = torch.device("cuda", torch.cuda.current_device())
        self.art.write_json(ENV_FILE, collect_env(gpu, clock_state(gpu)))
        self.tools.note(ncu_clock_control=settings.ncu.clock_control, forwarded_overrides=tuple(self.user_overrides))
        if not settings.nsys.enable:
            raise UserError(
                "pipeline.nsys.enable=false leaves Stage 2 nothing to analyse",
                "Keep Nsight Systems on; turn Nsight Compute off with pipeline.ncu.enable=false",
            )
        nsys = self.tools.find("nsys", settings.nsys.binary)
        ncu = self.tools.find("ncu", settings.ncu.binary) if settings.ncu.enable else None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage2-background") as background:
            self._run_nsys(nsys, background)
            if ncu is not None:
                self.ncu.run(ncu)
        if self._stats is not None:
            self._stats.result()  # a failed `nsys stats` fails the capture, as before
        self.tools.save()

    def _run_nsys(self, nsys: Tool, background: ThreadPoolExecutor) -> None:
        options, run_dir, timed = self.settings.nsys, self.art.run_dir, self.tools.timed
        base = self.art.path("nsys/report")
        argv = commands.nsys_profile_argv(
            nsys.path,
            base,
            workload_argv(self.settings, self.user_overrides, run_dir, name="nsys", model_cache=self.model_cache),
            trace=list(options.trace),
            sample=options.sample,
            cpuctxsw=options.cpuctxsw,
            cuda_graph_trace=options.cuda_graph_trace,
            capture_range=options.capture_range,
            gpu_metrics_hz=options.gpu_metrics_hz,
            gpu_metrics_devices=options.gpu_metrics_devices,
        )
        timed("nsys_profile", argv, "nsys/profile.log", options.timeout_s, "Nsight Systems profile")
        report = check_nsys_report(base)
        help_log = "nsys/help_reports.txt"
        # `nsys stats --help-reports` exits 1 after printing the list (seen with 2025.3): read it, don't trust rc.
        timed("nsys_help", commands.nsys_help_reports_argv(nsys.path), help_log, 120, "nsys report list", check=False)
        available = available_reports(self.art.path(help_log).read_text(errors="replace"))
        if not available:
            log.warning("could not read nsys's report list; asking for the configured reports as named")
            available = set(options.reports)
        picked = pick_reports(available, list(options.reports), REPORT_ALTERNATIVES)
        self.tools.note(
            nsys_reports=NsysReportChoice(
                names=tuple(picked), missing=tuple(picked.missing), substituted=dict(picked.substituted)
            )
        )
        sqlite_path = self.art.path(NSYS_SQLITE)
        export = commands.nsys_export_sqlite_argv(nsys.path, report, sqlite_path)
        timed("nsys_export", export, "nsys/export.log", options.timeout_s, "nsys export (sqlite)")
        if picked:  # CPU work on the export, beside Nsight Compute's runs: `_capture` waits for it
            self._stats = background.submit(
                timed,
                "nsys_stats",
                commands.nsys_stats_argv(nsys.path, sqlite_path, picked, self.art.path("nsys/stats/report")),
                "nsys/stats/stats.log",
                options.timeout_s,
                "nsys stats",
                background=True,
            )
        inputs = run_dir / "workload" / "nsys" / INPUTS_FILE
        if inputs.is_file():
            self.art.write_text(INPUTS_FILE, inputs.read_text())


def workload_models(run_dir: Path, targets: NcuTargets | None) -> dict[str, WorkloadModel]:
    """The model of each profiled workload folder (`workload/nsys`, each bytes pass's) whose `config.yaml` the
    analytic model prices again, parsed here so that the analysis below gets typed records."""
    names = [str(Path(WORKLOAD_METRICS_FILE).parent), *(p.workload for p in (targets.bytes_passes if targets else ()))]
    found = {name: _workload_model(run_dir / name / CONFIG_FILE) for name in names}
    return {name: model for name, model in found.items() if model is not None}


def _workload_model(path: Path) -> WorkloadModel | None:
    """The model a workload's `config.yaml` describes (or why it cannot be read); None without the file or for a
    model the analytic model does not price (`model.adapter` not a DeepSeek-OCR one)."""
    if not path.is_file():
        return None
    try:
        saved = OmegaConf.load(path)  # a record of the workload's run, not this command's config
        if not isinstance(saved, DictConfig):
            raise ValueError("not a mapping")
        model = ModelSettings.from_config(plain(saved.model))
        return WorkloadModel(model=PricedModel.from_settings(model)) if model.adapter in REPRICED_ADAPTERS else None
    except (ValueError, KeyError, AttributeError, TypeError, ConfigKeyError) as exc:
        return WorkloadModel(problem=str(exc))


def render(
    run_dir: Path,
    *,
    art: ArtifactsManager | None = None,
    whatif: Path | str | None = None,
    stage1: Path | str | None = None,
    time_budget: Callable[[], TimeBudget] | None = None,
) -> Path:
    """Build metrics.json, kernel_roofline.png, kernels.md, report.md and stakeholder_summary.md from a Stage 2
    folder's exports and records; `whatif`: a perf-whatif folder whose measured levers the recommendations cite
    (default: the one the folder lies in, if any); `stage1`: a Stage 1 folder of the same workload whose profiled
    pass names the kernels by module (default: the workload's own, when it ran the profiler); `time_budget`: the
    run's, taken before report.md (default: the one the folder's metrics.json recorded, if any)."""
    run_dir = Path(run_dir).resolve()
    evidence = folders.whatif_for(run_dir, whatif)
    export = next((run_dir / p for p in (NSYS_SQLITE, NSYS_SQLITE_GZ) if (run_dir / p).is_file()), None)
    missing = [NSYS_SQLITE] if export is None else []
    missing += [CAPTURE_FILE] if not (run_dir / CAPTURE_FILE).is_file() else []
    if export is None or missing:
        raise UserError(
            f"{run_dir} is not a complete Stage 2 folder: missing {', '.join(missing)}",
            "Point the command at a folder written by stage2-profile (it keeps nsys/report.sqlite and "
            "capture.json), or run stage2-profile again",
        )
    manager = art or ArtifactsManager(run_dir, stage="stage2")
    capture = folders.load_capture(run_dir)
    targets = folders.load_ncu_targets(run_dir)
    workload = folders.load_workload_metrics(run_dir)
    driver = folders.recorded_driver(run_dir)
    with NsysTrace(export) as trace:
        models = workload_models(run_dir, targets)
        analysis = Stage2Analysis(
            run_dir, trace, capture, targets=targets, workload=workload, driver=driver, models=models
        )
        metrics = analysis.metrics()
    recorded = None if time_budget is not None else _recorded_budget(run_dir)
    metrics = attrs.evolve(
        metrics,
        kernel_modules=kernel_modules(metrics, run_dir, stage1),
        created=run_started(run_dir) or metrics.created,
        time_budget=recorded,
    )
    manager.write_json(METRICS_FILE, metrics)
    plots = stage2_plots.write_stage2_plots(metrics, run_dir)
    for relative in plots.values():
        manager.record(relative)
    write_markdown(manager, "kernels.md", stage2_reports.kernels_md(metrics, plots))
    write_markdown(manager, STAKEHOLDER_FILE, stage2_reports.stakeholder_md(metrics, evidence))
    if time_budget is not None:
        metrics = attrs.evolve(metrics, time_budget=time_budget())
        manager.write_json(METRICS_FILE, metrics)
    files = [*present(run_dir, [*manager.written, folders.STATUS_FILE]), REPORT_FILE]
    write_markdown(manager, REPORT_FILE, stage2_reports.report_md(metrics, files))
    return run_dir


def run_started(run_dir: Path) -> str | None:
    """When the folder's run started (its status), the time its metrics carry however often `stage2-report`
    rebuilds them; None for a folder without a readable status."""
    try:
        return folders.read_status(run_dir).started
    except RecordError:
        return None


def _recorded_budget(run_dir: Path) -> TimeBudget | None:
    """The time budget of the run that wrote the folder's metrics.json (a rebuild keeps it), or None."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return None
    try:
        recorded = read_json(path)
        budget = recorded.get("time_budget") if isinstance(recorded, dict) else None
        return None if budget is None else structure(budget, TimeBudget, path)
    except RecordError:  # a damaged file: rebuilt from the exports, without a budget
        return None

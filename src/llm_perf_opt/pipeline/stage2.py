"""Stage 2: the Stage 1 workload under Nsight Systems, then Nsight Compute on its hottest kernels.

Capture (needs a GPU and the tools) and rendering (needs only the exported files) are separate, so any
Stage 2 folder can be re-rendered on a machine without Nsight or a GPU (:func:`render`).
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import attrs
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.analytic.settings import PricedModel
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import plain
from llm_perf_opt.env_info import collect_env
from llm_perf_opt.errors import UserError, require_bool, require_whole
from llm_perf_opt.measure.gpu_state import clock_state
from llm_perf_opt.nsight import commands
from llm_perf_opt.nsight.kernel_modules import kernel_modules
from llm_perf_opt.nsight.measured_bytes import REPRICED_ADAPTERS, WorkloadModel
from llm_perf_opt.nsight.ncu_windows import (
    BytesWindow,
    decode_bytes_window,
    prefill_bytes_window,
)
from llm_perf_opt.nsight.nsys_stats import REPORT_ALTERNATIVES, available_reports, pick_reports
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.nsight.stage2_analysis import Stage2Analysis
from llm_perf_opt.nsight.tools import Tool, ToolRun, check_nsys_report, check_run, find_tool, require_gpu, run_tool
from llm_perf_opt.override_text import override_key, quoted, quoted_override, sets_key
from llm_perf_opt.progress import Feedback
from llm_perf_opt.records import folders
from llm_perf_opt.records import vocabulary as vocab
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
from llm_perf_opt.records.stage2 import (
    Capture,
    CapturedToolRun,
    NcuBytesPass,
    NcuRound,
    NcuStageTarget,
    NcuTargets,
    NsysReportChoice,
    ToolInfo,
)
from llm_perf_opt.report import stage2_plots, stage2_reports
from llm_perf_opt.report.markdown import present, write_markdown
from llm_perf_opt.session.model_settings import ModelSettings
from llm_perf_opt.session.runtime import RuntimeSettings

log = logging.getLogger("llm_perf_opt.stage2")

NSYS_SQLITE = "nsys/report.sqlite"
NSYS_SQLITE_GZ = f"{NSYS_SQLITE}.gz"  # a gzipped copy, read as it is (a shipped example folder keeps one)
MODEL_CACHE_DIR = "model_cache"  # the workloads' saved random-weights model (`model.cache_dir`), removed at the end

__all__ = ["CAPTURE_FILE", "NSYS_SQLITE", "TARGETS_FILE", "Stage2Run", "forwarded_overrides", "render", "workload_argv"]

# Keys that belong to Stage 2 itself and are not forwarded to the profiled workload.
_OWN_PREFIXES = (
    "stage2.",
    "report.",
    "pipeline.nsys",
    "pipeline.ncu",
    "pipeline/nsys",
    "pipeline/ncu",
    "hydra.",
    "hydra/",
)


def forwarded_overrides(task_overrides: Sequence[str]) -> list[str]:
    """The user's overrides that configure the workload (all but Stage 2's own keys)."""
    out = []
    for override in task_overrides:
        if not override_key(override).startswith(_OWN_PREFIXES):
            out.append(override)
    return out


def workload_argv(
    cfg: DictConfig,
    user_overrides: Sequence[str],
    run_dir: Path,
    *,
    name: str,
    ncu: bool = False,
    batch_size: int = 1,
    model_cache: Path | None = None,
) -> list[str]:
    """`python -m llm_perf_opt.cli.stage1` with every user override plus Stage 2's own settings; an ncu workload
    runs one forward: one input, or one whole batch of `batch_size` (`run.batch_size`). `model_cache`: the
    `model.cache_dir` the workloads share (the first saves the random-weights model, the others load it)."""
    argv = [sys.executable, "-m", "llm_perf_opt.cli.stage1", *user_overrides]
    defaults = {  # the user's value wins
        "pipeline.torch_profiler.enable": "false",  # the torch profiler and Nsight both use CUPTI
        "pipeline.memory.enable": "false",  # Stage 1's extra passes: nothing Nsight analyses
        "pipeline.energy.enable": "false",
        "run.repeats": cfg.stage2.workload.repeats,
        "run.warmup": cfg.stage2.workload.warmup,
        "model.cache_dir": None if model_cache is None else quoted(model_cache),
    }
    forced: dict[str, Any] = {}  # after the user's overrides, so these win
    if ncu:
        ncu_cfg = cfg.stage2.ncu_workload
        forced = {  # one forward: one input, or one whole batch
            "dataset.max_images": max(int(ncu_cfg.max_images), batch_size),
            "infer.max_new_tokens": ncu_cfg.max_new_tokens,
            "run.repeats": ncu_cfg.get("repeats"),
            "run.profiler_window": "true",  # ncu --profile-from-start off: the first prefill and a middle decode step
        }
    for key, value in defaults.items():
        if value is not None and not sets_key(user_overrides, key) and forced.get(key) is None:
            argv.append(f"{key}={value}")
    argv += [f"{key}={value}" for key, value in forced.items() if value is not None]
    argv.append(quoted_override("hydra.run.dir", run_dir / "workload" / name))
    return argv


def run_model_cache(cfg: DictConfig, user_overrides: Sequence[str], run_dir: Path) -> Path | None:
    """The run's own `model.cache_dir` for its workloads (`<run>/model_cache`, removed when the run ends): None
    with `stage2.reuse_model=false`, checkpoint weights (`model.path`, `model.name_or_path`) or a `model.cache_dir`
    the user chose (that folder is forwarded as set, and kept)."""
    model = cfg.get("model") or {}
    if not bool(cfg.stage2.get("reuse_model", True)) or sets_key(user_overrides, "model.cache_dir"):
        return None
    if model.get("cache_dir") or model.get("path") or model.get("name_or_path"):
        return None
    return run_dir / MODEL_CACHE_DIR


def remove_model_cache(folder: Path | None) -> None:
    """Delete a run's own saved model (gigabytes the finished run no longer needs); a failure is logged."""
    if folder is None or not folder.exists():
        return
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning("could not remove the run's saved model %s: %s", folder, exc)


def _mode(cfg: DictConfig) -> DictConfig:
    mode = str(cfg.stage2.mode)
    if mode not in cfg.stage2.modes:
        raise UserError(
            f"stage2.mode={mode} is not a Stage 2 mode",
            f"Use stage2.mode={' or stage2.mode='.join(cfg.stage2.modes)}",
        )
    return cfg.stage2.modes[mode]


class Stage2Run:
    """One `stage2-profile` invocation over one run folder."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        run_id: str,
        task_overrides: Sequence[str],
        feedback: Feedback | None = None,
    ) -> None:
        self.cfg = cfg
        self.feedback = feedback or Feedback()
        self.run_id = run_id
        self.user_overrides = forwarded_overrides(task_overrides)
        self.art = ArtifactsManager(run_dir, stage="stage2")
        self.capture = Capture(run_id=run_id, mode=str(cfg.stage2.mode))
        self.whatif_dir = cfg.get("report", {}).get("whatif_dir")
        self.stage1_dir = cfg.get("report", {}).get("stage1_dir")
        self.model_cache = run_model_cache(cfg, self.user_overrides, run_dir)
        self._notes = threading.Lock()  # the capture's record is noted from the background thread too
        self._stats: Future[ToolRun] | None = None  # `nsys stats`, running beside Nsight Compute
        self.time_budget: TimeBudget | None = None  # where the run's time went, as metrics.json records it

    @functools.cached_property
    def gpu_metrics_hz(self) -> int | None:
        """`pipeline.nsys.gpu_metrics_hz`: how often nsys samples the GPU's metrics (DRAM bytes per stage), or None."""
        hz = self.cfg.pipeline.nsys.get("gpu_metrics_hz")
        if hz is None:
            return None
        if isinstance(hz, bool) or not isinstance(hz, int) or not 10 <= hz <= 200_000:
            raise UserError(
                f"pipeline.nsys.gpu_metrics_hz={hz} is not a sampling rate nsys takes",
                "Set a whole number of Hz from 10 to 200000 (e.g. 100000: a sample every 10 µs), or null for none",
            )
        return hz

    @functools.cached_property
    def bytes_pass(self) -> bool:
        """Whether Nsight Compute's bytes pass runs: `pipeline.ncu.bytes_pass`, or when null the mode's `bytes_pass`
        (deep: yes, light: no)."""
        setting = self.cfg.pipeline.ncu.get("bytes_pass")
        key = "pipeline.ncu.bytes_pass"
        if setting is None:
            setting, key = _mode(self.cfg).get("bytes_pass", False), f"stage2.modes.{self.cfg.stage2.mode}.bytes_pass"
        return require_bool(
            key,
            setting,
            "Set pipeline.ncu.bytes_pass=true (measure every kernel's DRAM bytes), false, or null (the mode's choice: "
            "deep measures them, light does not)",
        )

    @functools.cached_property
    def runtime(self) -> RuntimeSettings:
        """The profiled workload's runtime settings (`runtime.*`, `run.batch_size`), parsed once."""
        return RuntimeSettings.from_config(self.cfg)

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
                    whatif=self.whatif_dir,
                    stage1=self.stage1_dir,
                    time_budget=self._take_budget,
                )
        except KeyboardInterrupt as stop:
            self._save_capture()
            self.art.finish(artifacts.INTERRUPTED, f"{interrupts.cause(stop)}; exports so far were kept")
            raise
        except UserError as exc:
            self._save_capture()
            self.art.finish(artifacts.FAILED, str(exc))
            raise
        except Exception as exc:
            self._save_capture()
            self.art.finish(artifacts.FAILED, f"{type(exc).__name__}: {exc}")
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

    def _save_capture(self) -> None:
        self.art.write_json(CAPTURE_FILE, self.capture)

    def _note(self, **changes: Any) -> None:
        """Add `changes` to the capture's record (from the background thread too)."""
        with self._notes:
            self.capture = attrs.evolve(self.capture, **changes)

    # ---- capture -----------------------------------------------------------------------------------
    def _capture(self) -> None:
        cfg = self.cfg
        mode = _mode(cfg)
        self.art.write_text(CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
        if self.whatif_dir:
            folders.whatif_for(self.art.run_dir, self.whatif_dir)  # a folder that cannot be read fails before nsys
        if self.stage1_dir and not Path(str(self.stage1_dir)).expanduser().is_dir():
            raise UserError(
                f"report.stage1_dir={self.stage1_dir} is not a folder",
                "Name a Stage 1 run folder of the same workload (its profiled pass names the kernels by module), "
                "or leave report.stage1_dir out",
            )
        _ = self.runtime  # parsed here: bad runtime.* or run.batch_size values fail before nsys, not in its child
        _ = self.gpu_metrics_hz
        _ = self.bytes_pass
        require_gpu()
        import torch

        gpu = torch.device("cuda", torch.cuda.current_device())
        self.art.write_json(ENV_FILE, collect_env(gpu, clock_state(gpu)))
        self._note(
            ncu_clock_control=str(cfg.pipeline.ncu.clock_control), forwarded_overrides=tuple(self.user_overrides)
        )
        if not cfg.pipeline.nsys.enable:
            raise UserError(
                "pipeline.nsys.enable=false leaves Stage 2 nothing to analyse",
                "Keep Nsight Systems on; turn Nsight Compute off with pipeline.ncu.enable=false",
            )
        nsys = self._find_tool("nsys", cfg.pipeline.nsys.binary)
        ncu = self._find_tool("ncu", cfg.pipeline.ncu.binary) if cfg.pipeline.ncu.enable else None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage2-background") as background:
            self._run_nsys(nsys, background)
            if ncu is not None:
                self._run_ncu(ncu, mode)
        if self._stats is not None:
            self._stats.result()  # a failed `nsys stats` fails the capture, as before
        self._save_capture()

    def _find_tool(self, name: str, binary: str | None) -> Tool:
        """The tool `name` (at `binary` when set), noted in the capture."""
        tool = find_tool(name, binary)
        self._note(tools={**self.capture.tools, name: ToolInfo(path=str(tool.path), version=tool.version)})
        return tool

    def _note_command(self, cmd_rel: str, argv: list[str]) -> None:
        """Add `argv` to the folder's `cmd.txt`: every command run there, in order (nsys/: profile, then export)."""
        earlier = self.art.path(cmd_rel).read_text() if cmd_rel in self.art.written else ""
        self.art.write_text(cmd_rel, earlier + commands.shell_line(argv) + "\n")

    def _timed_tool(
        self,
        key: str,
        argv: list[str],
        log_rel: str,
        timeout_s: float,
        what: str,
        *,
        check: bool = True,
        background: bool = False,
    ) -> ToolRun:
        """Run a tool, its command in its folder's cmd.txt and its run in the capture; `background`: from the
        background thread (no progress bar: the foreground step has it)."""
        self._note_command(str(Path(log_rel).with_name("cmd.txt")), argv)
        log.info("%s: %s", what, commands.shell_line(argv)[:200])
        started = time.perf_counter()
        with nullcontext() if background else self.feedback.step(what, part=key.replace("_", " ")):
            run = run_tool(argv, timeout_s=timeout_s, log_path=self.art.path(log_rel))
        self.art.record(log_rel)
        done = CapturedToolRun(
            argv=tuple(argv),
            returncode=run.returncode,
            seconds=time.perf_counter() - started,
            timed_out=run.timed_out,
        )
        self._note(runs={**self.capture.runs, key: done})
        if check:
            check_run(run, what)
        return run

    def _run_nsys(self, nsys: Tool, background: ThreadPoolExecutor) -> None:
        cfg, run_dir = self.cfg, self.art.run_dir
        ncfg = cfg.pipeline.nsys
        base = self.art.path("nsys/report")
        argv = commands.nsys_profile_argv(
            nsys.path,
            base,
            workload_argv(cfg, self.user_overrides, run_dir, name="nsys", model_cache=self.model_cache),
            trace=list(ncfg.trace),
            sample=str(ncfg.sample),
            cpuctxsw=str(ncfg.cpuctxsw),
            cuda_graph_trace=ncfg.cuda_graph_trace,
            capture_range=ncfg.capture_range,
            gpu_metrics_hz=self.gpu_metrics_hz,
            gpu_metrics_devices=str(ncfg.get("gpu_metrics_devices") or "all"),
        )
        timeout = float(require_whole("pipeline.nsys.timeout_s", ncfg.timeout_s, 1))
        self._timed_tool("nsys_profile", argv, "nsys/profile.log", timeout, "Nsight Systems profile")
        report = check_nsys_report(base)
        help_log = "nsys/help_reports.txt"
        # `nsys stats --help-reports` exits 1 after printing the list (seen with 2025.3): read it, don't trust rc.
        self._timed_tool(
            "nsys_help", commands.nsys_help_reports_argv(nsys.path), help_log, 120, "nsys report list", check=False
        )
        available = available_reports(self.art.path(help_log).read_text(errors="replace"))
        if not available:
            log.warning("could not read nsys's report list; asking for the configured reports as named")
            available = set(ncfg.reports)
        picked = pick_reports(available, list(ncfg.reports), REPORT_ALTERNATIVES)
        self._note(
            nsys_reports=NsysReportChoice(
                names=tuple(picked), missing=tuple(picked.missing), substituted=dict(picked.substituted)
            )
        )
        sqlite_path = self.art.path(NSYS_SQLITE)
        self._timed_tool(
            "nsys_export",
            commands.nsys_export_sqlite_argv(nsys.path, report, sqlite_path),
            "nsys/export.log",
            timeout,
            "nsys export (sqlite)",
        )
        names = list(picked)
        if names:  # CPU work on the export, beside Nsight Compute's runs: `_capture` waits for it
            self._stats = background.submit(
                self._timed_tool,
                "nsys_stats",
                commands.nsys_stats_argv(nsys.path, sqlite_path, names, self.art.path("nsys/stats/report")),
                "nsys/stats/stats.log",
                timeout,
                "nsys stats",
                background=True,
            )
        workload_dir = run_dir / "workload" / "nsys"
        for name in (INPUTS_FILE,):
            if (workload_dir / name).is_file():
                self.art.write_text(name, (workload_dir / name).read_text())

    def _ncu_targets(self, mode: DictConfig) -> NcuTargets:
        """Each analysed stage's top kernels by nsys GPU time, with their calls and the stage's instances."""
        stages: dict[str, NcuStageTarget] = {}
        with NsysTrace(self.art.run_dir / NSYS_SQLITE) as trace:
            instances = {st.stage: st.instances for st in trace.stage_times()}
            for stage in map(str, mode.stages):
                kernels = trace.top_kernels(int(mode.top_kernels), stage=stage)
                calls: dict[str, int] = {}
                for k in trace.stage_kernels(stage):  # by short name, every instantiation summed
                    calls[k.name] = calls.get(k.name, 0) + k.calls
                unit = vocab.DECODE_STEP if stage == vocab.DECODE else stage  # one decode step, or one prefill
                stages[stage] = NcuStageTarget(
                    kernels=tuple(dict.fromkeys(k.name for k in kernels)),
                    calls=calls,
                    instances=instances.get(unit, 1) or 1,
                )
        return NcuTargets(mode=str(self.cfg.stage2.mode), stages=stages)

    def _run_ncu(self, ncu: Tool, mode: DictConfig) -> None:
        """Nsight Compute in one process per measure, each over the workload's CUDA profiler window (its first
        prefill and middle decode step): the targeted kernels of every analysed stage, then the bytes pass."""
        targets = self._ncu_targets(mode)
        self.art.write_json(TARGETS_FILE, targets)
        targets = self._ncu_targets_pass(ncu, mode, targets)
        self.art.write_json(TARGETS_FILE, targets)
        if self.bytes_pass:
            targets = attrs.evolve(targets, bytes_passes=self._ncu_bytes_pass(ncu, [str(s) for s in mode.stages]))
            self.art.write_json(TARGETS_FILE, targets)

    def _ncu_profile(self, ncu: Tool, key: str, folder: str, argv: list[str], what: str, *, check: bool = True) -> str:
        """Run ncu (`argv`, writing `<folder>/report.ncu-rep`) and export its raw page to `<folder>/raw.csv`.

        Returns "" when the export is there, else why not: no report (the filters matched nothing), or, with
        `check` off, how ncu failed (with it on, a failure raises a UserError).
        """
        timeout = float(require_whole("pipeline.ncu.timeout_s", self.cfg.pipeline.ncu.timeout_s, 1))
        run = self._timed_tool(key, argv, f"{folder}/profile.log", timeout, what, check=check)
        if run.timed_out or run.returncode != 0:
            how = "timed out" if run.timed_out else f"exited with code {run.returncode}"
            return f"ncu {how} (see {folder}/profile.log)"
        rep = self.art.path(f"{folder}/report.ncu-rep")
        if not rep.is_file():
            return "ncu profiled no kernel (the regex or NVTX filter matched nothing)"
        raw = run_tool(
            commands.ncu_import_raw_csv_argv(ncu.path, rep),
            timeout_s=600,
            log_path=self.art.path(f"{folder}/raw.csv"),
        )
        check_run(raw, f"ncu --import ({what})")
        return ""

    def _ncu_workload(self, name: str) -> list[str]:
        """The Stage 1 command Nsight Compute runs: one timed pass of one forward, its profiler window open."""
        return workload_argv(
            self.cfg,
            self.user_overrides,
            self.art.run_dir,
            name=name,
            ncu=True,
            batch_size=self.runtime.batch_size,
            model_cache=self.model_cache,
        )

    def _ncu_targets_pass(self, ncu: Tool, mode: DictConfig, targets: NcuTargets) -> NcuTargets:
        """One ncu process over the targeted kernels of every stage: `launches_per_kernel` launches of each launch
        configuration inside the profiler window (so a rare kernel is never crowded out by a frequent one), its
        rows told apart by stage through their NVTX ranges; `targets` with the round of each stage."""
        cfg = self.cfg
        names = list(dict.fromkeys(n for target in targets.stages.values() for n in target.kernels))
        if not names:
            return targets
        per_kernel = int(mode.launches_per_kernel)
        folder, regex = "ncu/targets", commands.kernel_regex_for(names)
        argv = commands.ncu_argv(
            ncu.path,
            self.art.path(f"{folder}/report"),
            self._ncu_workload("ncu-targets"),
            kernel_regex=regex,
            launch_skip=0,
            launch_count=per_kernel,
            filter_mode="per-launch-config",
            nvtx=True,
            profile_from_start=False,
            sections=list(mode.sections),
            metrics=list(cfg.pipeline.ncu.metrics),
            clock_control=str(cfg.pipeline.ncu.clock_control),
            target_processes=str(cfg.pipeline.ncu.target_processes),
        )
        note = self._ncu_profile(ncu, "ncu_targets", folder, argv, "Nsight Compute (targeted kernels)")
        stages = {
            stage: attrs.evolve(
                target,
                rounds=(
                    NcuRound(
                        folder=folder,
                        kernels=target.kernels,
                        launch_skip=0,
                        launch_count=per_kernel,
                        regex=regex,
                        note=note or None,
                        profiler_window=True,
                    ),
                ),
            )
            for stage, target in targets.stages.items()
        }
        return attrs.evolve(targets, stages=stages)

    def _ncu_bytes_pass(self, ncu: Tool, stages: Sequence[str]) -> tuple[NcuBytesPass, ...]:
        """The bytes pass: one ncu process over every kernel of the profiler window (the ncu workload's prefill,
        vision sub-stages included, and its middle decode step), duration and DRAM bytes only; one record per
        stage, each pointing at the shared export.

        A failed or empty pass is recorded with its reason and the capture goes on (the other figures stand).
        """
        cfg = self.cfg
        folder, workload = "ncu/bytes", "workload/ncu-bytes"
        cache_control = str(cfg.pipeline.ncu.get("bytes_cache_control") or "none")
        argv = commands.ncu_bytes_argv(
            ncu.path,
            self.art.path(f"{folder}/report"),
            self._ncu_workload("ncu-bytes"),
            clock_control=str(cfg.pipeline.ncu.clock_control),
            target_processes=str(cfg.pipeline.ncu.target_processes),
            cache_control=cache_control,
        )
        note = self._ncu_profile(ncu, "ncu_bytes", folder, argv, "Nsight Compute bytes pass", check=False)
        if note:
            log.warning("the bytes pass gave nothing: %s", note)
        passes = []
        for stage in stages:
            window = self._bytes_window(stage)
            empty = f"the nsys trace has no kernel in {window.instance}" if window.expected < 1 else None
            passes.append(
                NcuBytesPass(
                    stage=stage,
                    instance=window.instance,
                    folder=folder,
                    workload=workload,
                    launch_skip=0,
                    launch_count=0,
                    expected_kernels=window.expected,
                    cache_control=cache_control,
                    note=empty or note or None,
                    profiler_window=True,
                )
            )
        return tuple(passes)

    def _bytes_window(self, stage: str) -> BytesWindow:
        """The launches the bytes pass over `stage` profiles, from the nsys trace's kernels per instance."""
        with NsysTrace(self.art.run_dir / NSYS_SQLITE) as trace:
            if stage != vocab.DECODE:
                return prefill_bytes_window(stage, trace.instance_kernels(stage), self.runtime.batch_size)
            steps = trace.instance_kernels(vocab.DECODE_STEP)
        return decode_bytes_window(steps, int(self.cfg.stage2.ncu_workload.max_new_tokens))


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
        config = OmegaConf.load(path)
        if not isinstance(config, DictConfig):
            raise ValueError("not a mapping")
        if str(config.model.get("adapter")) not in REPRICED_ADAPTERS:
            return None
        return WorkloadModel(model=PricedModel.from_settings(ModelSettings.from_config(plain(config.model))))
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
    if not (run_dir / METRICS_FILE).is_file():
        return None
    path = run_dir / METRICS_FILE
    try:
        recorded = read_json(path)
        budget = recorded.get("time_budget") if isinstance(recorded, dict) else None
        return None if budget is None else structure(budget, TimeBudget, path)
    except RecordError:  # a damaged file: rebuilt from the exports, without a budget
        return None

"""`perf-whatif`: the baseline, each lever alone, then the cumulative ladder of the levers that helped, each rung a
`stage1-run` of the same workload in its own process; the figures, outputs and attribution of every rung in
`whatif.json`, rendered to `whatif.md` and plots."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.errors import UserError, require_bool
from llm_perf_opt.measure import whatif as figures
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI
from llm_perf_opt.measure.whatif_objectives import changes_text, within_drift
from llm_perf_opt.override_text import override_key, override_value
from llm_perf_opt.pipeline import whatif_hydra, whatif_judge
from llm_perf_opt.pipeline.rung_forks import ForkServer, StartingServer
from llm_perf_opt.pipeline.whatif_rungs import (
    RungJob,
    RungOutcome,
    SharedCaches,
    run_rungs,
    shared_caches,
    stopped_outcome,
)
from llm_perf_opt.progress import Feedback, StepHandle
from llm_perf_opt.records import common
from llm_perf_opt.records.common import SCHEMA_VERSION, TimeBudget
from llm_perf_opt.records.folders import METRICS_FILE, Stage1Folder, load_stage1
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    FAILED,
    HYDRA_LAUNCHER,
    INTERRUPTED,
    INVALID,
    LADDER,
    LATENCY,
    LOCAL_LAUNCHER,
    MEASURED,
    PENDING,
    SKIPPED,
    WORKLOAD,
    Judgement,
    Lever,
    Objective,
    Rung,
    Verdict,
    WhatIfRecord,
)

log = logging.getLogger("llm_perf_opt.whatif")

RENDER_MODULE = "llm_perf_opt.cli.stage1_report"  # a rung's reports, rendered in a forked process

WHATIF_FILE = "whatif.json"
RUNGS_DIR = "rungs"
LOGS_DIR = "logs"
BASELINE_NAME = "baseline"
# The baseline also keeps the top two logits behind each token (one untimed eager pass per input), by which an
# output departure of another rung is judged a near-tie or not (whatif_run.near_tie_tolerance).
BASELINE_EXTRA = ("run.save_top2_logits=true",)
IN_PROGRESS = "The run was still going when this was written: later rungs are missing."
# A lever's name becomes a rung's folder and log name (rungs/NN-name, logs/NN-name.log).
LEVER_NAME = re.compile(r"[A-Za-z0-9_-]+")
STOPPED_FIRST = "not run: the what-if run was stopped first"
# Keys of perf-whatif itself, never passed to a rung.
OWN_KEYS = ("whatif", "whatif_run", "hydra")


def workload_overrides(task_overrides: Sequence[str]) -> tuple[str, ...]:
    """The command line's overrides that set the workload (every one but perf-whatif's own keys)."""
    kept = []
    for override in task_overrides:
        if override_key(override).split(".", 1)[0].split("/", 1)[0] not in OWN_KEYS:
            kept.append(override)
    return tuple(kept)


def read_levers(node: Any, exclude: Sequence[str]) -> tuple[Lever, ...]:
    """The preset's levers (`whatif.levers`: name -> {overrides, about, changes, needs}) minus `exclude`."""
    levers = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    if not isinstance(levers, Mapping) or not levers:
        raise UserError(
            "the what-if preset has no levers (whatif.levers is empty)",
            "Pick whatif=decode|tuning|vision|batch|throughput|all",
        )
    unknown = sorted(set(exclude) - set(levers))
    if unknown:
        raise UserError(
            f"whatif_run.exclude names {', '.join(unknown)}, which the preset does not have",
            f"Exclude some of {', '.join(str(name) for name in levers)}",
        )
    out = []
    for name, spec in levers.items():
        if name in exclude:
            continue
        out.append(_lever(str(name), spec))
    if not out:
        raise UserError(
            f"whatif_run.exclude leaves no lever of the preset ({', '.join(str(name) for name in levers)}): the "
            "baseline alone judges nothing",
            "Exclude fewer levers, or run `stage1-run` with the workload's overrides to measure the baseline alone",
        )
    return tuple(out)


DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")


def check_whatif_settings(cfg: Any) -> tuple[Lever, ...]:
    """perf-whatif's own settings, checked before anything starts (the keys' types are settings_schema's): the
    preset's levers minus whatif_run.exclude (at least one), the devices, the launcher and its overrides, the
    memory budget and the near-tie tolerance. Returns the levers."""
    run_cfg = cfg.whatif_run
    exclude = OmegaConf.to_container(run_cfg.exclude) if run_cfg.get("exclude") is not None else []
    if isinstance(exclude, str) or not isinstance(exclude, list):
        raise UserError(
            f"whatif_run.exclude={exclude} is not a list",
            f"Give a list in brackets, e.g. whatif_run.exclude=[{exclude}]",
        )
    levers = read_levers(cfg.whatif.get("levers"), [str(x) for x in exclude])
    for device in run_cfg.get("devices") or ():
        if not DEVICE.fullmatch(str(device)):
            raise UserError(
                f"whatif_run.devices holds {device}, which is not a device",
                "Give devices such as cpu, cuda or cuda:N, e.g. whatif_run.devices=[cuda:0,cuda:1]",
            )
    _, overrides = launcher_settings(run_cfg)
    if overrides:
        from llm_perf_opt.override_keys import check_override_keys

        with _outside_running_hydra():
            check_override_keys("stage1", overrides, command="stage1-run")
    whatif_judge.memory_budget(cfg.whatif.get("memory_budget_gib"))
    whatif_judge.latency_target(_plain(cfg.whatif.get("latency_target")))
    whatif_judge.near_tie_tolerance(run_cfg.get("near_tie_tolerance"))
    return levers


def _plain(node: Any) -> Any:
    """A config node as plain values (a mapping as a dict), as it is."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def launcher_settings(run_cfg: Any) -> tuple[str, tuple[str, ...]]:
    """whatif_run.launcher (local | hydra) and, for hydra, the overrides that choose Hydra's launcher."""
    name = str(run_cfg.get("launcher") or LOCAL_LAUNCHER)
    if name not in (LOCAL_LAUNCHER, HYDRA_LAUNCHER):
        raise UserError(
            f"whatif_run.launcher={name} is not known",
            f"Use {LOCAL_LAUNCHER} (perf-whatif starts each rung) or {HYDRA_LAUNCHER} (one Hydra multirun per phase)",
        )
    raw = run_cfg.get("hydra_launcher")
    try:
        overrides = whatif_hydra.parse_launcher(OmegaConf.to_container(raw) if raw is not None else None)
    except ValueError as exc:
        raise UserError(
            str(exc),
            'Set e.g. \'whatif_run.hydra_launcher=["hydra/launcher=joblib","hydra.launcher.n_jobs=2"]\' (each '
            "override quoted, since it holds an =)",
        ) from None
    if name == LOCAL_LAUNCHER:
        if overrides:
            raise UserError(
                "whatif_run.hydra_launcher is set but whatif_run.launcher=local ignores it",
                "Add whatif_run.launcher=hydra, or drop whatif_run.hydra_launcher",
            )
        return name, ()
    if run_cfg.get("devices") is not None:
        raise UserError(
            "whatif_run.devices places the rungs of whatif_run.launcher=local; with launcher=hydra the Hydra "
            "launcher places them",
            "Drop whatif_run.devices; for one rung per GPU add hydra/launcher=joblib and "
            "hydra.launcher.n_jobs=<GPUs> to whatif_run.hydra_launcher (each job then claims a free GPU)",
        )
    return name, overrides


COMPILE_FIELDS = ("compile", "compile_vision")  # the runtime settings that make a rung compile (none: it does not)


def rungs_compile(cfg: Any) -> bool:
    """Whether a rung of this what-if may compile: the workload's own runtime does, or a lever of the preset sets
    runtime.compile or runtime.compile_vision to anything but none (read as given: the levers are checked later)."""
    runtime = cfg.get("runtime") or {}
    if any(str(runtime.get(field) or "none") != "none" for field in COMPILE_FIELDS):
        return True
    keys = {f"runtime.{field}" for field in COMPILE_FIELDS}
    levers = cfg.get("whatif", {}).get("levers")
    specs = OmegaConf.to_container(levers, resolve=True) if levers is not None else {}
    for spec in specs.values() if isinstance(specs, Mapping) else ():
        for override in (spec.get("overrides") or ()) if isinstance(spec, Mapping) else ():
            value = override_value(str(override))
            if override_key(str(override)) in keys and (value or "none").strip().lower() not in ("none", "null", ""):
                return True
    return False


def _lever(name: str, spec: Any) -> Lever:
    if not LEVER_NAME.fullmatch(name):
        raise UserError(
            f"the lever {name!r} has a name that cannot name its rung's folder and log: a lever name takes letters, "
            "digits, _ and - only",
            "Rename the lever in the what-if preset (whatif.levers), e.g. to "
            f"{re.sub(r'[^A-Za-z0-9_-]+', '_', name).strip('_') or 'my_lever'}",
        )
    fix = f"Give whatif.levers.{name} a list of overrides, e.g. overrides: [runtime.kv_cache=static]"
    if not isinstance(spec, Mapping) or not isinstance(spec.get("overrides"), list) or not spec["overrides"]:
        raise UserError(f"lever {name} has no overrides", fix)
    overrides = tuple(str(o) for o in spec["overrides"])
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise UserError(f"lever {name}: {', '.join(bad)} is not a key=value override", fix)
    changes = str(spec.get("changes") or LATENCY)
    if changes not in (LATENCY, WORKLOAD):
        raise UserError(f"lever {name}: changes={changes} is not known", f"Set changes to {LATENCY} or {WORKLOAD}")
    needs = spec.get("needs")
    return Lever(name=name, overrides=overrides, about=str(spec.get("about") or ""), changes=changes, needs=needs)


def validate(overrides: Sequence[str]) -> str | None:
    """Why `stage1-run` would refuse these overrides before running (None when it accepts them)."""
    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.override_keys import check_override_keys
    from llm_perf_opt.session.runtime import RuntimeSettings

    try:
        with _outside_running_hydra():
            check_override_keys("stage1", overrides, command="stage1-run")
            RuntimeSettings.from_config(compose_config("stage1", *overrides))
    except UserError as exc:
        return str(exc)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


@contextmanager
def _outside_running_hydra() -> Iterator[None]:
    """Compose configs from inside a Hydra app: the app's global Hydra is set aside and put back after."""
    from hydra.core.global_hydra import GlobalHydra

    running = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        if running is not None:
            GlobalHydra.instance().initialize(running)


def has_cuda(device: str) -> bool:
    """Whether rungs on `device` (auto | cpu | cuda[:N]) run on a GPU."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available()
    return device == "auto" and torch.cuda.is_available()


@attrs.define
class _Plan:
    """A rung before it runs: what it is and, once known, why it does not run."""

    rung: Rung
    job: RungJob | None = None


class WhatIfRun:
    """One `perf-whatif` invocation over one folder."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        run_id: str,
        workload: Sequence[str],
        feedback: Feedback | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.workload = tuple(workload)
        self.feedback = feedback or Feedback()
        self.art = ArtifactsManager(run_dir, stage="whatif")
        self.decode_tokens, self.decode_source = whatif_judge.workload_decode_tokens(cfg)
        self.budget_gib = whatif_judge.memory_budget(cfg.whatif.get("memory_budget_gib"))
        self.latency_target = whatif_judge.latency_target(_plain(cfg.whatif.get("latency_target")))
        self.tie_tolerance = whatif_judge.near_tie_tolerance(cfg.whatif_run.get("near_tie_tolerance"))
        self.goal = self._objective()
        self.rungs: dict[str, Rung] = {}
        self.folders: dict[str, Stage1Folder] = {}
        self.levers: tuple[Lever, ...] = ()  # the preset's, read when the run starts
        self.left_out: tuple[tuple[str, str], ...] = ()  # levers the ladder did not stack, with the reason
        # levers stacked for the objective's parts they shortened (its own change within noise), with those parts
        self.stacked_by_parts: tuple[tuple[str, str], ...] = ()
        self.index = 0
        self.launcher, self.launcher_overrides = launcher_settings(cfg.whatif_run)
        self.fork_rungs = self._fork_rungs()
        self.overlap_rungs = self.launcher == LOCAL_LAUNCHER and require_bool(
            "whatif_run.overlap_rungs",
            self.cfg.whatif_run.get("overlap_rungs", False),
            "Set whatif_run.overlap_rungs=true (a rung starts while the previous one post-processes; its warm-up and "
            "timed passes wait for that one's end) or false (each rung starts when the previous one has exited)",
        )
        self.forks: ForkServer | None = None  # the preloaded server the rungs are forked from, once it has imported
        self.starting: StartingServer | None = None  # that server while it imports (launched when the run starts)
        self.caches = SharedCaches()  # build once, reuse: what the rungs share, found when the run starts
        self.tally: StepHandle | None = None  # every rung's progress across the phases, while they run

    def _fork_rungs(self) -> bool:
        """`whatif_run.fork_rungs`: the local launcher forks each rung from a preloaded server."""
        value = require_bool(
            "whatif_run.fork_rungs",
            self.cfg.whatif_run.get("fork_rungs", False),
            "Set whatif_run.fork_rungs=true (each rung forked from a process that has imported torch and transformers "
            "once) or false (each rung a fresh interpreter)",
        )
        return value and self.launcher == LOCAL_LAUNCHER and hasattr(os, "fork")  # no fork on Windows

    def _objective(self) -> Objective:
        """`whatif.objective`: the goal (or figure) the levers are ranked by and the headline verdict names."""
        name = str(self.cfg.whatif.get("objective") or figures.DEFAULT_OBJECTIVE)
        try:
            return figures.objective(name, self.decode_tokens)
        except KeyError:
            raise UserError(
                f"whatif.objective={name} is not known: the headline verdict and the ladder rank the rungs by it",
                f"Use one of the goals {', '.join(figures.GOAL_FIGURES)} (default {figures.DEFAULT_OBJECTIVE}: "
                f"whole-page latency at the workload's decode length) or one of the figures "
                f"{', '.join(figures.OBJECTIVES)}",
            ) from None

    # ---- driver ------------------------------------------------------------------------------------
    def execute(self) -> WhatIfRecord:
        self.levers = check_whatif_settings(self.cfg)  # before the folder is claimed and anything starts
        self.art.start(self.run_id)
        try:
            # The fork server first: its imports overlap this process's own (torch) and the checks of every rung's
            # config; it is waited for when the first rung is due, and cancelled if none is.
            self.starting = StartingServer.launch(compiles=rungs_compile(self.cfg)) if self.fork_rungs else None
            self.caches = shared_caches(self.cfg.whatif_run, self.cfg.get("model") or {}, self.art.run_dir)
            with self.feedback.session():
                record = self._run()
        except KeyboardInterrupt as stop:
            why = interrupts.cause(stop)
            self._write(partial=f"{why}; the rungs still running were stopped")
            self.art.finish(artifacts.INTERRUPTED, f"{why}; the rungs so far were written")
            raise
        except UserError as exc:
            self._write(partial=str(exc))
            self.art.finish(artifacts.FAILED, str(exc))
            raise
        except Exception as exc:
            self.art.finish(artifacts.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if self.starting is not None:  # launched, never waited for (the run stopped before its first rung)
                self.starting.cancel()
            if self.forks is not None:
                self.forks.close()
            self.caches.remove()
        base = record.baseline
        if base is None or base.state != MEASURED:
            reason = base.reason if base is not None else "not run"
            self.art.finish(artifacts.FAILED, f"the baseline failed: {reason}")
            raise UserError(
                f"the what-if baseline failed ({reason}); no lever can be judged without it",
                f"Fix the workload overrides until `stage1-run {' '.join(self.workload)}` runs; its log is in "
                f"{self.art.run_dir / LOGS_DIR}",
            )
        self.art.finish(artifacts.COMPLETE)
        self._print_summary(record)
        return record

    def _print_summary(self, record: WhatIfRecord) -> None:
        """The closing lines: rungs, the best lever, where the time went, then whatif.md's path."""
        measured = sum(1 for r in record.rungs if r.state == MEASURED and r.reused is None)
        ran = sum(1 for r in record.rungs if r.reused is None)
        best = record.best_rung
        if best is not None and best.speedup is not None:
            best_text = f"{best.name}, {best.speedup.value:.2f}× ({best.speedup.verdict})"
        else:
            best_text = "none: no lever beat the baseline beyond noise"
        rows = [
            ("model", f"{record.model} on {record.device or 'device not recorded'}"),
            ("objective", record.objective.label),
            ("rungs", f"{measured} measured of {ran}"),
            ("best", best_text),
        ]
        from llm_perf_opt.report.whatif_goodput import goodput_summary
        from llm_perf_opt.report.whatif_report import WHATIF_REPORT

        if (goodput := goodput_summary(record)) is not None:
            rows.append(("goodput", goodput))

        report = str(self.art.run_dir / WHATIF_REPORT)
        self.feedback.summary(f"perf-whatif {self.run_id}: complete", rows, report, record.time_budget)

    def _budget(self) -> TimeBudget:
        """Where the run's time went, by phase, with how many rungs ran and their mean time."""
        walls = [r.wall_s for r in self.rungs.values() if r.wall_s is not None and r.reused is None]
        note = None
        if walls:
            mean = sum(walls) / len(walls)
            overlap = " (rungs' times may overlap)" if self.overlap_rungs or len(self._devices()) > 1 else ""
            note = f"{len(walls)} rung(s), {mean:.0f} s each on average{overlap}"
        return self.feedback.budget(note)

    def _run(self) -> WhatIfRecord:
        run_cfg = self.cfg.whatif_run
        self.art.write_text("config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))
        levers = self.levers
        devices = self._devices()
        cuda = (
            has_cuda(str(self.cfg.device))
            if run_cfg.devices is None
            else all(has_cuda(str(d)) for d in run_cfg.devices)
        )

        base = self._plan(BASELINE_NAME, BASELINE, (), (), changes_workload=False)
        alone = [
            self._plan(
                lever.name,
                ALONE,
                (lever.name,),
                lever.overrides,
                changes_workload=lever.changes == WORKLOAD,
                skip=None if lever.needs != "cuda" or cuda else "needs a CUDA device (this run has none)",
            )
            for lever in levers
        ]
        self._await_forks(needed=base.job is not None)
        planned = sum(1 for p in [base, *alone] if p.job is not None)
        with self.feedback.tally("rungs (all phases)", total=planned) as self.tally:
            self._phases(base, alone, levers, devices)
        self.tally = None
        return self._finish()

    def _phases(self, base: _Plan, alone: list[_Plan], levers: Sequence[Lever], devices: list[str | None]) -> None:
        """The baseline, each lever alone, then the ladder."""
        run_cfg = self.cfg.whatif_run
        with self.feedback.step("the baseline", total=1, part="baseline") as bar:
            self._execute(BASELINE, [base], devices, bar.advance)
        self._write_progress()
        if self.rungs[BASELINE_NAME].state != MEASURED:  # without a baseline no lever can be judged: stop here
            for p in alone:
                if p.job is not None:
                    self.rungs[p.rung.name] = attrs.evolve(p.rung, state=SKIPPED, reason="not run: the baseline failed")
            return
        with self.feedback.step(f"{len(alone)} lever(s), each alone", total=len(alone), part="levers") as bar:
            self._execute(ALONE, alone, devices, bar.advance)
        self._judge(BASELINE_NAME)
        self._write_progress()
        if bool(run_cfg.ladder):
            self._ladder(levers, devices, latency_only=bool(run_cfg.ladder_latency_only))

    def _finish(self) -> WhatIfRecord:
        """The record (which the rungs' reports cite), the rungs' reports, then the what-if's own with the time
        budget."""
        from llm_perf_opt.report import whatif_report

        record = self._record()
        with self.feedback.step("writing the record and the reports", part="reports"):
            self.art.write_json(WHATIF_FILE, record)
            self._render_rungs()
            plots = whatif_report.write_plots(self.art, record)
            record = attrs.evolve(record, time_budget=self._budget())
            self.art.write_json(WHATIF_FILE, record)
            whatif_report.write_report(self.art, record, plots)
        return record

    def _await_forks(self, *, needed: bool) -> None:
        """The preloaded server, once it has imported (`needed`: a rung will be forked; otherwise it is stopped)."""
        starting, self.starting = self.starting, None
        if starting is None:
            return
        if not needed:
            starting.cancel()
            return
        what = "preloading torch and transformers once for every rung (whatif_run.fork_rungs)"
        with self.feedback.step(what, part="preload"):
            self.forks = starting.ready()

    def _devices(self) -> list[str | None]:
        chosen = self.cfg.whatif_run.devices
        if chosen is None:
            return [None]
        if isinstance(chosen, str) or not chosen:
            raise UserError(
                f"whatif_run.devices={chosen} is not a list of devices", "Set whatif_run.devices=[cuda:0,cuda:1]"
            )
        return [str(d) for d in chosen]

    # ---- rungs -------------------------------------------------------------------------------------
    def _plan(
        self,
        name: str,
        phase: str,
        levers: tuple[str, ...],
        overrides: tuple[str, ...],
        *,
        changes_workload: bool,
        skip: str | None = None,
    ) -> _Plan:
        rung = Rung(
            name=name,
            phase=phase,
            levers=levers,
            overrides=overrides,
            changes_workload=changes_workload,
            state=SKIPPED if skip else PENDING,
            reason=skip or "not run yet",
        )
        if skip is None and (refused := self._refusal(name, overrides)) is not None:
            rung = attrs.evolve(rung, state=INVALID, reason=refused)
        self.rungs[name] = rung
        if rung.state != PENDING:
            log.warning("%s: %s (%s)", name, rung.state, rung.reason)
            return _Plan(rung)
        folder_name = figures.folder_name(self.index, name)
        self.index += 1
        own_log = self.art.run_dir / LOGS_DIR / f"{folder_name}.log"
        job = RungJob(
            name=name,
            workload=self.workload,
            levers=(*overrides, *BASELINE_EXTRA) if phase == BASELINE else overrides,
            folder=self.art.run_dir / RUNGS_DIR / folder_name,
            log=self._phase_log(phase) if self.launcher == HYDRA_LAUNCHER else own_log,
            shared=self.caches.overrides,
            env=self.caches.env,
        )
        return _Plan(rung, job)

    def _phase_log(self, phase: str) -> Path:
        """The log of a phase's multirun (whatif_run.launcher=hydra), which its rungs share."""
        return self.art.run_dir / LOGS_DIR / f"phase-{phase}.log"

    def _refusal(self, name: str, overrides: tuple[str, ...]) -> str | None:
        """Why a rung cannot run (stage1-run's validation; for the Hydra launcher, its lever config too)."""
        refused = validate([*self.workload, *overrides])
        if refused is None and self.launcher == HYDRA_LAUNCHER:
            try:
                whatif_hydra.rung_config(figures.folder_name(self.index, name), overrides, self.workload)
            except whatif_hydra.NotExpressible as exc:
                refused = f"not runnable through whatif_run.launcher=hydra: {exc}"
        return refused

    def _execute(self, phase: str, plans: Sequence[_Plan], devices: Sequence[str | None], advance: Any) -> None:
        jobs = [p.job for p in plans if p.job is not None]
        for p in plans:
            if p.job is None:
                advance()
        timeout = self.cfg.whatif_run.rung_timeout_s
        limit = None if timeout is None else float(timeout)

        def done(outcome: RungOutcome) -> None:
            took = "" if outcome.wall_s is None else f" in {outcome.wall_s:.0f} s"
            why = f" ({outcome.message})" if outcome.message else ""
            log.info("rung %s: %s%s%s", outcome.name, outcome.state, took, why)
            advance()
            if self.tally is not None:
                self.tally.advance()

        try:
            if self.launcher == HYDRA_LAUNCHER:
                outcomes = whatif_hydra.run_phase(jobs, self.launcher_overrides, self._phase_log(phase), limit, done)
            else:
                outcomes = run_rungs(jobs, devices, limit, done, self.forks, overlap=self.overlap_rungs)
        except KeyboardInterrupt:  # the rungs were stopped: what each one left in its folder is what it measured
            self._take_stopped(jobs)
            raise
        for job in jobs:
            self._take(job, outcomes[job.name])

    def _take_stopped(self, jobs: Sequence[RungJob]) -> None:
        """The phase's rungs after a stop (Ctrl-C, SIGTERM): those that started as their folders tell (one stopped
        mid-way with the passes it measured), those that did not as skipped; the measured ones judged."""
        for job in jobs:
            outcome = stopped_outcome(job)
            if outcome is None:
                self.rungs[job.name] = attrs.evolve(self.rungs[job.name], state=SKIPPED, reason=STOPPED_FIRST)
            else:
                self._take(job, outcome)
        self._judge(BASELINE_NAME)

    def _take(self, job: RungJob, outcome: RungOutcome) -> None:
        rung = attrs.evolve(
            self.rungs[job.name], folder=figures.relative(job.folder, self.art.run_dir), wall_s=outcome.wall_s
        )
        if outcome.state == common.INTERRUPTED:
            self.rungs[job.name] = _interrupted(rung, job.folder, self.goal, self.decode_tokens)
            return
        if outcome.state != common.COMPLETE:
            self.rungs[job.name] = attrs.evolve(rung, state=FAILED, reason=outcome.message or outcome.state)
            return
        try:
            folder = load_stage1(job.folder)
            if job.name == BASELINE_NAME and self.decode_tokens is None:  # whole pages at the measured length
                self.decode_tokens, self.decode_source = folder.metrics.settings.max_new_tokens, "measured"
                self.goal = figures.objective(self.goal.name, self.decode_tokens)
            measured = figures.rung_figures(folder, self.goal, self.decode_tokens)
        except (RecordError, ValueError) as exc:
            self.rungs[job.name] = attrs.evolve(rung, state=FAILED, reason=str(exc))
            return
        self.folders[job.name] = folder
        self.rungs[job.name] = attrs.evolve(rung, state=MEASURED, reason=None, figures=measured)

    def _judge(self, reference: str) -> None:
        """Speed-up, outputs and attribution of every measured rung against the baseline (ladder rungs: the
        attribution against the rung below them)."""
        base_folder = self.folders.get(BASELINE_NAME)
        base = self.rungs[BASELINE_NAME]
        if base_folder is None or base.figures is None:
            return
        tokens = self.decode_tokens
        base_values = figures.pass_values(base_folder.metrics, self.goal.name, tokens)
        self.rungs[BASELINE_NAME] = whatif_judge.judged_baseline(base, self.budget_gib, base_folder)
        for name, rung in list(self.rungs.items()):
            folder = self.folders.get(name)
            if name == BASELINE_NAME or folder is None or rung.figures is None or rung.speedup is not None:
                continue
            against = reference if rung.phase != LADDER else self._below(rung)
            ref_rung = self.rungs[against]
            assert ref_rung.figures is not None
            judged = attrs.evolve(
                rung,
                speedup=figures.speedup(
                    self.goal, base_values, figures.pass_values(folder.metrics, self.goal.name, tokens)
                ),
                outputs=figures.outputs_against(base_folder, folder, self.tie_tolerance),
                attribution=figures.attribute(name, rung.figures, against, ref_rung.figures),
            )
            self.rungs[name] = whatif_judge.judged_rung(judged, base_folder, folder, tokens, self.budget_gib)
        self.rungs = whatif_judge.with_repeat_floor(self.rungs, self.budget_gib)

    def _below(self, rung: Rung) -> str:
        """The rung a ladder rung stands on: the ladder rung with one lever fewer (the best lever alone first)."""
        if len(rung.levers) <= 1:
            return BASELINE_NAME
        below = next((r for r in self.rungs.values() if r.phase == LADDER and r.levers == rung.levers[:-1]), None)
        if below is None or below.state != MEASURED:
            return BASELINE_NAME
        return below.reused or below.name

    def _ladder(self, levers: Sequence[Lever], devices: Sequence[str | None], *, latency_only: bool) -> None:
        candidates = [
            lever
            for lever in levers
            if self.rungs[lever.name].state == MEASURED and (lever.changes == LATENCY or not latency_only)
        ]
        unchanged = [(lever.name, why) for lever in candidates if (why := self.rungs[lever.name].no_change) is not None]
        departed = [(lever.name, why) for lever in candidates if (why := self._departure(lever.name)) is not None]
        departed = [(name, why) for name, why in departed if name not in dict(unchanged)]
        skipped = dict(unchanged) | dict(departed)
        candidates = [lever for lever in candidates if lever.name not in skipped]
        gains = {lever.name: self.rungs[lever.name].speedup for lever in candidates}
        ranked = figures.rank(candidates, gains)
        by_parts = figures.rank_by_parts(
            [lever for lever in candidates if lever not in ranked],
            self.goal.name,
            gains,
            {lever.name: self.rungs[lever.name].judgements for lever in candidates},
        )
        drift = figures.host_drift(self.rungs.values())  # a gain no larger than the host's own drift is not stacked
        stacked_for: list[tuple[Lever, tuple[Judgement, ...]]] = [*((lever, ()) for lever in ranked), *by_parts]
        drifted = {
            lever.name: why
            for lever, parts in stacked_for
            if (why := within_drift(gains[lever.name], parts, drift)) is not None
        }
        ranked = [lever for lever in ranked if lever.name not in drifted]
        by_parts = [(lever, parts) for lever, parts in by_parts if lever.name not in drifted]
        plan = figures.plan_ladder([*ranked, *(lever for lever, _ in by_parts)])
        self.stacked_by_parts = tuple(
            (lever.name, changes_text(parts)) for lever, parts in by_parts if lever.name not in dict(plan.left_out)
        )
        self.left_out = (*unchanged, *departed, *drifted.items(), *plan.left_out)
        if not plan.steps:
            return
        first = plan.steps[0]
        reused = self.rungs[first.levers[0]]
        self.rungs[f"ladder-1-{first.levers[0]}"] = attrs.evolve(
            reused, name=f"ladder-1-{first.levers[0]}", phase=LADDER, levers=first.levers, reused=reused.name
        )
        plans = [
            self._plan(
                f"ladder-{i}-{step.levers[-1]}",
                LADDER,
                step.levers,
                step.overrides,
                changes_workload=any(self._lever(n).changes == WORKLOAD for n in step.levers),
            )
            for i, step in enumerate(plan.steps[1:], start=2)
        ]
        if plans:
            if self.tally is not None:
                self.tally.grow(sum(1 for p in plans if p.job is not None))
            with self.feedback.step(f"the ladder: {len(plans)} more rung(s)", total=len(plans), part="ladder") as bar:
                self._execute(LADDER, plans, devices, bar.advance)
        self._judge(BASELINE_NAME)

    def _departure(self, name: str) -> str | None:
        """Why a measured lever's outputs keep it off the ladder (whatif_run.ladder_identical_outputs), or None."""
        run = self.cfg.whatif_run
        if not bool(run.get("ladder_identical_outputs", True)):
            return None
        limit = run.get("ladder_max_logit_diff")
        found = whatif_judge.repeats_until(self.rungs.values())  # where the baseline's own outputs stop repeating
        return figures.outputs_departure(
            self.rungs[name].outputs, None if limit is None else float(limit), None if found is None else found[1]
        )

    def _lever(self, name: str) -> Lever:
        return next(lever for lever in self.levers if lever.name == name)

    # ---- the record --------------------------------------------------------------------------------
    def _record(self) -> WhatIfRecord:
        base = self.folders.get(BASELINE_NAME)
        rungs = tuple(self.rungs.values())
        record = WhatIfRecord(
            schema_version=SCHEMA_VERSION,
            run_id=self.run_id,
            stage="whatif",
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            preset=str(self.cfg.whatif.get("name") or "custom"),
            objective=self.goal,
            model=str(self.cfg.model.name) if base is None else base.metrics.model.name,
            weights=None if base is None else base.metrics.model.weights,
            device=None if base is None else base.metrics.device.name,
            device_type=None if base is None else base.metrics.device.type,
            launcher=self.launcher,
            launcher_overrides=self.launcher_overrides,
            devices=tuple(d for d in self._devices() if d is not None) if self.launcher == LOCAL_LAUNCHER else (),
            workload_overrides=self.workload,
            levers=self.levers,
            rungs=rungs,
            best=self._best(rungs),
            verdicts=self._verdicts(),
            notes=self._notes(),
            settings={}
            if base is None
            else {
                "repeats": base.metrics.settings.repeats,
                "warmup": base.metrics.settings.warmup,
                "max_new_tokens": base.metrics.settings.max_new_tokens,
                "inputs": len(base.metrics.images),
            },
            decode_tokens=self.decode_tokens,
            decode_tokens_source=self.decode_source,
            memory_budget_gib=self.budget_gib,
            near_tie_tolerance=self.tie_tolerance,
            latency_target=self.latency_target,
        )
        return whatif_judge.with_goals(record)

    @staticmethod
    def _best(rungs: Sequence[Rung]) -> str | None:
        """The fastest latency-only rung that beat the baseline and changed something (a reused ladder rung counts as
        its lever)."""
        scored = [
            r
            for r in rungs
            if r.state == MEASURED
            and r.reused is None
            and not r.changes_workload
            and r.no_change is None  # ran as the baseline did: a gain there is noise
            and figures.helped(r.speedup)
        ]
        if not scored:
            return None
        return max(scored, key=lambda r: r.speedup.value if r.speedup else 0.0).name

    def _verdicts(self) -> tuple[Verdict, ...]:
        out = []
        base = self.rungs.get(BASELINE_NAME)
        base_passes = None if base is None or base.figures is None else base.figures.objective.n
        for lever in self.levers:
            rung = self.rungs.get(lever.name)
            if rung is None:
                continue
            out.append(
                Verdict(
                    lever=lever.name,
                    helped=figures.helped(rung.speedup) and rung.no_change is None,  # a no-op's gain is noise
                    line=_verdict_line(rung, base_passes),
                    judged=rung.state == MEASURED and figures.judged(rung.speedup),
                )
            )
        return tuple(out)

    def _notes(self) -> tuple[str, ...]:
        notes = [f"{name} is not stacked on the ladder: {why}." for name, why in self.left_out]
        notes += [
            f"{name} is stacked on the ladder after the levers that helped: its {self.goal.label} moved only within "
            f"noise, but its {parts} beyond noise, with no part worse."
            for name, parts in self.stacked_by_parts
        ]
        notes += self._pass_notes()
        notes += whatif_judge.host_drift(self.rungs.values())
        notes += whatif_judge.unrepeatable_outputs(self.rungs.values())
        if bool(self.cfg.whatif_run.ladder_latency_only):
            workload = [r.name for r in self.rungs.values() if r.phase == ALONE and r.changes_workload]
            if workload:
                notes.append(
                    f"{', '.join(workload)} change(s) the workload (what is computed, not only how fast): measured "
                    "alone, never stacked on the ladder (whatif_run.ladder_latency_only=true)."
                )
        return tuple(notes)

    def _pass_notes(self) -> list[str]:
        """Why levers were left unjudged (too few passes), and warm-up passes that differ between the rungs."""
        measured = [r for r in self.rungs.values() if r.state == MEASURED and r.figures is not None]
        notes = []
        unjudged = [r.name for r in measured if r.phase == ALONE and not figures.judged(r.speedup)]
        if unjudged:
            notes.append(
                f"{', '.join(unjudged)}: too few timed passes for an interval (each side needs ≥ 3; set "
                "run.repeats=3 or more), so no lever is called helped or best from them and none is stacked on the "
                "ladder; their ratios are single measurements."
            )
        warmups = {r.name: r.figures.warmup_passes for r in measured if r.figures is not None}
        if len(set(warmups.values())) > 1:
            counts = ", ".join(f"{name} {n}" for name, n in warmups.items())
            notes.append(
                f"The rungs ran different warm-up passes per input ({counts}): stage1-run gives a compiled runtime "
                "the warm-up passes that absorb its compilation, so a rung without warm-up pays its first-pass costs "
                "in its timed passes; set run.warmup to the largest for a like-for-like comparison."
            )
        return notes

    def _write_record(self, record: WhatIfRecord) -> None:
        from llm_perf_opt.report import whatif_report

        self.art.write_json(WHATIF_FILE, record)
        whatif_report.write_all(self.art, record)

    def _write_progress(self) -> None:
        """What is known so far, in case the run is stopped before its end (pending rungs say so)."""
        self._write_record(attrs.evolve(self._record(), notes=(*self._notes(), IN_PROGRESS)))

    def _write(self, partial: str) -> None:
        """Write what is known so far when the run stops early."""
        if not self.rungs:
            return
        log.warning("writing the rungs measured so far: %s", partial)
        record = attrs.evolve(self._record(), notes=(*self._notes(), f"The run did not finish: {partial}."))
        self._write_record(attrs.evolve(record, time_budget=self._budget()))
        self._render_rungs()

    def _render_rungs(self) -> None:
        """Render the reports of every rung folder from its records (rungs write records only: `report.render=false`,
        so their "What to try" cites the what-if record as it ends): in parallel, each forked from the preloaded
        server when there is one, else one after the other here."""
        run_dir = self.art.run_dir
        folders = {
            name: run_dir / rung.folder
            for name, rung in self.rungs.items()
            if rung.folder is not None and rung.reused is None and (run_dir / rung.folder / METRICS_FILE).is_file()
        }  # not a ladder rung reusing another's folder, nor a rung that wrote no records
        if not folders:
            return
        with self.feedback.step(f"rendering the reports of {len(folders)} rung(s)", part="reports"):
            left = self._render_forked(folders) if self.forks is not None else folders
            for name, folder in left.items():
                _render_rung(name, folder)

    def _render_forked(self, folders: dict[str, Path]) -> dict[str, Path]:
        """Render each folder in a process forked from the preloaded server, all at once; the folders whose render
        failed there (to be rendered here)."""
        assert self.forks is not None
        logs = self.art.run_dir / "logs"
        started = {
            name: self.forks.spawn([str(folder)], logs / f"render-{folder.name}.log", {}, module=RENDER_MODULE)
            for name, folder in folders.items()
        }
        failed = {}
        for name, process in started.items():
            if process.wait() != 0:
                log.warning("rendering rung %s in a forked process failed (see %s); rendering it here", name, logs)
                failed[name] = folders[name]
        return failed


def _render_rung(name: str, folder: Path) -> None:
    """Rebuild one rung folder's reports here (a failure is logged: the records stand)."""
    from llm_perf_opt.pipeline.stage1_render import render

    try:
        render(folder)
    except (RecordError, OSError) as exc:
        log.warning("the reports of rung %s were not rebuilt (they cite the what-if run as it was): %s", name, exc)


def _interrupted(rung: Rung, folder: Path, goal: Objective, decode_tokens: int | None) -> Rung:
    """A rung stopped with the what-if run: the figures of the passes it measured, not judged against the baseline."""
    try:
        stage1 = load_stage1(folder)
        measured = figures.rung_figures(stage1, goal, decode_tokens)
    except (RecordError, ValueError):
        return attrs.evolve(rung, state=INTERRUPTED, reason="stopped with the what-if run before its first timed pass")
    s = stage1.metrics.settings
    if s.partial and s.measured_passes is not None and s.asked_passes is not None:
        passes = f"{s.measured_passes} of {s.asked_passes}"
    else:  # stopped while it wrote its results
        passes = f"all {len(stage1.metrics.records)}"
    reason = f"stopped with the what-if run after {passes} timed passes; not judged against the baseline"
    return attrs.evolve(rung, state=INTERRUPTED, reason=reason, figures=measured)


def _verdict_line(rung: Rung, base_passes: int | None) -> str:
    if rung.state != MEASURED:
        return f"{rung.name}: {rung.state} — {rung.reason}"
    s = rung.speedup
    if s is None:
        return f"{rung.name}: no comparable figure"
    if figures.judged(s):
        parts = [f"{rung.name}: {s.value:.2f}× ({s.verdict})"]
    else:
        parts = [
            f"{rung.name}: {s.value:.2f}× {_passes_text(base_passes, rung)}, not judged (an interval needs "
            f"≥ {MIN_VALUES_FOR_CI} passes per side)"
        ]
    o = rung.outputs
    if o is not None:
        if o.identical:
            parts.append(f"outputs identical for {o.compared_tokens} tokens")
        elif o.within_tolerance:
            parts.append(
                f"outputs identical up to a near-tie at generated token {o.first_departure} (within tolerance)"
            )
        else:
            parts.append(f"outputs depart at generated token {o.first_departure}")
    if rung.changes_workload:
        parts.append("changes the workload")
    return whatif_judge.with_flags(", ".join(parts), rung)


def _passes_text(base_passes: int | None, rung: Rung) -> str:
    """The pass counts behind an unjudged ratio: "on single passes", or "on 2 vs 1 timed passes"."""
    counts = (base_passes, None if rung.figures is None else rung.figures.objective.n)
    if counts == (1, 1):
        return "on single passes"
    base, own = ("?" if n is None else str(n) for n in counts)
    return f"on {base} vs {own} timed passes"

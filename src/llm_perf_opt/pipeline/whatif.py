"""`perf-whatif`: the baseline, each lever alone, then the cumulative ladder of the levers that helped, each rung a
`stage1-run` of the same workload in its own process; the figures, outputs and attribution of every rung in
`whatif.json`, rendered to `whatif.md` and plots."""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import CommandConfig, plain
from llm_perf_opt.config_schema import RuntimeSchema, WhatIfNodes, WhatIfRunSchema, WhatIfSchema
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure import whatif as figures
from llm_perf_opt.measure.whatif_analysis import STOPPED_FIRST, WhatIfAnalysis, WhatIfJob
from llm_perf_opt.override_text import override_key, override_value
from llm_perf_opt.pipeline import whatif_hydra
from llm_perf_opt.pipeline.rung_forks import ForkServer, StartingServer
from llm_perf_opt.pipeline.whatif_advised import AdvisedPlan, advised_plan
from llm_perf_opt.pipeline.whatif_judge import DID_NOT_FINISH, IN_PROGRESS, judging_settings
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
from llm_perf_opt.records.common import TimeBudget
from llm_perf_opt.records.folders import CONFIG_FILE, METRICS_FILE, WHATIF_FILE, Stage1Folder, load_stage1
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
    Lever,
    Rung,
    WhatIfRecord,
)

log = logging.getLogger("llm_perf_opt.whatif")

RENDER_MODULE = "llm_perf_opt.cli.stage1_report"  # a rung's reports, rendered in a forked process

RUNGS_DIR = "rungs"
LOGS_DIR = "logs"
BASELINE_NAME = "baseline"
# The baseline also keeps the top two logits behind each token (one untimed eager pass per input), by which an
# output departure of another rung is judged a near-tie or not (whatif_run.near_tie_tolerance).
BASELINE_EXTRA = ("run.save_top2_logits=true",)
# A lever's name becomes a rung's folder and log name (rungs/NN-name, logs/NN-name.log).
LEVER_NAME = re.compile(r"[A-Za-z0-9_-]+")
# Keys of perf-whatif itself, never passed to a rung.
OWN_KEYS = ("whatif", "whatif_run", "hydra")


def workload_overrides(task_overrides: Sequence[str]) -> tuple[str, ...]:
    """The command line's overrides that set the workload (every one but perf-whatif's own keys)."""
    return tuple(o for o in task_overrides if override_key(o).split(".", 1)[0].split("/", 1)[0] not in OWN_KEYS)


def read_levers(node: Mapping[str, Any] | None, exclude: Sequence[str]) -> tuple[Lever, ...]:
    """The preset's levers (`whatif.levers`: name -> {overrides, about, changes, needs}) minus `exclude`."""
    levers = plain(node) if node is not None else {}
    if not levers:
        raise UserError(
            "the what-if preset has no levers (whatif.levers is empty)",
            "Pick whatif=decode|tuning|quantize|vision|batch|throughput|all, or whatif=advised "
            "whatif.from_run=<stage1-run folder> for the levers its advice names",
        )
    return tuple(_lever(name, levers[name]) for name in _kept([str(name) for name in levers], exclude))


def _kept(names: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """The lever names `whatif_run.exclude` leaves (it may name only levers there are, and must leave one)."""
    unknown = sorted(set(exclude) - set(names))
    if unknown:
        raise UserError(
            f"whatif_run.exclude names {', '.join(unknown)}, which the preset does not have",
            f"Exclude some of {', '.join(names)}",
        )
    kept = [name for name in names if name not in exclude]
    if not kept:
        raise UserError(
            f"whatif_run.exclude leaves no lever of the preset ({', '.join(names)}): the baseline alone judges nothing",
            "Exclude fewer levers, or run `stage1-run` with the workload's overrides to measure the baseline alone",
        )
    return kept


DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")


def check_whatif_settings(command: CommandConfig, whatif: WhatIfNodes) -> tuple[Lever, ...]:
    """perf-whatif's own settings (`whatif`; `command`: the settings of the same config), checked before anything
    starts (the keys' types are the schema's, their ranges settings_schema's): the preset's levers (whatif=advised:
    those its folder's advice names) minus whatif_run.exclude (at least one), the devices, the launcher and its
    overrides, the memory budget and the near-tie tolerance. Returns the levers."""
    exclude = list(whatif.whatif_run.exclude or ())
    plan = advised_plan(whatif.whatif)
    if plan is None:
        levers = read_levers(whatif.whatif.levers, exclude)
    elif whatif.whatif.levers:  # whatif=advised: the levers of the folder's advice, the preset names none of its own
        raise UserError(
            "whatif=advised takes its levers from the advice of whatif.from_run, yet whatif.levers names some",
            "Drop the +whatif.levers overrides, or run them with a preset of their own",
        )
    else:
        kept = _kept([lever.name for lever in plan.levers], exclude)
        levers = tuple(lever for lever in plan.levers if lever.name in kept)
    rung_devices(whatif.whatif_run)
    _, overrides = launcher_settings(whatif.whatif_run)
    if overrides:
        from llm_perf_opt.override_keys import check_override_keys

        with _outside_running_hydra():
            check_override_keys("stage1", overrides, command="stage1-run")
    judging_settings(command, whatif)
    return levers


def rung_devices(run: WhatIfRunSchema) -> list[str | None]:
    """whatif_run.devices: the devices the local launcher runs rungs on, one at a time each ([None]: `device`)."""
    chosen = run.devices
    if chosen is None:
        return [None]
    if not chosen:
        raise UserError(
            f"whatif_run.devices={chosen} is not a list of devices", "Set whatif_run.devices=[cuda:0,cuda:1]"
        )
    for device in chosen:
        if not DEVICE.fullmatch(str(device)):
            raise UserError(
                f"whatif_run.devices holds {device}, which is not a device",
                "Give devices such as cpu, cuda or cuda:N, e.g. whatif_run.devices=[cuda:0,cuda:1]",
            )
    return [str(d) for d in chosen]


def launcher_settings(run: WhatIfRunSchema) -> tuple[str, tuple[str, ...]]:
    """whatif_run.launcher (local | hydra) and, for hydra, the overrides that choose Hydra's launcher."""
    name = run.launcher
    if name not in (LOCAL_LAUNCHER, HYDRA_LAUNCHER):
        raise UserError(
            f"whatif_run.launcher={name} is not known",
            f"Use {LOCAL_LAUNCHER} (perf-whatif starts each rung) or {HYDRA_LAUNCHER} (one Hydra multirun per phase)",
        )
    try:
        overrides = whatif_hydra.parse_launcher(run.hydra_launcher)
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
    if run.devices is not None:
        raise UserError(
            "whatif_run.devices places the rungs of whatif_run.launcher=local; with launcher=hydra the Hydra "
            "launcher places them",
            "Drop whatif_run.devices; for one rung per GPU add hydra/launcher=joblib and "
            "hydra.launcher.n_jobs=<GPUs> to whatif_run.hydra_launcher (each job then claims a free GPU)",
        )
    return name, overrides


COMPILE_FIELDS = ("compile", "compile_vision")  # the runtime settings that make a rung compile (none: it does not)


def rungs_compile(whatif: WhatIfSchema, runtime: RuntimeSchema, levers: Sequence[Lever] = ()) -> bool:
    """Whether a rung of this what-if may compile: the workload's own runtime (`runtime`) does, or a lever of the
    preset (`whatif.levers`, or one of `levers`) sets runtime.compile or runtime.compile_vision to anything but none
    (read as given: the levers are checked later)."""
    if any(str(getattr(runtime, field) or "none") != "none" for field in COMPILE_FIELDS):
        return True
    keys = {f"runtime.{field}" for field in COMPILE_FIELDS}
    given = [
        [str(o) for o in (spec.get("overrides") or ())] if isinstance(spec, Mapping) else []
        for spec in whatif.levers.values()
    ]
    return any(
        override_key(o) in keys and (override_value(o) or "none").strip().lower() not in ("none", "null", "")
        for overrides in [*given, *(lever.overrides for lever in levers)]
        for o in overrides
    )


def _lever(name: str, spec: DictConfig) -> Lever:
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
    """Why `stage1-run` would refuse these overrides before running (None when it accepts them). The runtime settings
    are read from the config the key check composed, not composed again (a preset has up to a dozen levers)."""
    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.config_data import stage1_nodes
    from llm_perf_opt.override_keys import check_override_keys
    from llm_perf_opt.session.runtime import RuntimeSettings
    from llm_perf_opt.settings_schema import check_config

    composed: list[DictConfig] = []  # by the key check, checked here rather than composed again
    try:
        with _outside_running_hydra():
            check_override_keys("stage1", overrides, command="stage1-run", check=composed.append)
            for cfg in composed:
                check_config(cfg)
                RuntimeSettings.from_nodes(stage1_nodes(cfg))
            if not composed:  # the key check composed nothing (e.g. Hydra could not compose it there): compose here
                RuntimeSettings.from_nodes(stage1_nodes(compose_config("stage1", *overrides)))
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

    return (device == "auto" or device.startswith("cuda")) and torch.cuda.is_available()


def refusal(workload: Sequence[str], overrides: Sequence[str], hydra_folder: str | None) -> str | None:
    """Why a rung cannot run (stage1-run's validation; with `hydra_folder`, the Hydra launcher's lever config too)."""
    refused = validate([*workload, *overrides])
    if refused is None and hydra_folder is not None:
        try:
            whatif_hydra.rung_config(hydra_folder, overrides, workload)
        except whatif_hydra.NotExpressible as exc:
            refused = f"not runnable through whatif_run.launcher=hydra: {exc}"
    return refused


def whatif_config(
    cfg: DictConfig, whatif: WhatIfNodes, workload: Sequence[str]
) -> tuple[DictConfig, WhatIfNodes, tuple[str, ...], AdvisedPlan | None]:
    """The what-if's config, typed nodes and workload as its run takes them, and its advised plan: whatif=advised
    composes the workload of whatif.from_run under the command line's (`advised_config`); any other preset keeps them
    as given."""
    plan = advised_plan(whatif.whatif, workload)
    if plan is None:
        return cfg, whatif, tuple(workload), None
    return (*advised_config(cfg, whatif, plan, workload), plan)


def advised_config(
    cfg: DictConfig, whatif: WhatIfNodes, plan: AdvisedPlan, workload: Sequence[str]
) -> tuple[DictConfig, WhatIfNodes, tuple[str, ...]]:
    """whatif=advised: the what-if's config with its workload keys composed from the folder's workload and then the
    command line's (`workload`, which wins), and its typed nodes, their objective the best advice's unless
    whatif.objective is set; and that workload, which every rung runs."""
    from llm_perf_opt.config_compose import compose_config

    full = (*plan.workload, *workload)
    try:
        with _outside_running_hydra():
            stage1 = compose_config("stage1", *full)
    except (HydraException, OmegaConfBaseException) as exc:
        raise UserError(
            f"the workload of whatif.from_run={plan.folder} does not compose as stage1-run settings ({' '.join(full)}):"
            f" {f'{type(exc).__name__}: {exc}'.splitlines()[0]}",
            "Override the setting it names on the command line, or run stage1-run again with this toolkit and give "
            "its folder",
        ) from None
    objective = whatif.whatif.objective or plan.goal
    out = copy.deepcopy(cfg)
    with open_dict(out):
        for key in stage1:
            out[key] = stage1[key]
        out.whatif.objective = objective  # as the run's config.yaml records it
    return out, replace(whatif, whatif=replace(whatif.whatif, objective=objective)), full


@attrs.define
class _Plan:
    """A rung before it runs: what it is and, once known, why it does not run."""

    rung: Rung
    job: RungJob | None = None


class WhatIfRun:
    """One `perf-whatif` invocation over one folder: it schedules the rungs and hands their records to a
    `WhatIfAnalysis`, which judges them and builds the record."""

    def __init__(
        self,
        command: CommandConfig,
        run_dir: Path,
        run_id: str,
        workload: Sequence[str],
        feedback: Feedback | None = None,
        *,
        whatif: WhatIfNodes,
        advised: AdvisedPlan | None = None,
    ) -> None:
        # whatif=advised: `command`, `whatif` and `workload` are `whatif_config`'s (whatif.from_run's workload, the
        # command line's on top), `advised` its plan: the levers of the folder's advice
        self.advised = advised
        self.command = command  # the settings of the composed config (saved as config.yaml), typed and read once
        self.whatif = whatif  # perf-whatif's own typed nodes of `cfg` (whatif, whatif_run), read once by the command
        self.run_id = run_id
        self.workload = tuple(workload)
        self.feedback = feedback or Feedback()
        self.art = ArtifactsManager(run_dir, stage="whatif")
        self.settings = judging_settings(command, whatif)
        self.rungs: dict[str, Rung] = {}  # as they ran (the analysis judges them)
        self.folders: dict[str, Stage1Folder] = {}  # each measured rung's records
        self.levers: tuple[Lever, ...] = ()  # the preset's, read when the run starts
        self.index = 0
        self.launcher, self.launcher_overrides = launcher_settings(whatif.whatif_run)
        self.devices = rung_devices(whatif.whatif_run)
        # whatif_run.fork_rungs: the local launcher forks each rung from a preloaded server (no fork on Windows)
        self.fork_rungs = whatif.whatif_run.fork_rungs and self.launcher == LOCAL_LAUNCHER and hasattr(os, "fork")
        self.overlap_rungs = self.launcher == LOCAL_LAUNCHER and whatif.whatif_run.overlap_rungs
        self.forks: ForkServer | None = None  # the preloaded server the rungs are forked from, once it has imported
        self.starting: StartingServer | None = None  # that server while it imports (launched when the run starts)
        self.caches = SharedCaches()  # build once, reuse: what the rungs share, found when the run starts
        self.tally: StepHandle | None = None  # every rung's progress across the phases, while they run

    # ---- driver ------------------------------------------------------------------------------------
    def execute(self) -> WhatIfRecord:
        # before the folder is claimed and anything starts
        self.levers = check_whatif_settings(self.command, self.whatif)
        self.art.start(self.run_id)
        try:
            # The fork server first: its imports overlap this process's own (torch) and the checks of every rung's
            # config; it is waited for when the first rung is due, and cancelled if none is.
            compiles = rungs_compile(self.whatif.whatif, self.command.nodes.runtime, self.levers)
            self.starting = StartingServer.launch(compiles=compiles) if self.fork_rungs else None
            self.caches = shared_caches(self.whatif.whatif_run, self.command.model, self.art.run_dir)
            with self.feedback.session():
                record = self._run()
        except KeyboardInterrupt as stop:
            why = interrupts.cause(stop)
            self._write(f"{why}; the rungs still running were stopped", stopped=True)
            self.art.finish(artifacts.INTERRUPTED, f"{why}; the rungs so far were written")
            raise
        except UserError as exc:
            self._write(str(exc), stopped=True)
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
        print_summary(self.feedback, self.art.run_dir, self.run_id, record)
        return record

    def _budget(self) -> TimeBudget:
        """Where the run's time went, by phase, with how many rungs ran and their mean time."""
        walls = [r.wall_s for r in self.rungs.values() if r.wall_s is not None and r.reused is None]
        note = None
        if walls:
            mean = sum(walls) / len(walls)
            overlap = " (rungs' times may overlap)" if self.overlap_rungs or len(self.devices) > 1 else ""
            note = f"{len(walls)} rung(s), {mean:.0f} s each on average{overlap}"
        return self.feedback.budget(note)

    def _run(self) -> WhatIfRecord:
        self.art.write_text(CONFIG_FILE, OmegaConf.to_yaml(self.command.composed, resolve=True))
        cuda = all(has_cuda(device or self.command.device) for device in self.devices)  # None: the command's device
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
            for lever in self.levers
        ]
        self._await_forks(needed=base.job is not None)
        planned = sum(1 for p in [base, *alone] if p.job is not None)
        with self.feedback.tally("rungs (all phases)", total=planned) as self.tally:
            self._phases(base, alone)
        self.tally = None
        return self._finish()

    def _phases(self, base: _Plan, alone: list[_Plan]) -> None:
        """The baseline, each lever alone, then the ladder."""
        with self.feedback.step("the baseline", total=1, part="baseline") as bar:
            self._execute(BASELINE, [base], bar.advance)
        self._write(IN_PROGRESS)
        if self.rungs[BASELINE_NAME].state != MEASURED:  # without a baseline no lever can be judged: stop here
            for p in alone:
                if p.job is not None:
                    self.rungs[p.rung.name] = attrs.evolve(p.rung, state=SKIPPED, reason="not run: the baseline failed")
            return
        with self.feedback.step(f"{len(alone)} lever(s), each alone", total=len(alone), part="levers") as bar:
            self._execute(ALONE, alone, bar.advance)
        self._write(IN_PROGRESS)
        self._ladder()

    def _finish(self) -> WhatIfRecord:
        """The record (which the rungs' reports cite), the rungs' reports, then the what-if's own with the time
        budget."""
        from llm_perf_opt.report import whatif_report

        record = self._record()
        with self.feedback.step("writing the record and the reports", part="reports"):
            self.art.write_json(WHATIF_FILE, record)
            render_rungs(self.art.run_dir, self.rungs, self.forks, self.feedback)
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
        folder_name = figures.folder_name(self.index, name)
        hydra = self.launcher == HYDRA_LAUNCHER
        if skip is None and (refused := refusal(self.workload, overrides, folder_name if hydra else None)) is not None:
            rung = attrs.evolve(rung, state=INVALID, reason=refused)
        self.rungs[name] = rung
        if rung.state != PENDING:
            log.warning("%s: %s (%s)", name, rung.state, rung.reason)
            return _Plan(rung)
        self.index += 1
        job = RungJob(
            name=name,
            workload=self.workload,
            levers=(*overrides, *BASELINE_EXTRA) if phase == BASELINE else overrides,
            folder=self.art.run_dir / RUNGS_DIR / folder_name,
            log=phase_log(self.art.run_dir, phase) if hydra else self.art.run_dir / LOGS_DIR / f"{folder_name}.log",
            shared=self.caches.overrides,
            env=self.caches.env,
        )
        return _Plan(rung, job)

    def _execute(self, phase: str, plans: Sequence[_Plan], advance: Any) -> None:
        jobs = [p.job for p in plans if p.job is not None]
        for _ in range(len(plans) - len(jobs)):  # the rungs that do not run
            advance()
        limit = self.whatif.whatif_run.rung_timeout_s

        def done(outcome: RungOutcome) -> None:
            took = "" if outcome.wall_s is None else f" in {outcome.wall_s:.0f} s"
            why = f" ({outcome.message})" if outcome.message else ""
            log.info("rung %s: %s%s%s", outcome.name, outcome.state, took, why)
            advance()
            if self.tally is not None:
                self.tally.advance()

        try:
            if self.launcher == HYDRA_LAUNCHER:
                log_file = phase_log(self.art.run_dir, phase)
                outcomes = whatif_hydra.run_phase(jobs, self.launcher_overrides, log_file, limit, done)
            else:
                outcomes = run_rungs(jobs, self.devices, limit, done, self.forks, overlap=self.overlap_rungs)
        except KeyboardInterrupt:  # the rungs were stopped: those that started as their folders tell, one stopped
            for job in jobs:  # mid-way with the passes it measured; those that did not as skipped
                outcome = stopped_outcome(job)
                if outcome is None:
                    self.rungs[job.name] = attrs.evolve(self.rungs[job.name], state=SKIPPED, reason=STOPPED_FIRST)
                else:
                    self._take(job, outcome)
            raise
        for job in jobs:
            self._take(job, outcomes[job.name])

    def _take(self, job: RungJob, outcome: RungOutcome) -> None:
        """A rung's outcome: measured (its records handed to the analysis), interrupted, or failed."""
        rung = attrs.evolve(
            self.rungs[job.name], folder=figures.relative(job.folder, self.art.run_dir), wall_s=outcome.wall_s
        )
        if outcome.state == common.INTERRUPTED:
            self.rungs[job.name] = _interrupted(rung, job.folder, self._analysis())
            return
        if outcome.state != common.COMPLETE:
            self.rungs[job.name] = attrs.evolve(rung, state=FAILED, reason=outcome.message or outcome.state)
            return
        try:
            self.folders[job.name] = load_stage1(job.folder)
            measured = self._analysis().folder_figures(self.folders[job.name])  # the baseline's sets the decode length
        except (RecordError, ValueError) as exc:
            self.folders.pop(job.name, None)
            self.rungs[job.name] = attrs.evolve(rung, state=FAILED, reason=str(exc))
            return
        self.rungs[job.name] = attrs.evolve(rung, state=MEASURED, reason=None, figures=measured)

    def _ladder(self) -> None:
        """The ladder the analysis plans from the levers alone: its first rung is the best lever's own (not run
        again), each next one stacks one lever more."""
        plan = self._analysis().ladder_plan()
        if plan is None or not plan.steps:
            return
        first = plan.steps[0]
        reused = self.rungs[first.levers[0]]
        name = f"ladder-1-{first.levers[0]}"
        self.rungs[name] = attrs.evolve(reused, name=name, phase=LADDER, levers=first.levers, reused=reused.name)
        workload = {lever.name for lever in self.levers if lever.changes == WORKLOAD}
        plans = [
            self._plan(
                f"ladder-{i}-{step.levers[-1]}",
                LADDER,
                step.levers,
                step.overrides,
                changes_workload=bool(workload.intersection(step.levers)),
            )
            for i, step in enumerate(plan.steps[1:], start=2)
        ]
        if plans:
            if self.tally is not None:
                self.tally.grow(sum(1 for p in plans if p.job is not None))
            with self.feedback.step(f"the ladder: {len(plans)} more rung(s)", total=len(plans), part="ladder") as bar:
                self._execute(LADDER, plans, bar.advance)

    # ---- the record --------------------------------------------------------------------------------
    def _analysis(self) -> WhatIfAnalysis:
        """The judging of the rungs so far, from their records."""
        return WhatIfAnalysis(self.settings, self.levers, self.rungs.values(), self.folders)

    def _record(self, *notes: str, time_budget: TimeBudget | None = None) -> WhatIfRecord:
        """`whatif.json` as it stands, with `notes` on how the run ended."""
        job = WhatIfJob(
            run_id=self.run_id,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            preset=self.whatif.whatif.name or "custom",
            model=self.command.model.name,
            workload_overrides=self.workload,
            launcher=self.launcher,
            launcher_overrides=self.launcher_overrides,
            devices=tuple(d for d in self.devices if d is not None) if self.launcher == LOCAL_LAUNCHER else (),
            notes=notes,
            time_budget=time_budget,
            advised_from=None if self.advised is None else self.advised.advised_from,
        )
        return self._analysis().record(job)

    def _write(self, note: str, *, stopped: bool = False) -> None:
        """What is known so far, in case the run stops before its end (pending rungs say so); `stopped`: it has
        stopped early, so with the time budget and the rungs' reports."""
        from llm_perf_opt.report import whatif_report

        if stopped and not self.rungs:
            return
        if stopped:
            log.warning("writing the rungs measured so far: %s", note)
            note = f"{DID_NOT_FINISH}{note}."
        record = self._record(note, time_budget=self._budget() if stopped else None)
        self.art.write_json(WHATIF_FILE, record)
        whatif_report.write_all(self.art, record)
        if stopped:
            render_rungs(self.art.run_dir, self.rungs, self.forks, self.feedback)


def phase_log(run_dir: Path, phase: str) -> Path:
    """The log of a phase's multirun (whatif_run.launcher=hydra), which its rungs share."""
    return run_dir / LOGS_DIR / f"phase-{phase}.log"


def print_summary(feedback: Feedback, run_dir: Path, run_id: str, record: WhatIfRecord) -> None:
    """The closing lines: rungs, the best lever, where the time went, then whatif.md's path."""
    from llm_perf_opt.report.whatif_goodput import goodput_summary
    from llm_perf_opt.report.whatif_report import WHATIF_REPORT

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
    if (goodput := goodput_summary(record)) is not None:
        rows.append(("goodput", goodput))
    feedback.summary(f"perf-whatif {run_id}: complete", rows, str(run_dir / WHATIF_REPORT), record.time_budget)


def render_rungs(run_dir: Path, rungs: Mapping[str, Rung], forks: ForkServer | None, feedback: Feedback) -> None:
    """Render the reports of every rung folder from its records (rungs write records only: `report.render=false`,
    so their "What to try" cites the what-if record as it ends): in parallel, each forked from the preloaded
    server when there is one, else one after the other here."""
    folders = {
        name: run_dir / rung.folder
        for name, rung in rungs.items()
        if rung.folder is not None and rung.reused is None and (run_dir / rung.folder / METRICS_FILE).is_file()
    }  # not a ladder rung reusing another's folder, nor a rung that wrote no records
    if not folders:
        return
    with feedback.step(f"rendering the reports of {len(folders)} rung(s)", part="reports"):
        left = _render_forked(forks, folders, run_dir / LOGS_DIR) if forks is not None else folders
        for name, folder in left.items():
            _render_rung(name, folder)


def _render_forked(forks: ForkServer, folders: dict[str, Path], logs: Path) -> dict[str, Path]:
    """Render each folder in a process forked from the preloaded server, all at once; the folders whose render
    failed there (to be rendered here)."""
    started = {
        name: forks.spawn([str(folder)], logs / f"render-{folder.name}.log", {}, module=RENDER_MODULE)
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


def _interrupted(rung: Rung, folder: Path, analysis: WhatIfAnalysis) -> Rung:
    """A rung stopped with the what-if run: the figures of the passes it measured, not judged against the baseline."""
    try:
        stage1 = load_stage1(folder)
        measured = analysis.folder_figures(stage1)
    except (RecordError, ValueError):
        return attrs.evolve(rung, state=INTERRUPTED, reason="stopped with the what-if run before its first timed pass")
    s = stage1.metrics.settings
    if s.partial and s.measured_passes is not None and s.asked_passes is not None:
        passes = f"{s.measured_passes} of {s.asked_passes}"
    else:  # stopped while it wrote its results
        passes = f"all {len(stage1.metrics.records)}"
    reason = f"stopped with the what-if run after {passes} timed passes; not judged against the baseline"
    return attrs.evolve(rung, state=INTERRUPTED, reason=reason, figures=measured)

"""Running a what-if phase (the baseline, the levers alone, the ladder) as one Hydra multirun of `stage1-run`
(`whatif_run.launcher=hydra`), so any Hydra launcher places the rungs (basic: one after the other; joblib: over a
machine's GPUs; submitit: over a cluster).

Each rung's lever overrides become a config `rung_configs/whatif_rung/NN-name.yaml` (values as nested keys, group
choices as `override /group: choice` defaults); the child sweeps `+whatif_rung=NN-a,NN-b,…` with the workload on its
command line and writes each rung to `rungs/NN-name`, where a rung of the local launcher goes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from llm_perf_opt import artifacts
from llm_perf_opt.override_keys import is_group
from llm_perf_opt.override_text import override_key, quoted_override
from llm_perf_opt.pipeline.whatif_rungs import (
    PAST_LIMIT_FIX,
    PAST_LIMIT_MARKED,
    STAGE1_MODULE,
    RungJob,
    RungOutcome,
    log_tail,
    read_outcome,
    run_process,
    status_wall_s,
)
from llm_perf_opt.records import common
from llm_perf_opt.records.folders import STATUS_FILE
from llm_perf_opt.records.whatif import hydra_launcher_name

RUNG_GROUP = "whatif_rung"  # the config group the rungs' configs form
RUNG_CONFIGS_DIR = "rung_configs"  # under the what-if folder: <this>/whatif_rung/NN-name.yaml
JOB_DEVICE = "device=${llo_job_device:}"  # each parallel job claims a free GPU (llm_perf_opt.gpu_claim)
# The stage1-run callbacks a phase leaves out: the run-folder guard would refuse the `rungs/` folder once the
# baseline is in it, and the sweep summary is for numbered sweep jobs (the what-if report reads the rungs).
_CALLBACKS_OFF = ("~hydra.callbacks.run_folder_guard", "~hydra.callbacks.sweep_summary")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_LOCAL = "use whatif_run.launcher=local, which passes the overrides to each rung's command line"


class NotExpressible(ValueError):
    """A rung that cannot run through a Hydra launcher (the message says why and what to do)."""


def parse_launcher(value: object) -> tuple[str, ...]:
    """`whatif_run.hydra_launcher`: a list of `hydra/launcher=…` and `hydra.launcher.…=…` overrides."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"whatif_run.hydra_launcher={value} is not a list of overrides")
    overrides = tuple(str(v) for v in value)
    bad = [o for o in overrides if not o.lstrip("+~").startswith(("hydra/launcher", "hydra.launcher"))]
    if bad:
        raise ValueError(f"whatif_run.hydra_launcher holds {', '.join(bad)}, which do not set the Hydra launcher")
    return overrides


def rung_config(name: str, levers: Sequence[str], workload: Sequence[str] = ()) -> str:
    """The YAML of a rung's config (`whatif_rung/<name>.yaml`) holding its lever overrides; NotExpressible when one
    cannot be written as a config (a deletion, a package, a sweep) or the workload sets the same key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if not _NAME.match(name):
        raise NotExpressible(f"the rung name {name} cannot name a config file; rename the lever, or {_LOCAL}")
    try:
        parsed = OverridesParser.create().parse_overrides(list(levers))
    except HydraException as exc:
        raise NotExpressible(f"{', '.join(levers)}: {exc}") from exc
    workload_keys = {override_key(o) for o in workload}
    defaults: list[Any] = []
    values: dict[str, Any] = {}
    for override in parsed:
        line = override.input_line
        key = override.key_or_group
        if override.is_delete():
            raise NotExpressible(f"{line} deletes a key, which a rung config cannot do; {_LOCAL}")
        if override.is_sweep_override() or override.package is not None or key.startswith("hydra"):
            raise NotExpressible(f"{line} cannot be written as a rung config; {_LOCAL}")
        if key in workload_keys:
            raise NotExpressible(
                f"{line} sets {key}, which the workload overrides set too (on the command line they would win over "
                f"the rung's config); drop {key} from the workload, or {_LOCAL}"
            )
        value = override.value()
        if is_group(key):
            defaults.append({f"/{key}" if override.is_add() else f"override /{key}": value})
        else:
            _set_nested(values, key.split("."), value)
    body: dict[str, Any] = ({"defaults": [*defaults, "_self_"]} if defaults else {}) | values
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True) if body else ""
    return f"# @package _global_\n# {name}: {' '.join(levers) or 'no lever (the workload alone)'}\n{text}"


def _set_nested(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):  # `a=1` then `a.b=2`: the later, deeper one replaces it
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def phase_command(jobs: Sequence[RungJob], launcher: Sequence[str], configs: Path, sweep_dir: Path) -> list[str]:
    """The one `stage1-run -m` child of a phase: the workload, the rungs swept as configs, the launcher, and (for
    jobs run at once on this machine, joblib: each claims its own GPU) `device=${llo_job_device:}` unless the
    workload or a lever sets the device."""
    sets_device = any(override_key(o) == "device" for job in jobs for o in job.overrides)
    device = [JOB_DEVICE] if hydra_launcher_name(launcher).startswith("joblib") and not sets_device else []
    return [
        sys.executable,
        "-m",
        STAGE1_MODULE,
        "-m",
        "--config-dir",
        str(configs),
        *jobs[0].workload,
        *jobs[0].shared,
        *device,
        f"+{RUNG_GROUP}={','.join(job.folder.name for job in jobs)}",
        quoted_override("hydra.sweep.dir", sweep_dir),
        f"hydra.sweep.subdir=${{hydra:runtime.choices.{RUNG_GROUP}}}",
        *_CALLBACKS_OFF,
        "run.save_prefill_logits=true",
        *launcher,
    ]


def run_phase(
    jobs: Sequence[RungJob],
    launcher: Sequence[str],
    log: Path,
    timeout_s: float | None,
    on_done: Callable[[RungOutcome], None] | None = None,
) -> dict[str, RungOutcome]:
    """Run a phase's rungs as one Hydra multirun (time limit: `timeout_s` per rung); outcomes by rung name."""
    if not jobs:
        return {}
    sweep_dir = jobs[0].folder.parent
    configs = sweep_dir.parent / RUNG_CONFIGS_DIR
    (configs / RUNG_GROUP).mkdir(parents=True, exist_ok=True)
    for job in jobs:
        text = rung_config(job.folder.name, job.levers, job.workload)
        (configs / RUNG_GROUP / f"{job.folder.name}.yaml").write_text(text, encoding="utf-8")
    limit = None if timeout_s is None else timeout_s * len(jobs)
    try:
        command = phase_command(jobs, launcher, configs, sweep_dir)
        returncode = run_process(command, log, limit, own_group=True, env=jobs[0].env)
    except KeyboardInterrupt:
        for job in jobs:
            artifacts.mark_failed(job.folder, "stopped with the what-if run (Ctrl-C or SIGTERM)")
        raise
    outcomes = {}
    for job in jobs:
        outcome = _phase_outcome(job, returncode, limit)
        outcomes[job.name] = outcome
        if on_done is not None:
            on_done(outcome)
    return outcomes


def _phase_outcome(job: RungJob, returncode: int | None, limit: float | None) -> RungOutcome:
    wall = status_wall_s(job.folder)
    if returncode is None:  # the phase ran past its limit: rungs that completed keep their figures
        stopped = f"the phase ran past its limit ({limit:g} s: whatif_run.rung_timeout_s per rung) and was stopped"
        if not (job.folder / STATUS_FILE).is_file():
            return RungOutcome(job.name, common.FAILED, f"{stopped} before this rung started ({PAST_LIMIT_FIX})", wall)
        stopped += f" ({PAST_LIMIT_FIX})"
        if artifacts.mark_failed(job.folder, stopped, replacing=PAST_LIMIT_MARKED):
            return RungOutcome(job.name, common.FAILED, stopped, wall)
        returncode = 0
    if not (job.folder / STATUS_FILE).is_file():
        never = f"the multirun (exit {returncode}) never started this rung: {log_tail(job.log)}"
        return RungOutcome(job.name, common.FAILED, never, wall)
    return read_outcome(job, returncode, wall, shared=True)

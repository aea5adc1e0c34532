"""`perf-whatif whatif=advised whatif.from_run=<stage1-run folder>`: the levers that folder's advice names (the first
`ADVISED_LEVERS` that set overrides), measured on that folder's workload (model, named workload, decode length,
runtime settings off their defaults, inputs) by the ordinary what-if run; the command line's own overrides come
after the folder's, so they win. The folder is checked before anything starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.config_schema import WhatIfSchema
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.advice import ADVISED_LEVERS, advise, advised_levers, run_workload, whatif_goal
from llm_perf_opt.override_text import override_key
from llm_perf_opt.records import common
from llm_perf_opt.records.advice import Advice
from llm_perf_opt.records.folders import WHATIF_FILE, Stage1Folder, load_stage1
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.records.whatif import AdvisedFrom, Lever

ADVISED = "advised"  # the preset (`whatif.name`) whose levers come from `whatif.from_run`
FROM_RUN = "whatif.from_run"
EXAMPLE = f"{FROM_RUN}=tmp/stage1/<run_id>"


@attrs.frozen
class AdvisedPlan:
    """What `whatif=advised` runs: the folder's workload, the levers its advice names and the advice left out."""

    folder: Path
    stage1: Stage1Folder
    advice: tuple[Advice, ...]
    levers: tuple[Lever, ...]
    not_run: tuple[Advice, ...]
    workload: tuple[str, ...]  # the folder's workload as `stage1-run` overrides
    goal: str  # the what-if goal of the best advice

    @property
    def advised_from(self) -> AdvisedFrom:
        m = self.stage1.metrics
        return AdvisedFrom(
            folder=str(self.folder),
            model=m.model.name,
            device=m.device.name,
            max_new_tokens=m.settings.max_new_tokens,
            not_run=self.not_run,
            max_levers=ADVISED_LEVERS,
        )


def input_overrides(folder: Stage1Folder) -> tuple[str, ...]:
    """The inputs the folder ran, as overrides (none where a named workload chose them; its image folder only where
    it was not the configured default, an interpolation)."""
    inputs = folder.inputs
    if folder.metrics.settings.workload_profile or inputs is None or inputs.kind != "image":
        return ()
    out = [] if inputs.dataset_root.startswith("${") else [f"dataset.root={inputs.dataset_root}"]
    if inputs.subset_filelist:
        out.append(f"dataset.subset_filelist={inputs.subset_filelist}")
    out += [f"dataset.max_images={inputs.count}", f"dataset.sampling={inputs.sampling}"]
    return tuple(out)


def _folder(raw: Any) -> Stage1Folder:
    """`whatif.from_run` as a complete `stage1-run` folder (UserError naming the fix otherwise)."""
    if raw is None or not str(raw).strip():
        raise UserError(
            f"whatif=advised needs {FROM_RUN}: the stage1-run folder whose advice ('What to try') names the levers",
            f"Add {EXAMPLE} (the folder whose report.md stage1-run printed last)",
        )
    folder = Path(str(raw)).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"{FROM_RUN}={raw} is not a folder",
            f"Give the folder of a finished stage1-run, e.g. {EXAMPLE} (the last line stage1-run prints is its "
            "report.md, inside that folder)",
        )
    if (folder / WHATIF_FILE).is_file():
        raise UserError(
            f"{FROM_RUN}={raw} is a perf-whatif folder, not a stage1-run one",
            f"Give one of its rung folders, e.g. {FROM_RUN}={folder / 'rungs' / '00-baseline'}",
        )
    try:
        stage1 = load_stage1(folder)
    except RecordError as exc:
        raise UserError(
            f"{FROM_RUN}={raw} is not a complete stage1-run folder: {exc}",
            f"Give the folder of a stage1-run that finished (run_status.json says complete), e.g. {EXAMPLE}",
        ) from None
    if stage1.status.state != common.COMPLETE:
        raise UserError(
            f"{FROM_RUN}={raw} is a stage1-run folder marked {stage1.status.state}, not complete: its advice would "
            "rest on a part of its passes",
            f"Run stage1-run again to the end and give its folder ({EXAMPLE})",
        )
    return stage1


def advised_plan(whatif: WhatIfSchema, workload: Sequence[str] | None = None) -> AdvisedPlan | None:
    """The advised plan of a config's typed `whatif` node; None for another preset (which must not set
    whatif.from_run). `workload`: the command line's, where known (a model that is no shipped config needs them)."""
    raw = whatif.from_run
    if whatif.name != ADVISED:
        if raw is not None:
            raise UserError(
                f"{FROM_RUN} is read by whatif=advised only (the levers then come from that folder's advice)",
                f"Add whatif=advised to measure that folder's advice, or drop {FROM_RUN}",
            )
        return None
    stage1 = _folder(raw)
    m = stage1.metrics
    own = run_workload(m)
    if workload is not None and not any(override_key(o) == "model" for o in (*own, *workload)):
        raise UserError(
            f"{FROM_RUN}: the folder ran model {m.model.name}, which is not a model config shipped with the toolkit, "
            "so its workload cannot be repeated from the folder alone",
            "Give the model on the command line as you gave it to stage1-run (e.g. model=hf model.name_or_path=...)",
        )
    advice = advise(m)
    levers, not_run = advised_levers(advice)
    if not levers:
        if advice:
            said = "it advises only code changes: " + "; ".join(a.lever for a in advice)
        else:
            said = "it advises nothing (no lever's bound is a notable share of the time per page)"
        raise UserError(
            f"{FROM_RUN}={raw}: the folder's advice has no lever to run: {said}",
            "Nothing here to measure: make the code changes it names, or try a preset's levers on that workload "
            f"(perf-whatif whatif=decode|vision|throughput {' '.join(own)})",
        )
    return AdvisedPlan(
        folder=stage1.path.resolve(),
        stage1=stage1,
        advice=advice,
        levers=levers,
        not_run=not_run,
        workload=(*own, *input_overrides(stage1)),
        goal=whatif_goal(advice),
    )

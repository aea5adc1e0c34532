"""The what-if's judging: one :class:`WhatIfAnalysis` over a run's rungs, their Stage 1 folders and its
:class:`WhatIfSettings`, one question per method (as `measure.stage1_analysis.Stage1Analysis`), handed over as one
`WhatIfRecord` by :meth:`WhatIfAnalysis.record`. `pipeline.whatif` builds one as its rungs end and
`pipeline.whatif_judge` one from a saved folder: the same methods judge both, so a live run and a re-judge cannot drift
apart. The figures are `measure.whatif` and `measure.whatif_objectives`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from llm_perf_opt.measure import advice
from llm_perf_opt.measure import whatif as figures
from llm_perf_opt.measure import whatif_objectives as objectives
from llm_perf_opt.measure.module_changes import held_by, module_changes
from llm_perf_opt.measure.noise import BEYOND
from llm_perf_opt.measure.outputs import near_tie_text
from llm_perf_opt.measure.stats import MIN_VALUES_FOR_CI
from llm_perf_opt.records.common import SCHEMA_VERSION, TimeBudget
from llm_perf_opt.records.folders import Stage1Folder
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    INTERRUPTED,
    LADDER,
    LATENCY,
    MEASURED,
    PENDING,
    AdvisedFrom,
    BaselineSettings,
    Judgement,
    LatencyTarget,
    Lever,
    Objective,
    OutputAgreement,
    PredictionCheck,
    Rung,
    RungFigures,
    Verdict,
    WhatIfRecord,
)

STOPPED_FIRST = "not run: the what-if run was stopped first"  # a rung the run's stop kept from starting
# What a rung's judging sets; a ladder rung that reuses an earlier rung (not run again) carries that rung's.
JUDGED_FIELDS = (
    "figures", "speedup", "outputs", "attribution", "judgements", "tradeoffs", "modules", "no_change", "held",
)  # fmt: skip


@attrs.frozen
class WhatIfSettings:
    """What the judging reads of a run's settings (parsed from its config by the pipeline)."""

    objective: str = figures.DEFAULT_OBJECTIVE  # whatif.objective: a goal or a figure
    decode_tokens: int | None = None  # the workload's decode length; None: the baseline's measured one
    decode_tokens_source: str | None = None
    memory_budget_gib: float | None = None  # whatif.memory_budget_gib
    latency_target: LatencyTarget | None = None  # whatif.latency_target
    near_tie_tolerance: float | None = None  # whatif_run.near_tie_tolerance
    ladder: bool = True  # whatif_run.ladder
    ladder_latency_only: bool = True
    ladder_identical_outputs: bool = True
    ladder_max_logit_diff: float | None = None


@attrs.frozen
class WhatIfJob:
    """What a what-if run was besides its judging, written into its record as given."""

    run_id: str
    created: str
    preset: str
    model: str  # the config's model name (the record names the baseline's where it ran)
    workload_overrides: tuple[str, ...] = ()
    launcher: str | None = None
    launcher_overrides: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # how the run ended, after the judging's notes
    time_budget: TimeBudget | None = None
    advised_from: AdvisedFrom | None = None  # whatif=advised: the run whose advice named the levers


class WhatIfAnalysis:
    """The questions the what-if asks of its rungs' records."""

    def __init__(
        self,
        settings: WhatIfSettings,
        levers: Sequence[Lever],
        rungs: Iterable[Rung],
        folders: Mapping[str, Stage1Folder],
        kept_outputs: Mapping[str, OutputAgreement | None] | None = None,
    ) -> None:
        self.settings = settings
        self.levers = tuple(levers)
        self.given = {rung.name: rung for rung in rungs}  # as they ran; their judged fields are worked out again
        self.folders = dict(folders)  # each measured rung's Stage 1 folder, by rung name
        # rungs whose outputs against the baseline are taken as given, not compared again (by rung name: a folder
        # that no longer holds the logits and top-two passes the comparison read, such as a shipped example)
        self.kept_outputs = dict(kept_outputs or {})
        self.base_name = next((r.name for r in self.given.values() if r.phase == BASELINE), BASELINE)
        self._judged: dict[str, Rung] | None = None

    # ---- the workload ------------------------------------------------------------------------------
    def decode_tokens(self) -> tuple[int | None, str | None]:
        """The decode length whole-page latency is judged at and its source: the workload's, else the baseline's."""
        base = self.folders.get(self.base_name)
        if self.settings.decode_tokens is not None or base is None:
            return self.settings.decode_tokens, self.settings.decode_tokens_source
        return base.metrics.settings.max_new_tokens, "measured"

    def goal(self) -> Objective:
        """The objective the levers are ranked by and the headline verdict names."""
        return figures.objective(self.settings.objective, self.decode_tokens()[0])

    def folder_figures(self, folder: Stage1Folder) -> RungFigures:
        """What one rung's folder measured, per page and per step (ValueError: no timed pass has the goal)."""
        return figures.rung_figures(folder, self.goal(), self.decode_tokens()[0])

    # ---- each rung ---------------------------------------------------------------------------------
    def baseline(self) -> Rung | None:
        """The baseline with its figures, its flag (peak memory over the budget) and what holds it by module."""
        base = self.given.get(self.base_name)
        folder = self.folders.get(self.base_name)
        if base is None or folder is None or base.state != MEASURED:
            return base
        measured = self.folder_figures(folder)
        peak = None if measured.peak_memory_bytes is None else measured.peak_memory_bytes / objectives.GIB
        tradeoffs = objectives.tradeoffs((), self.settings.memory_budget_gib, peak)
        return attrs.evolve(base, figures=measured, tradeoffs=tradeoffs, held=held_by(folder.metrics.modules))

    def attributed_against(self, rung: Rung) -> str:
        """The rung whose decode step a rung's change is attributed against: the baseline, or for a combined
        (ladder) rung the measured ladder rung with one lever fewer (for the second, the best lever alone)."""
        if rung.phase != LADDER or len(rung.levers) <= 1:
            return self.base_name
        below = next((r for r in self.given.values() if r.phase == LADDER and r.levers == rung.levers[:-1]), None)
        if below is None or below.state != MEASURED:
            return self.base_name
        return below.reused or below.name

    def judge(self, rung: Rung) -> Rung:
        """A measured rung judged against the baseline: every field of `JUDGED_FIELDS`."""
        base = self.folders.get(self.base_name)
        folder = self.folders.get(rung.name)
        if base is None or folder is None or rung.state != MEASURED or rung.phase == BASELINE:
            return rung
        goal, tokens, budget = self.goal(), self.decode_tokens()[0], self.settings.memory_budget_gib
        own = self.folder_figures(folder)
        against = self.attributed_against(rung)
        reference = self.folders.get(against)
        ref = self.folder_figures(reference) if reference is not None else self.given[against].figures
        if rung.name in self.kept_outputs:
            outputs = self.kept_outputs[rung.name]
        else:
            outputs = figures.outputs_against(base, folder, self.settings.near_tie_tolerance)
        judgements = objectives.judge(base.metrics, folder.metrics, outputs, tokens)
        before, after = base.metrics.modules, folder.metrics.modules
        return attrs.evolve(
            rung,
            figures=own,
            speedup=figures.speedup(
                goal,
                figures.pass_values(base.metrics, goal.name, tokens),
                figures.pass_values(folder.metrics, goal.name, tokens),
            ),
            outputs=outputs,
            attribution=None if ref is None else figures.attribute(own, against, ref),
            judgements=judgements,
            tradeoffs=objectives.tradeoffs(judgements, budget),
            modules=module_changes(before, after) if before is not None and after is not None else (),
            no_change=figures.no_effective_change(rung.overrides, base.metrics, folder.metrics),
            held=held_by(after),
        )

    def rungs(self) -> dict[str, Rung]:
        """Every rung judged (a ladder rung that reuses an earlier one carries that one's verdicts), outputs judged
        only up to where the baseline's own outputs stop repeating (`repeats_until`)."""
        if self._judged is None:
            out = {
                name: (self.baseline() or rung) if name == self.base_name else self.judge(rung)
                for name, rung in self.given.items()
            }
            for name, rung in out.items():
                if rung.reused is not None and rung.reused in out:
                    source = out[rung.reused]
                    out[name] = attrs.evolve(rung, **{field: getattr(source, field) for field in JUDGED_FIELDS})
            self._judged = _with_repeat_floor(out, self.settings.memory_budget_gib)
        return dict(self._judged)

    # ---- across the rungs --------------------------------------------------------------------------
    def host_drift(self) -> figures.HostDrift | None:
        """The largest drift of the host's pace between processes that a rung which changed nothing measured."""
        return figures.host_drift(self.rungs().values())

    def departure(self, name: str) -> str | None:
        """Why a measured lever's outputs keep it off the ladder (whatif_run.ladder_identical_outputs), or None."""
        if not self.settings.ladder_identical_outputs:
            return None
        rungs = self.rungs()
        found = repeats_until(r for r in rungs.values() if r.phase != LADDER)
        until = None if found is None else found[1]
        return figures.outputs_departure(rungs[name].outputs, self.settings.ladder_max_logit_diff, until)

    def ladder_plan(self) -> figures.LadderPlan | None:
        """The cumulative ladder, from the levers alone: those that helped the objective, best first, then those
        that shortened one of its parts (`measure.whatif.OBJECTIVE_PARTS`); none that changed nothing, whose outputs
        depart, or whose gain the host's measured drift explains (`left_out`, with the reason). None where no ladder
        is built: whatif_run.ladder=false, no measured baseline, or a lever alone not yet run."""
        rungs = {name: r for name, r in self.rungs().items() if r.phase != LADDER}  # as the ladder was planned
        base = rungs.get(self.base_name)
        alone = [r for r in rungs.values() if r.phase == ALONE]
        running = any(r.state in (PENDING, INTERRUPTED) or r.reason == STOPPED_FIRST for r in alone)
        if not self.settings.ladder or base is None or base.state != MEASURED or running:
            return None
        latency_only = self.settings.ladder_latency_only
        candidates = [
            lever
            for lever in self.levers
            if (r := rungs.get(lever.name)) is not None
            and r.state == MEASURED
            and (lever.changes == LATENCY or not latency_only)
        ]
        unchanged = {lever.name: why for lever in candidates if (why := rungs[lever.name].no_change) is not None}
        departed = {
            lever.name: why
            for lever in candidates
            if lever.name not in unchanged and (why := self.departure(lever.name)) is not None
        }
        candidates = [lever for lever in candidates if lever.name not in unchanged | departed]
        gains = {lever.name: rungs[lever.name].speedup for lever in candidates}
        ranked = figures.rank(candidates, gains)
        by_parts = figures.rank_by_parts(
            [lever for lever in candidates if lever not in ranked],
            self.goal().name,
            gains,
            {lever.name: rungs[lever.name].judgements for lever in candidates},
        )
        drift = figures.host_drift(rungs.values())  # a gain no larger than the host's own drift is not stacked
        stacked_for: list[tuple[Lever, tuple[Judgement, ...]]] = [*((lever, ()) for lever in ranked), *by_parts]
        drifted = {
            lever.name: why
            for lever, parts in stacked_for
            if (why := objectives.within_drift(gains[lever.name], parts, drift)) is not None
        }
        by_parts = [(lever, parts) for lever, parts in by_parts if lever.name not in drifted]
        plan = figures.plan_ladder(
            [*(lever for lever in ranked if lever.name not in drifted), *(lever for lever, _ in by_parts)]
        )
        return attrs.evolve(
            plan,
            left_out=(*unchanged.items(), *departed.items(), *drifted.items(), *plan.left_out),
            stacked_by_parts=tuple(
                (lever.name, objectives.changes_text(parts))
                for lever, parts in by_parts
                if lever.name not in dict(plan.left_out)
            ),
        )

    def best(self) -> str | None:
        """The fastest rung that beat the baseline and may be named (`measure.whatif.comparable`)."""
        scored = [r for r in self.rungs().values() if figures.comparable(r) and figures.helped(r.speedup)]
        return max(scored, key=lambda r: r.speedup.value if r.speedup else 0.0).name if scored else None

    def verdicts(self) -> tuple[Verdict, ...]:
        """Each lever's outcome alone, in one line."""
        rungs = self.rungs()
        base = rungs.get(self.base_name)
        base_passes = None if base is None or base.figures is None else base.figures.objective.n
        return tuple(
            Verdict(
                lever=lever.name,
                helped=figures.helped(rung.speedup) and rung.no_change is None,  # a no-op's gain is noise
                line=verdict_line(rung, base_passes),
                judged=rung.state == MEASURED and figures.judged(rung.speedup),
            )
            for lever in self.levers
            if (rung := rungs.get(lever.name)) is not None
        )

    def notes(self) -> tuple[str, ...]:
        """What the reader should know: levers the ladder left out or stacked for their parts, too few passes,
        unlike warm-ups, the host's drift, outputs that do not repeat, workload-changing levers."""
        plan = self.ladder_plan()
        notes = [] if plan is None else [f"{name} is not stacked on the ladder: {why}." for name, why in plan.left_out]
        notes += [
            f"{name} is stacked on the ladder after the levers that helped: its {self.goal().label} moved only within "
            f"noise, but its {parts} beyond noise, with no part worse."
            for name, parts in (() if plan is None else plan.stacked_by_parts)
        ]
        rungs = list(self.rungs().values())
        notes += _pass_notes(rungs)
        notes += [
            f"{d.rung} ran as the baseline did, yet measured {d.speedup:.2f}× the baseline ({BEYOND}): the host's pace "
            "drifted between the two rungs' processes by that much, so a lever's gain or loss of that size is not to "
            "be trusted from this run alone, and the ladder stacks only levers whose gain goes beyond it; run it "
            "again, or pin the host (run.cpu_affinity)."
            for d in figures.host_drifts(rungs)
        ]
        notes += unrepeatable_outputs(rungs)
        workload = [r.name for r in rungs if r.phase == ALONE and r.changes_workload]
        if self.settings.ladder_latency_only and workload:
            notes.append(
                f"{', '.join(workload)} change(s) the workload (what is computed, not only how fast): measured "
                "alone, never stacked on the ladder (whatif_run.ladder_latency_only=true)."
            )
        return tuple(notes)

    def predictions(self, advised: AdvisedFrom | None = None) -> tuple[PredictionCheck, ...]:
        """whatif=advised: each advised lever's predicted saving per page against its rung's measured one, then the
        advice that became no lever (`advised.not_run`: code changes, levers past the most a run takes)."""
        rungs = self.rungs()
        base = self.folders.get(self.base_name)
        base_metrics = None if base is None else base.metrics
        checks = []
        for lever in self.levers:
            if lever.advice is None:
                continue
            rung = rungs.get(lever.name)
            folder = self.folders.get(lever.name)
            measured = rung is not None and rung.state == MEASURED and folder is not None and base is not None
            why = None if measured else _why_not_measured(rung, base_metrics is not None)
            rung_metrics = folder.metrics if measured and folder is not None else None
            checks.append(advice.prediction_check(lever.name, lever.advice, base_metrics, rung_metrics, why))
        if advised is None:
            return tuple(checks)
        for left in advised.not_run:
            why = (
                "not runnable: a code change"
                if left.code_change
                else f"not run: past the {advised.max_levers} advised levers a run takes"
            )
            checks.append(advice.prediction_check(left.lever, left, base_metrics, None, why))
        return tuple(checks)

    def record(self, job: WhatIfJob) -> WhatIfRecord:
        """`whatif.json`: the run as `job` describes it, judged."""
        base = self.folders.get(self.base_name)
        metrics = None if base is None else base.metrics
        ran = BaselineSettings()
        if metrics is not None:
            s = metrics.settings
            ran = BaselineSettings(s.repeats, s.warmup, s.max_new_tokens, inputs=len(metrics.images))
        model = job.model if metrics is None else metrics.model.name
        tokens, source = self.decode_tokens()
        rungs = tuple(self.rungs().values())
        return WhatIfRecord(
            **(attrs.asdict(job, recurse=False) | {"model": model, "notes": (*self.notes(), *job.notes)}),
            schema_version=SCHEMA_VERSION,
            stage="whatif",
            objective=self.goal(),
            weights=None if metrics is None else metrics.model.weights,
            device=None if metrics is None else metrics.device.name,
            device_type=None if metrics is None else metrics.device.type,
            levers=self.levers,
            rungs=rungs,
            best=self.best(),
            verdicts=self.verdicts(),
            settings=ran,
            decode_tokens=tokens,
            decode_tokens_source=source,
            memory_budget_gib=self.settings.memory_budget_gib,
            near_tie_tolerance=self.settings.near_tie_tolerance,
            best_per_goal=objectives.best_per_goal(rungs, tokens),  # whole-page latency, first token, pages/s, memory
            frontier=objectives.frontier(rungs),  # the rungs no other rung beats on every goal
            latency_target=self.settings.latency_target,
            goodput=objectives.goodput(rungs, self.settings.latency_target),
            predictions=self.predictions(job.advised_from),
            ladder=self.settings.ladder,
        )


def _why_not_measured(rung: Rung | None, baseline: bool) -> str:
    """Why an advised lever has no measured saving: its rung's state and reason, or no baseline to measure against."""
    if not baseline:
        return "not measured: the baseline was not measured"
    if rung is None:
        return "not run"
    return f"{rung.state}: {rung.reason}" if rung.reason else rung.state


def repeats_until(rungs: Iterable[Rung]) -> tuple[str, int] | None:
    """The earliest generated token where a rung that ran as the baseline did (`Rung.no_change`) departs from the
    baseline's outputs, and that rung: from there on the baseline's own outputs do not repeat from run to run (near-
    tied logits, as random weights give). None when no such rung departed."""
    departed = [
        (r.name, r.outputs.first_departure)
        for r in rungs
        if r.no_change is not None and r.outputs is not None and r.outputs.first_departure is not None
    ]
    return min(departed, key=lambda pair: pair[1] or 0) if departed else None


def _with_repeat_floor(rungs: Mapping[str, Rung], budget_gib: float | None) -> dict[str, Rung]:
    """The rungs with their outputs judged only up to where the baseline's own outputs stop repeating, and their
    trade-offs flagged again; as they are where they do repeat."""
    found = repeats_until(rungs.values())
    if found is None:
        return dict(rungs)
    out = {}
    for name, rung in rungs.items():
        if rung.phase == BASELINE or not rung.judgements:
            out[name] = rung
            continue
        judgements = tuple(
            objectives.judge_outputs(rung.outputs, found[1]) if j.objective == objectives.OUTPUTS.name else j
            for j in rung.judgements
        )
        out[name] = attrs.evolve(rung, judgements=judgements, tradeoffs=objectives.tradeoffs(judgements, budget_gib))
    return out


def unrepeatable_outputs(rungs: Sequence[Rung]) -> list[str]:
    """The note for a rung that ran as the baseline did, yet generated other tokens: the baseline's own outputs do
    not repeat from run to run, so a departure at or after that token says nothing about a lever."""
    found = repeats_until(rungs)
    if found is None:
        return []
    name, token = found
    outputs = next(r.outputs for r in rungs if r.name == name)
    tie = outputs.near_tie if outputs is not None else None
    why = "near-tied logits, as random weights give" if tie is None else near_tie_text(tie)
    return [
        f"{name} ran as the baseline did, yet its outputs depart at generated token {token}: the baseline's own "
        f"outputs do not repeat from run to run ({why}), so an output departure at or after token {token} says "
        "nothing about a lever, and the ladder compares the tokens before it (whatif_run.ladder_identical_outputs)."
    ]


def _pass_notes(rungs: Sequence[Rung]) -> list[str]:
    """Why levers were left unjudged (too few passes), and warm-up passes that differ between the rungs."""
    measured = [r for r in rungs if r.state == MEASURED and r.figures is not None]
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


def verdict_line(rung: Rung, base_passes: int | None) -> str:
    """A lever's outcome in one line, with its flags: no effective change ("…; no change: the baseline already ran
    …") and trade-offs ("…; trade-off: decode −91%, but time to first token +130%")."""
    if rung.state != MEASURED:
        return f"{rung.name}: {rung.state} — {rung.reason}"
    s = rung.speedup
    if s is None:
        return f"{rung.name}: no comparable figure"
    if figures.judged(s):
        parts = [f"{rung.name}: {s.value:.2f}× ({s.verdict})"]
    else:
        own = None if rung.figures is None else rung.figures.objective.n
        base, mine = ("?" if n is None else str(n) for n in (base_passes, own))
        counts = "on single passes" if (base_passes, own) == (1, 1) else f"on {base} vs {mine} timed passes"
        needs = f"an interval needs ≥ {MIN_VALUES_FOR_CI} passes per side"
        parts = [f"{rung.name}: {s.value:.2f}× {counts}, not judged ({needs})"]
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
    line = ", ".join(parts)
    if rung.no_change:
        line += f"; no change: {rung.no_change}"
    if rung.tradeoffs:
        line += f"; trade-off: {'; '.join(rung.tradeoffs)}"
    return line

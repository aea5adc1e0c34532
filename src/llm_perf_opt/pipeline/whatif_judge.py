"""Every objective of a what-if run's rungs judged against the baseline (`measure.whatif_objectives`), their
trade-offs flagged, the best rung per goal and the trade-off frontier, for a run as it ends or for a what-if folder
written before (`rejudge`: from its rung folders; `python -m llm_perf_opt.pipeline.whatif_judge <folder>`)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure import whatif_objectives as objectives
from llm_perf_opt.measure.module_changes import held_by, module_changes
from llm_perf_opt.measure.noise import BEYOND
from llm_perf_opt.measure.outputs import near_tie_text
from llm_perf_opt.measure.whatif import attribute, host_drifts, no_effective_change
from llm_perf_opt.measure.whatif_goodput import goodput
from llm_perf_opt.records.folders import Stage1Folder, load_stage1, load_whatif
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.records.whatif import BASELINE, MEASURED, TTFT_P90, TTLT_P90, LatencyTarget, Rung, WhatIfRecord

log = logging.getLogger("llm_perf_opt.whatif")

WHATIF_FILE = "whatif.json"
TRADE_OFF = "; trade-off: "
NO_CHANGE = "; no change: "


def workload_decode_tokens(cfg: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The decode length a named workload states (`workload=ocr1-a4-page`: its `analytic.new_tokens`, 256) and
    where it comes from; (None, None) without a named workload (each rung's measured length is used)."""
    profile = cfg.get("workload_profile")
    analytic = cfg.get("analytic") or {}
    tokens = analytic.get("new_tokens") if profile else None
    if not profile or tokens is None:
        return None, None
    return int(tokens), f"workload {profile.get('name')} (analytic.new_tokens)"


def _optional_number(raw: Any, within: Callable[[float], bool], problem: str, fix: str) -> float | None:
    """`raw` as a float where it is a finite number `within` accepts, None where it is null; anything else (a
    boolean, text, a number out of range) is one paragraph: `problem`, then `fix`."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not math.isfinite(value) or not within(value):
        raise UserError(problem, fix)
    return value


def memory_budget(raw: Any) -> float | None:
    """`whatif.memory_budget_gib`: a positive number of GiB, or None for no budget."""
    return _optional_number(
        raw,
        lambda gib: gib > 0,
        f"whatif.memory_budget_gib={raw} is not a positive number of GiB",
        "Set e.g. whatif.memory_budget_gib=40, or null for no budget",
    )


def near_tie_tolerance(raw: Any) -> float | None:
    """`whatif_run.near_tie_tolerance`: the largest gap between the baseline's top two logits, as a fraction of the
    top one, at which a rung's other token still counts as the same output (a number in [0, 1)), or None for none."""
    return _optional_number(
        raw,
        lambda fraction: 0 <= fraction < 1,
        f"whatif_run.near_tie_tolerance={raw} is not a fraction of the top logit in [0, 1)",
        "Set e.g. whatif_run.near_tie_tolerance=0.01 (a departure between the baseline's top two tokens counts "
        "as the same output when their logits are within 1% of the top one), or null to count every departure",
    )


TARGET_KEYS = {TTLT_P90: "ttlt_p90_ms", TTFT_P90: "ttft_p90_ms"}  # LatencyTarget's field of each figure
TARGET_FIX = (
    "Set the per-page p90 latency a configuration must meet, in ms, e.g. whatif.latency_target.ttlt_p90_ms=5000 "
    "(time to last token) and/or whatif.latency_target.ttft_p90_ms=800 (time to first token); null for none"
)


def latency_target(raw: Any) -> LatencyTarget | None:
    """`whatif.latency_target`: {ttlt_p90_ms, ttft_p90_ms}, each a positive number of ms or null; None when neither
    is set (no goodput, the frontier only)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise UserError(f"whatif.latency_target={raw} is not a mapping of per-page latencies", TARGET_FIX)
    unknown = sorted(str(k) for k in raw if k not in TARGET_KEYS.values())
    if unknown:
        raise UserError(
            f"whatif.latency_target has {', '.join(unknown)}, which is not one of its latencies "
            f"({', '.join(TARGET_KEYS.values())})",
            TARGET_FIX,
        )
    limits = {
        key: _optional_number(
            raw.get(key),
            lambda ms: ms > 0,
            f"whatif.latency_target.{key}={raw.get(key)} is not a positive number of ms",
            TARGET_FIX,
        )
        for key in TARGET_KEYS.values()
    }
    target = LatencyTarget(**limits)
    return target if target.limits else None


def judged_rung(
    rung: Rung, base: Stage1Folder, folder: Stage1Folder, decode_tokens: int | None, budget_gib: float | None
) -> Rung:
    """`rung` with every objective judged against the baseline's folder and its trade-offs flagged."""
    judgements = objectives.judge(base.metrics, folder.metrics, rung.outputs, decode_tokens)
    before, after = base.metrics.modules, folder.metrics.modules
    moved = module_changes(before, after) if before is not None and after is not None else ()
    tradeoffs = objectives.tradeoffs(judgements, budget_gib)
    same = no_effective_change(rung.overrides, base.metrics, folder.metrics)
    return attrs.evolve(
        rung, judgements=judgements, tradeoffs=tradeoffs, modules=moved, no_change=same, held=held_by(after)
    )


def judged_baseline(rung: Rung, budget_gib: float | None, folder: Stage1Folder | None = None) -> Rung:
    """The baseline's own flag (its peak memory over the budget) and what holds it by module (from its folder)."""
    figures = rung.figures
    peak = None if figures is None or figures.peak_memory_bytes is None else figures.peak_memory_bytes / objectives.GIB
    held = held_by(folder.metrics.modules) if folder is not None else rung.held
    return attrs.evolve(rung, tradeoffs=objectives.tradeoffs((), budget_gib, peak), held=held)


def with_flags(line: str, rung: Rung) -> str:
    """A lever's verdict line with its flags: no effective change ("…; no change: the baseline already ran …") and
    trade-offs ("…; trade-off: decode −91%, but time to first token +130%")."""
    if rung.no_change and NO_CHANGE not in line:
        line = f"{line}{NO_CHANGE}{rung.no_change}"
    if rung.tradeoffs and TRADE_OFF not in line:
        line = f"{line}{TRADE_OFF}{'; '.join(rung.tradeoffs)}"
    return line


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


def with_repeat_floor(rungs: Mapping[str, Rung], budget_gib: float | None) -> dict[str, Rung]:
    """The rungs with their outputs judged only up to where the baseline's own outputs stop repeating (shown by a
    rung that changed nothing, `repeats_until`), and their trade-offs flagged again; as they are without one."""
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


def host_drift(rungs: Iterable[Rung]) -> list[str]:
    """The note for a rung that ran as the baseline did, yet measured faster or slower beyond noise: the host's pace
    drifted between the two processes by that much, which no interval over one process's passes can see."""
    return [
        f"{d.rung} ran as the baseline did, yet measured {d.speedup:.2f}× the baseline ({BEYOND}): the host's pace "
        "drifted between the two rungs' processes by that much, so a lever's gain or loss of that size is not to be "
        "trusted from this run alone, and the ladder stacks only levers whose gain goes beyond it; run it again, or "
        "pin the host (run.cpu_affinity)."
        for d in host_drifts(rungs)
    ]


def unrepeatable_outputs(rungs: Iterable[Rung]) -> list[str]:
    """The note for a rung that ran as the baseline did, yet generated other tokens: the baseline's own outputs do
    not repeat from run to run, so a departure at or after that token says nothing about a lever."""
    rungs = list(rungs)
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


def with_goals(record: WhatIfRecord) -> WhatIfRecord:
    """The record with the best rung per goal, the trade-off frontier and the goodput against its latency target."""
    return attrs.evolve(
        record,
        best_per_goal=objectives.best_per_goal(record.rungs, record.decode_tokens),
        frontier=objectives.frontier(record.rungs),
        goodput=goodput(record.rungs, record.latency_target),
    )


def rejudge(
    run_dir: Path,
    decode_tokens: int | None = None,
    source: str | None = None,
    budget_gib: float | None = None,
    target: LatencyTarget | None = None,
) -> WhatIfRecord:
    """Judge every objective of a what-if folder's rungs from their folders (a record written before per-objective
    verdicts), at `decode_tokens` (None: the baseline's measured length), with the goodput against `target` (None:
    the record's own), and rewrite `whatif.json`, `whatif.md` and the plots."""
    from llm_perf_opt.report import whatif_report

    record = load_whatif(run_dir)
    base_rung = record.baseline
    if base_rung is None or base_rung.state != MEASURED or base_rung.folder is None:
        raise UserError(f"{run_dir}: the baseline was not measured, so no rung can be judged", "Run perf-whatif again")
    base = load_stage1(run_dir / base_rung.folder)
    if decode_tokens is None:
        decode_tokens, source = base.metrics.settings.max_new_tokens, "measured"
    rungs = {}
    for rung in record.rungs:
        rungs[rung.name] = _rejudged(run_dir, rung, base, decode_tokens, budget_gib)
    rungs = with_attribution(rungs, record)
    for name, rung in rungs.items():  # a reused ladder rung carries the verdicts of the rung it reuses
        if rung.reused is not None and rung.reused in rungs:
            earlier = rungs[rung.reused]
            rungs[name] = attrs.evolve(
                rung,
                judgements=earlier.judgements,
                tradeoffs=earlier.tradeoffs,
                no_change=earlier.no_change,
                held=earlier.held,
                attribution=earlier.attribution,
            )
    rungs = with_repeat_floor(rungs, budget_gib)
    verdicts = tuple(
        attrs.evolve(v, line=with_flags(v.line, rungs[v.lever]), helped=v.helped and rungs[v.lever].no_change is None)
        if v.lever in rungs
        else v
        for v in record.verdicts
    )
    found = [*host_drift(rungs.values()), *unrepeatable_outputs(rungs.values())]
    notes = record.notes + tuple(n for n in found if n not in record.notes)
    record = with_goals(
        attrs.evolve(
            record,
            rungs=tuple(rungs.values()),
            verdicts=verdicts,
            notes=notes,
            decode_tokens=decode_tokens,
            decode_tokens_source=source,
            memory_budget_gib=budget_gib,
            latency_target=target or record.latency_target,
        )
    )
    art = ArtifactsManager(run_dir, stage="whatif")
    art.write_json(WHATIF_FILE, record)
    whatif_report.write_all(art, record)
    return record


def with_attribution(rungs: Mapping[str, Rung], record: WhatIfRecord) -> dict[str, Rung]:
    """Each measured rung's decode-step attribution worked out again against the rung it was attributed against (its
    cause line in today's words), from both rungs' figures; as it was where either has none (a reused ladder rung
    takes the one of the rung it reuses, as in a live run)."""
    out = dict(rungs)
    for name, rung in rungs.items():
        a = rung.attribution
        reference = None if a is None else rungs.get(a.against)
        if a is None or reference is None or rung.figures is None:
            continue
        ref_figures = record.figures_of(reference)
        if ref_figures is not None:
            out[name] = attrs.evolve(rung, attribution=attribute(name, rung.figures, a.against, ref_figures) or a)
    return out


def _rejudged(
    run_dir: Path, rung: Rung, base: Stage1Folder, decode_tokens: int | None, budget_gib: float | None
) -> Rung:
    if rung.phase == BASELINE:
        return judged_baseline(rung, budget_gib, base)
    if rung.state != MEASURED or rung.reused is not None or rung.folder is None:
        return rung
    try:
        folder = load_stage1(run_dir / rung.folder)
    except RecordError as exc:
        log.warning("rung %s not judged per objective: %s", rung.name, exc)
        return rung
    return judged_rung(rung, base, folder, decode_tokens, budget_gib)


def main(argv: list[str] | None = None) -> None:
    """Judge a what-if folder's rungs on every objective and rewrite its record and report."""
    parser = argparse.ArgumentParser(prog="python -m llm_perf_opt.pipeline.whatif_judge", description=main.__doc__)
    parser.add_argument("folder", type=Path, help="a perf-whatif folder (holding whatif.json and rungs/)")
    parser.add_argument(
        "--decode-tokens", type=int, default=None, help="decode length of a whole page (default: measured)"
    )
    parser.add_argument("--memory-budget-gib", type=float, default=None, help="flag peaks above this many GiB")
    for key, what in (("ttlt_p90_ms", "last"), ("ttft_p90_ms", "first")):
        flag = "--" + key.replace("_", "-")
        parser.add_argument(flag, type=float, default=None, help=f"goodput: p90 time to {what} token per page ≤ this")
    args = parser.parse_args(argv)
    source = None if args.decode_tokens is None else "--decode-tokens"
    try:
        target = latency_target({"ttlt_p90_ms": args.ttlt_p90_ms, "ttft_p90_ms": args.ttft_p90_ms})
        record = rejudge(args.folder, args.decode_tokens, source, memory_budget(args.memory_budget_gib), target)
    except (UserError, RecordError) as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    print(f"judged {sum(1 for r in record.rungs if r.judgements)} rung(s): {args.folder / 'whatif.md'}")


if __name__ == "__main__":
    main()

"""The what-if's judging settings, read from a config (`judging_settings`), and the judging of a what-if folder
written before (`rejudge`: from its rung folders; `python -m llm_perf_opt.pipeline.whatif_judge <folder>`) by the
`measure.whatif_analysis.WhatIfAnalysis` a live run judges with."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

import attrs
from omegaconf import OmegaConf

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import CommandConfig, command_config, whatif_nodes
from llm_perf_opt.config_schema import WhatIfNodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.whatif import DEFAULT_OBJECTIVE, GOAL_FIGURES, OBJECTIVES, objective
from llm_perf_opt.measure.whatif_analysis import WhatIfAnalysis, WhatIfJob, WhatIfSettings
from llm_perf_opt.records.folders import CONFIG_FILE, WHATIF_FILE, load_stage1, load_whatif
from llm_perf_opt.records.io import RecordError
from llm_perf_opt.records.whatif import MEASURED, TTFT_P90, TTLT_P90, LatencyTarget, WhatIfRecord

log = logging.getLogger("llm_perf_opt.whatif")

# The notes a run adds of how it ended, after the judging's (a folder judged again keeps them).
IN_PROGRESS = "The run was still going when this was written: later rungs are missing."
DID_NOT_FINISH = "The run did not finish: "
RUN_NOTES = (IN_PROGRESS, DID_NOT_FINISH)


def workload_decode_tokens(command: CommandConfig) -> tuple[int | None, str | None]:
    """The decode length a named workload states (`workload=ocr1-a4-page`: its `analytic.new_tokens`, 256) and
    where it comes from; (None, None) without a named workload (each rung's measured length is used)."""
    profile = command.workload_profile
    if profile is None:
        return None, None
    return command.analytic.new_tokens, f"workload {profile.name} (analytic.new_tokens)"


def _optional_number(raw: object, within: Callable[[float], bool], problem: str, fix: str) -> float | None:
    """`raw` as a float where it is a finite number `within` accepts, None where it is null; anything else (a
    boolean, text, a number out of range) is a UserError(`problem`, `fix`)."""
    if raw is None:
        return None
    try:
        value = float(raw) if isinstance(raw, int | float | str) else math.nan
    except ValueError:
        value = math.nan
    if isinstance(raw, bool) or not math.isfinite(value) or not within(value):
        raise UserError(problem, fix)
    return value


def memory_budget(raw: object) -> float | None:
    """`whatif.memory_budget_gib`: a positive number of GiB, or None for no budget."""
    return _optional_number(
        raw,
        lambda gib: gib > 0,
        f"whatif.memory_budget_gib={raw} is not a positive number of GiB",
        "Set e.g. whatif.memory_budget_gib=40, or null for no budget",
    )


def near_tie_tolerance(raw: object) -> float | None:
    """`whatif_run.near_tie_tolerance`: the largest gap between the baseline's top two logits, as a fraction of the
    top one, at which a rung's other token still counts as the same output (a number in [0, 1)), or None for none."""
    return _optional_number(
        raw,
        lambda fraction: 0 <= fraction < 1,
        f"whatif_run.near_tie_tolerance={raw} is not a fraction of the top logit in [0, 1)",
        "Set e.g. whatif_run.near_tie_tolerance=0.01 (a departure between the baseline's top two tokens counts "
        "as the same output when their logits are within 1% of the top one), or null to count every departure",
    )


TARGET_KEYS = (TTLT_P90, TTFT_P90)  # LatencyTarget's fields, each named by its figure
TARGET_FIX = (
    "Set the per-page p90 latency a configuration must meet, in ms, e.g. whatif.latency_target.ttlt_p90_ms=5000 "
    "(time to last token) and/or whatif.latency_target.ttft_p90_ms=800 (time to first token); null for none"
)


def latency_target(raw: object) -> LatencyTarget | None:
    """`whatif.latency_target`: {ttlt_p90_ms, ttft_p90_ms}, each a positive number of ms or null; None when neither
    is set (no goodput, the frontier only)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise UserError(f"whatif.latency_target={raw} is not a mapping of per-page latencies", TARGET_FIX)
    unknown = sorted(str(k) for k in raw if k not in TARGET_KEYS)
    if unknown:
        raise UserError(
            f"whatif.latency_target has {', '.join(unknown)}, which is not one of its latencies "
            f"({', '.join(TARGET_KEYS)})",
            TARGET_FIX,
        )
    limits = {
        key: _optional_number(
            raw.get(key),
            lambda ms: ms > 0,
            f"whatif.latency_target.{key}={raw.get(key)} is not a positive number of ms",
            TARGET_FIX,
        )
        for key in TARGET_KEYS
    }
    target = LatencyTarget(**limits)
    return target if target.limits else None


def judging_settings(command: CommandConfig, whatif: WhatIfNodes) -> WhatIfSettings:
    """What the what-if's judging reads of a command's settings and its own typed nodes (`whatif`), checked."""
    name = whatif.whatif.objective or DEFAULT_OBJECTIVE
    try:
        objective(name)
    except KeyError:
        raise UserError(
            f"whatif.objective={name} is not known: the headline verdict and the ladder rank the rungs by it",
            f"Use one of the goals {', '.join(GOAL_FIGURES)} (default {DEFAULT_OBJECTIVE}: whole-page latency at "
            f"the workload's decode length) or one of the figures {', '.join(OBJECTIVES)}",
        ) from None
    run, target = whatif.whatif_run, whatif.whatif.latency_target
    tokens, source = workload_decode_tokens(command)
    return WhatIfSettings(
        objective=name,
        decode_tokens=tokens,
        decode_tokens_source=source,
        memory_budget_gib=memory_budget(whatif.whatif.memory_budget_gib),
        latency_target=latency_target(None if target is None else asdict(target)),
        near_tie_tolerance=near_tie_tolerance(run.near_tie_tolerance),
        ladder=run.ladder,
        ladder_latency_only=run.ladder_latency_only,
        ladder_identical_outputs=run.ladder_identical_outputs,
        ladder_max_logit_diff=run.ladder_max_logit_diff,
    )


def rejudge(
    run_dir: Path,
    decode_tokens: int | None = None,
    source: str | None = None,
    budget_gib: float | None = None,
    target: LatencyTarget | None = None,
    keep_outputs: bool = False,
) -> WhatIfRecord:
    """Judge a what-if folder's rungs again from their folders, as the run judged them (`WhatIfAnalysis`), with the
    settings its record holds (the ladder's from the config.yaml it wrote as it started; without one, whether the
    ladder ran from the record and the shipped defaults for the rest) but those given here, and rewrite
    `whatif.json`, `whatif.md` and the plots. `keep_outputs`: each rung's outputs against the baseline as the record
    holds them, not compared again (for a folder whose rungs no longer keep their logits, such as a shipped
    example)."""
    from llm_perf_opt.report import whatif_report

    record = load_whatif(run_dir)
    base = record.baseline
    if base is None or base.state != MEASURED or base.folder is None:
        raise UserError(f"{run_dir}: the baseline was not measured, so no rung can be judged", "Run perf-whatif again")
    if decode_tokens is None and record.decode_tokens_source != "measured":  # else the baseline's, worked out again
        decode_tokens, source = record.decode_tokens, record.decode_tokens_source
    config = run_dir / CONFIG_FILE
    saved = OmegaConf.load(config) if config.is_file() else None  # the typed nodes rebuilt as the run built them
    settings = attrs.evolve(
        judging_settings(command_config(saved), whatif_nodes(saved)) if saved is not None else WhatIfSettings(),
        objective=record.objective.name,
        decode_tokens=decode_tokens,
        decode_tokens_source=source,
        memory_budget_gib=budget_gib or record.memory_budget_gib,
        latency_target=target or record.latency_target,
        near_tie_tolerance=record.near_tie_tolerance,
    )
    ladder_known = saved is not None or record.ladder is not None  # else the default is a guess, not recorded
    if saved is None and record.ladder is not None:
        settings = attrs.evolve(settings, ladder=record.ladder)
    folders = {base.name: load_stage1(run_dir / base.folder)}
    for rung in record.rungs:
        if rung.state == MEASURED and rung.reused is None and rung.folder is not None and rung.name not in folders:
            try:
                folders[rung.name] = load_stage1(run_dir / rung.folder)
            except RecordError as exc:
                log.warning("rung %s not judged again: %s", rung.name, exc)
    job = {field.name: getattr(record, field.name) for field in attrs.fields(WhatIfJob)}  # the run as it was
    notes = tuple(note for note in record.notes if note.startswith(RUN_NOTES))  # how it ended
    kept = {rung.name: rung.outputs for rung in record.rungs} if keep_outputs else None
    record = WhatIfAnalysis(settings, record.levers, record.rungs, folders, kept).record(
        WhatIfJob(**(job | {"notes": notes}))
    )
    if not ladder_known:
        record = attrs.evolve(record, ladder=None)
    art = ArtifactsManager(run_dir, stage="whatif")
    art.write_json(WHATIF_FILE, record)
    whatif_report.write_all(art, record)
    return record


def main(argv: list[str] | None = None) -> None:
    """Judge a what-if folder's rungs again, as the run did, and rewrite its record and report."""
    parser = argparse.ArgumentParser(prog="python -m llm_perf_opt.pipeline.whatif_judge", description=main.__doc__)
    parser.add_argument("folder", type=Path, help="a perf-whatif folder (holding whatif.json and rungs/)")
    parser.add_argument("--decode-tokens", type=int, help="decode length of a whole page (default: the run's)")
    parser.add_argument("--memory-budget-gib", type=float, help="flag peaks above this many GiB (default: the run's)")
    for key, what in ((TTLT_P90, "last"), (TTFT_P90, "first")):
        help_text = f"goodput: p90 time to {what} token per page ≤ this (default: the run's)"
        parser.add_argument("--" + key.replace("_", "-"), type=float, help=help_text)
    parser.add_argument(
        "--keep-outputs",
        action="store_true",
        help="keep each rung's outputs against the baseline as recorded, not compared again (rung folders that no "
        "longer hold their logits, such as the shipped examples)",
    )
    args = parser.parse_args(argv)
    source = None if args.decode_tokens is None else "--decode-tokens"
    try:
        target = latency_target({key: getattr(args, key) for key in TARGET_KEYS})
        budget = memory_budget(args.memory_budget_gib)
        record = rejudge(args.folder, args.decode_tokens, source, budget, target, keep_outputs=args.keep_outputs)
    except (UserError, RecordError) as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    print(f"judged {sum(1 for r in record.rungs if r.judgements)} rung(s): {args.folder / 'whatif.md'}")


if __name__ == "__main__":
    main()

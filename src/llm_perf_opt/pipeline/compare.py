"""Compare run folders of `stage1-run` and `stage2-profile` side by side, against the first one as baseline.

Folders are read as typed records (no GPU, no torch); those that cannot be compared (missing, unfinished, damaged,
another schema) are skipped with the reason, and runs are compared only with runs of the same stage. `--fail-on`
rules (`gate_rules`) are judged by `measure.gate`; two `perf-whatif` folders are compared rung by rung.

A gate passes only when every rule was judged on two usable, distinct folders: a folder it was to judge that did not
complete, is missing or damaged, or is the same run as another (the same folder, or a copy: the same run id and
start time) makes it *unusable* (exit 4); with no pair left at all, `UnusableFolders` says why (exit 4, nothing
written). Without rules such folders are skipped (exit 2 when fewer than two are left).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.comparison import Run, build_comparison, union
from llm_perf_opt.measure.gate import figures_for, gate, workload_differences
from llm_perf_opt.pipeline.gate_rules import resolve
from llm_perf_opt.records import io
from llm_perf_opt.records.common import COMPLETE, SCHEMA_VERSION, RunStatus
from llm_perf_opt.records.comparison import (
    GATE_EXIT_CODES,
    GATE_UNUSABLE,
    KINDS,
    WHATIF_COMPARE,
    Comparison,
    Gate,
    GateRule,
    RungPair,
    Skipped,
    WhatIfComparison,
    combined_result,
)
from llm_perf_opt.records.folders import (
    METRICS_FILE,
    STATUS_FILE,
    WHATIF_FILE,
    Stage1Folder,
    enclosing_run_folder,
    load,
    load_whatif,
    read_status,
    skip_reason,
    status_detail,
)
from llm_perf_opt.records.io import RecordError, save
from llm_perf_opt.records.whatif import MEASURED, WhatIfRecord
from llm_perf_opt.report.comparison import comparison_markdown, whatif_comparison_markdown


class UnusableFolders(UserError):
    """With --fail-on: no two usable, distinct folders to judge (failed, interrupted, missing, or the same run)."""

    exit_code = GATE_EXIT_CODES[GATE_UNUSABLE]


NOT_FINISHED = "no metrics.json (not a finished stage1-run or stage2-profile folder)"


def _not_complete(status: RunStatus) -> str:
    """`marked <state>, not complete`, with what the status says of why."""
    detail = status_detail(status)
    return f"marked {status.state or 'with no state'}, not complete" + (f": {detail}" if detail else "")


def _no_pair(problem: str, fix: str, options: GateOptions | None) -> UserError:
    """The error for folders that leave nothing to compare: exit 4 (the gate is unusable) with rules, else 2."""
    return UnusableFolders(problem, fix) if options is not None and options.rules else UserError(problem, fix)


def load_run(path: Path) -> Run | Skipped:
    """The completed run in `path` as typed records, or why it cannot be compared."""
    path = Path(path)
    if not path.exists():
        return Skipped(path, "the folder does not exist")
    if not path.is_dir():
        return Skipped(path, "not a folder")
    has_metrics = (path / METRICS_FILE).is_file()
    if not (path / STATUS_FILE).is_file():
        return Skipped(path, "no run_status.json, so the run is not marked complete" if has_metrics else NOT_FINISHED)
    try:
        status = read_status(path)
        if status.state != COMPLETE:  # before metrics.json: a run killed hard wrote none, its status says why
            return Skipped(path, f"the run is {_not_complete(status)}")
        if not has_metrics:
            return Skipped(path, NOT_FINISHED)
        folder = load(path)
    except RecordError as exc:
        return Skipped(path, skip_reason(exc, path))
    if folder.kind not in KINDS:
        return Skipped(path, f"metrics.json is for stage {folder.kind!r}, not stage1 or stage2")
    return Run(path, path.resolve().name or str(path), folder)


def same_run(a: Run, b: Run) -> str | None:
    """How `b` is the same run as `a` (the same folder, or a copy: the same run id and start time), else None."""
    if a.path.resolve() == b.path.resolve():
        return f"the same folder as {a.path}"
    ma, mb = a.folder.metrics, b.folder.metrics
    if (ma.run_id, ma.created) == (mb.run_id, mb.created):
        return f"the same run as {a.path} (run id {ma.run_id}, created {ma.created}): a copy compares with itself"
    return None


def load_runs(paths: Sequence[Path]) -> tuple[list[Run], list[Skipped]]:
    """Usable runs (labels made unique) and skipped folders (a run given twice is skipped the second time)."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    for path in paths:
        loaded = load_run(Path(path))
        twice = None if isinstance(loaded, Skipped) else next(filter(None, (same_run(r, loaded) for r in runs)), None)
        if twice is not None:
            loaded = Skipped(Path(path), twice)
        if isinstance(loaded, Skipped):
            skipped.append(loaded)
            continue
        taken = {r.label for r in runs}
        label, n = loaded.label, 2
        while label in taken:
            label, n = f"{loaded.label}#{n}", n + 1
        runs.append(attrs.evolve(loaded, label=label))
    return runs, skipped


@attrs.frozen
class GateOptions:
    """What `--fail-on`, `--fail-on-unjudged` and `--allow-different` asked for."""

    rules: tuple[GateRule, ...] = ()
    fail_on_unjudged: bool = False
    allow_different: bool = False


def _comparable(runs: Sequence[Run]) -> bool:
    return any(sum(r.kind == kind for r in runs) >= 2 for kind in KINDS)


def judge(runs: Sequence[Run], skipped: Sequence[Skipped], options: GateOptions) -> Gate:
    """The rules judged on every kind with two runs or more (each against its own baseline), unusable when a folder
    was `skipped`; UserError for an unknown figure, or for runs of different workloads or devices unless
    `allow_different`."""
    stages = union([s.stage for s in r.folder.metrics.stages] for r in runs if isinstance(r.folder, Stage1Folder))
    figures = figures_for(stages)
    rules = resolve(options.rules, figures)
    groups = [[(r.label, r.folder) for r in runs if r.kind == kind] for kind in KINDS]
    gates = []
    for group in (g for g in groups if len(g) >= 2):
        differences = workload_differences(group)
        if differences and not options.allow_different:
            raise UserError(
                "--fail-on judges runs of one workload on one device, and these differ in " + "; ".join(differences),
                "Compare runs of the same workload and device, or pass --allow-different to judge them anyway "
                "(the gate then lists the differences)",
            )
        gates.append(gate(rules, figures, group, fail_on_unjudged=options.fail_on_unjudged, differences=differences))
    problems = tuple(f"{s.path}: {s.reason}" for s in skipped)
    return Gate(
        rules=rules,
        checks=tuple(c for g in gates for c in g.checks),
        fail_on_unjudged=options.fail_on_unjudged,
        result=combined_result([*(g.result for g in gates), *([GATE_UNUSABLE] if problems else [])]),
        differences=tuple(d for g in gates for d in g.differences),
        problems=problems,
        hint="; ".join(dict.fromkeys(g.hint for g in gates if g.hint)) or None,
        host_differences=tuple(d for g in gates for d in g.host_differences),
    )


def compared(runs: Sequence[Run], skipped: Sequence[Skipped], options: GateOptions | None = None) -> Comparison:
    """The comparison of usable `runs`, with the gate when `options` give rules."""
    result = build_comparison(runs, skipped)
    if options is not None and options.rules:
        result = attrs.evolve(result, gate=judge(runs, skipped, options))
    return result


def compare(paths: Sequence[Path], options: GateOptions | None = None) -> Comparison:
    """The comparison of the run folders in `paths` (the first usable one of each kind is the baseline), judged by
    the rules of `options`; UserError when no kind has two usable runs (UnusableFolders with rules)."""
    runs, skipped = load_runs(paths)
    if not _comparable(runs):
        found = "; ".join(f"{r.path} ({KINDS[r.kind]})" for r in runs) or "none"
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        problem = f"fewer than two usable run folders of one kind to compare (usable: {found}"
        problem += f"; skipped: {reasons})" if reasons else ")"
        if options is not None and options.rules:
            problem += "; the gate has no runs to judge"
        fix = (
            "pass at least two completed folders written by stage1-run, or two by stage2-profile, of different runs "
            "(e.g. `perf-compare runs/a runs/b`); rerun failed or interrupted runs first"
        )
        raise _no_pair(problem, fix, options)
    return compared(runs, skipped, options)


# The files a folder given as --out gets.
MARKDOWN_FILE = "compare.md"
RECORD_FILE = "compare.json"


def record_path(out: Path) -> Path:
    """Where the comparison record goes next to its Markdown `out` (`X.md` -> `X.json`)."""
    return out.with_suffix(".json")


def output_files(out: Path | str) -> tuple[Path, Path]:
    """The Markdown and the record `--out` names: a folder (one that exists, or a name ending in `/`) gets
    compare.md and compare.json inside it; a file `X.md` gets `X.json` beside it."""
    path = Path(out)
    if path.is_dir() or str(out).endswith(("/", os.sep)):
        return path / MARKDOWN_FILE, path / RECORD_FILE
    if path.suffix == ".json":
        raise UserError(f"--out {out} ends in .json, where the comparison record goes", "Name a .md file or a folder")
    return path, record_path(path)


def refuse_overwrites(files: Sequence[Path], out: Path | str) -> None:
    """UserError when writing `files` would replace a folder, or a file that belongs to a run folder."""
    folders = [f for f in files if f.exists() and not f.is_file()]
    if folders:
        raise UserError(
            f"--out {out} would write the comparison over {folders[0]}, which is a folder",
            "Name a .md file, or a folder to hold compare.md and compare.json",
        )
    owned = [(f, run) for f in files if f.exists() and (run := enclosing_run_folder(f)) is not None]
    if owned:
        names = " and ".join(str(f) for f, _ in owned)
        raise UserError(
            f"--out {out} would overwrite {names}, part of the run folder {owned[0][1]}; nothing was written",
            "Write the comparison outside run folders (e.g. --out comparisons/ for comparisons/compare.md and "
            "compare.json), or name files that do not exist yet",
        )


# --------------------------------------------------------------------------------------------- what-if folders
WHATIF_STAGE = "whatif"  # the stage of a perf-whatif folder's run_status.json


def is_whatif(path: Path) -> bool:
    """Whether `path` holds whatif.json, or the run status of a what-if run (one that ended before writing it)."""
    path = Path(path)
    if (path / WHATIF_FILE).is_file():
        return True
    try:
        return (path / STATUS_FILE).is_file() and read_status(path).stage == WHATIF_STAGE
    except RecordError:
        return False


def _rung_folder(root: Path, record: WhatIfRecord, name: str) -> tuple[Path | None, str | None]:
    """The stage1-run folder of rung `name` in the what-if folder `root`, or why there is none to compare."""
    rung = record.rung(name)
    if rung is None:
        return None, f"no rung {name} in {root}"
    if rung.reused is not None:
        return None, f"reuses the measurements of rung {rung.reused} (compared there)"
    if rung.folder is None or rung.state != MEASURED:
        why = f": {rung.reason}" if rung.reason else ""
        return None, f"rung {name} in {root} is {rung.state}, not measured{why}"
    return root / rung.folder, None


def _labels(base: Path, new: Path) -> tuple[str, str]:
    """The two what-if folders' names as run labels (`#2` on the second when they are the same)."""
    a, b = base.resolve().name or str(base), new.resolve().name or str(new)
    return a, b if b != a else f"{b}#2"


def _folder_problem(root: Path) -> str | None:
    """Why a what-if folder cannot be gated: its run_status.json says it did not complete (a folder without one,
    from before what-if runs kept a status, is taken as its whatif.json says)."""
    if not (root / STATUS_FILE).is_file():
        return None
    try:
        status = read_status(root)
    except RecordError as exc:
        return f"{root}: {skip_reason(exc, root)}"
    return None if status.state == COMPLETE else f"{root} is {_not_complete(status)}"


def _reused(records: Sequence[WhatIfRecord], name: str) -> bool:
    return any((rung := r.rung(name)) is not None and rung.reused is not None for r in records)


def pair_rungs(base: Path, new: Path, options: GateOptions | None = None) -> WhatIfComparison:
    """Two what-if folders compared rung by rung (rungs paired by name, the first folder's order, then the rungs
    only the second has); each pair is a `Comparison` judged by the rules of `options`. The gate over every rung
    is unusable when a folder did not complete, or a rung one folder measured could not be compared."""
    records = load_whatif(base), load_whatif(new)
    names = union([[r.name for r in records[0].rungs], [r.name for r in records[1].rungs]])
    pairs = []
    problems = [p for p in (_folder_problem(base), _folder_problem(new)) if p]
    for name in names:
        (folder_a, why_a), (folder_b, why_b) = _rung_folder(base, records[0], name), _rung_folder(new, records[1], name)
        if folder_a is None or folder_b is None:
            why = why_a or why_b
            pairs.append(RungPair(name, folder_a, folder_b, None, why))
            if not _reused(records, name) and (folder_a is not None or folder_b is not None):  # one side measured it
                problems.append(f"rung {name}: {why}")
            continue
        runs, skipped = load_runs([folder_a, folder_b])
        if not _comparable(runs):
            why = "; ".join(s.reason for s in skipped)
            pairs.append(RungPair(name, folder_a, folder_b, None, why))
            problems.append(f"rung {name}: {why}")
            continue
        runs = [attrs.evolve(r, label=label) for r, label in zip(runs, _labels(base, new), strict=True)]
        pairs.append(RungPair(name, folder_a, folder_b, compared(runs, skipped, options)))
    if not (options and options.rules):
        return WhatIfComparison(SCHEMA_VERSION, WHATIF_COMPARE, base, new, tuple(pairs), None)
    gated = [p.comparison.gate for p in pairs if p.comparison is not None and p.comparison.gate is not None]
    result = combined_result([*(g.result for g in gated), *([GATE_UNUSABLE] if problems else [])])
    hint = "; ".join(dict.fromkeys(g.hint for g in gated if g.hint)) or None
    return WhatIfComparison(SCHEMA_VERSION, WHATIF_COMPARE, base, new, tuple(pairs), result, tuple(problems), hint)


def _same_whatif(base: Path, new: Path) -> str | None:
    """How two what-if folders are the same run (the same folder, or a copy: the same run id and start time)."""
    if base.resolve() == new.resolve():
        return f"{new} is the same folder as {base}"
    a, b = load_whatif(base), load_whatif(new)
    if (a.run_id, a.created) == (b.run_id, b.created):
        return f"{new} is the same what-if run as {base} (run id {a.run_id}, created {a.created}): a copy"
    return None


def _compare_any(paths: Sequence[Path], options: GateOptions | None) -> Comparison | WhatIfComparison:
    """Run folders compared side by side, or two what-if folders rung by rung."""
    whatifs = [p for p in paths if is_whatif(p)]
    if not whatifs:
        return compare(paths, options)
    if len(whatifs) != 2 or len(paths) != 2:
        raise UserError(
            f"perf-compare got {len(whatifs)} perf-whatif folder(s) among {len(paths)} folders",
            "Compare exactly two perf-whatif folders (rung by rung), or run folders only",
        )
    base, new = Path(paths[0]), Path(paths[1])
    for folder in (base, new):
        if not (folder / WHATIF_FILE).is_file():
            problem = _folder_problem(folder) or f"{folder} holds no {WHATIF_FILE}"
            raise _no_pair(
                f"{problem}; it wrote no {WHATIF_FILE}, so it has no rungs to compare",
                "Rerun that what-if run to its end (or compare the run folders of the rungs it measured)",
                options,
            )
    same = _same_whatif(base, new)
    if same is not None:
        raise _no_pair(
            f"{same}, so comparing them compares a run with itself", "Compare two different perf-whatif runs", options
        )
    return pair_rungs(base, new, options)


def write_comparison(
    paths: Sequence[Path], out: Path | str, options: GateOptions | None = None
) -> Comparison | WhatIfComparison:
    """Compare `paths` (run folders, or two what-if folders); write the Markdown and the record where `--out`
    names them (`output_files`; parent folders created), never over a file of a run folder."""
    markdown, record = output_files(out)
    refuse_overwrites([markdown, record], out)
    result = _compare_any(paths, options)
    text = comparison_markdown(result) if isinstance(result, Comparison) else whatif_comparison_markdown(result)
    try:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        save(result, record)  # atomically, as Markdown below: a reader never sees half a file
        io.atomic_write_text(markdown, text)
    except OSError as exc:
        raise UserError(
            f"could not write the comparison to {exc.filename or markdown}: {exc.strerror or exc}",
            "Free disk space or make that folder writable, or name another with --out",
        ) from exc
    return result


def gate_outcome(result: Comparison | WhatIfComparison) -> tuple[str | None, tuple[str, ...], str | None]:
    """The `--fail-on` gate's result (GATE_RESULTS; None: no rules given), why it is unusable (the folders or rungs
    it could not judge), and what would let it judge the rules it could not (None: nothing to add)."""
    if isinstance(result, WhatIfComparison):
        return result.gate_result, result.gate_problems, result.gate_hint
    gate = result.gate
    return (None, (), None) if gate is None else (gate.result, gate.problems, gate.hint)

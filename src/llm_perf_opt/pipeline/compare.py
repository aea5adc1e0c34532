"""Compare run folders of `stage1-run` and `stage2-profile` side by side, against the first one as baseline.

Each folder is read as typed records (`records.folders`), so this needs neither a GPU nor torch. Folders that
cannot be compared (missing, unfinished, damaged, another schema) are skipped with the reason; runs are compared
only with runs of the same kind (Stage 1 with Stage 1, Stage 2 with Stage 2). The figures come from
`measure.comparison`, the Markdown from `report.comparison`; `compare.json` next to `compare.md` holds the record.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.comparison import Run, build_comparison
from llm_perf_opt.records.common import COMPLETE
from llm_perf_opt.records.comparison import KINDS, Comparison, Skipped
from llm_perf_opt.records.folders import (
    METRICS_FILE,
    STATUS_FILE,
    enclosing_run_folder,
    load,
    read_status,
    skip_reason,
    status_detail,
)
from llm_perf_opt.records.io import RecordError, save
from llm_perf_opt.report.comparison import comparison_markdown


def load_run(path: Path) -> Run | Skipped:
    """The completed run in `path` as typed records, or why it cannot be compared."""
    path = Path(path)
    if not path.exists():
        return Skipped(path, "the folder does not exist")
    if not path.is_dir():
        return Skipped(path, "not a folder")
    has_metrics = (path / METRICS_FILE).is_file()
    if not (path / STATUS_FILE).is_file():
        if not has_metrics:
            return Skipped(path, "no metrics.json (not a finished stage1-run or stage2-profile folder)")
        return Skipped(path, "no run_status.json, so the run is not marked complete")
    try:
        status = read_status(path)
        if status.state != COMPLETE:  # before metrics.json: a run killed hard wrote none, its status says why
            detail = status_detail(status)
            tail = f": {detail}" if detail else ""
            return Skipped(path, f"the run is marked {status.state or 'with no state'}, not complete{tail}")
        if not has_metrics:
            return Skipped(path, "no metrics.json (not a finished stage1-run or stage2-profile folder)")
        folder = load(path)
    except RecordError as exc:
        return Skipped(path, skip_reason(exc, path))
    if folder.kind not in KINDS:
        return Skipped(path, f"metrics.json is for stage {folder.kind!r}, not stage1 or stage2")
    return Run(path, path.resolve().name or str(path), folder)


def load_runs(paths: Sequence[Path]) -> tuple[list[Run], list[Skipped]]:
    """Usable runs (labels made unique) and skipped folders, in the order given."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    for path in paths:
        loaded = load_run(Path(path))
        if isinstance(loaded, Skipped):
            skipped.append(loaded)
            continue
        taken = {r.label for r in runs}
        label, n = loaded.label, 2
        while label in taken:
            label, n = f"{loaded.label}#{n}", n + 1
        runs.append(attrs.evolve(loaded, label=label))
    return runs, skipped


def compare(paths: Sequence[Path]) -> Comparison:
    """The comparison of the run folders in `paths` (the first usable one of each kind is the baseline).

    Raises UserError when no kind has two usable runs.
    """
    runs, skipped = load_runs(paths)
    if all(sum(r.kind == kind for r in runs) < 2 for kind in KINDS):
        found = "; ".join(f"{r.path} ({KINDS[r.kind]})" for r in runs) or "none"
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        problem = f"fewer than two usable run folders of one kind to compare (usable: {found}"
        problem += f"; skipped: {reasons})" if reasons else ")"
        raise UserError(
            problem,
            "pass at least two completed folders written by stage1-run, or two by stage2-profile "
            "(e.g. `perf-compare runs/a runs/b`); rerun failed or interrupted runs first",
        )
    return build_comparison(runs, skipped)


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


def write_comparison(paths: Sequence[Path], out: Path | str) -> Comparison:
    """Compare `paths`; write the Markdown and the record where `--out` names them (`output_files`; parent
    folders created), never over a file of a run folder."""
    markdown, record = output_files(out)
    refuse_overwrites([markdown, record], out)
    result = compare(paths)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(comparison_markdown(result), encoding="utf-8")
    save(result, record)
    return result

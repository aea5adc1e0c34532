"""Re-render the shipped examples (``examples/``) with today's code, from their records alone.

Run from the repository root after a change to a report::

    python scripts/rerender_examples.py            # every example, in place
    python scripts/rerender_examples.py whatif-h100-decode

An example holds records (``metrics.json``, ``inputs.yaml``, ``whatif.json``, Nsight exports, ...) and what the
toolkit renders from them. Each rendered file (every ``*.md`` but an example's own ``README.md``, every ``*.png``) is
removed first, then rendered again: ``stage2-report`` for a Stage 2 folder; for a what-if folder, ``stage1-report``
for each rung folder (Markdown alone, no plots or predictions gallery, to keep the examples small) and then
``whatif.md`` with its plots from ``whatif.json``. The output is deterministic (no time of rendering, no machine
paths), so running it twice changes nothing; ``tests/test_examples.py`` fails when an example differs from what this
script renders. ``examples/README.md`` says what each example keeps.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.pipeline import stage1_render, stage2
from llm_perf_opt.records.folders import METRICS_FILE, WHATIF_FILE, load_whatif
from llm_perf_opt.report import whatif_report

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COMMAND = "python scripts/rerender_examples.py"
RUNGS = "rungs"
README = "README.md"  # an example's own description, written by hand


def rendered_files(example: Path) -> list[Path]:
    """The files of `example` the toolkit renders: every Markdown file but the example's README, every PNG."""
    return sorted(
        p
        for p in example.rglob("*")
        if p.is_file() and (p.suffix == ".png" or (p.suffix == ".md" and p.name != README))
    )


def _remove_rendered(example: Path) -> None:
    for path in rendered_files(example):
        path.unlink()
    for folder in sorted((p for p in example.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()


def _render_whatif(example: Path) -> None:
    rungs = sorted(p for p in (example / RUNGS).glob("*") if p.is_dir()) if (example / RUNGS).is_dir() else []
    for rung in rungs:
        if not (rung / METRICS_FILE).is_file():
            raise SystemExit(f"{rung}: no {METRICS_FILE}: an example ships a rung with its records or not at all")
        stage1_render.render(rung, images=False)  # cites the what-if folder it lies in
    art = ArtifactsManager(example, stage="whatif")
    art.written.append(WHATIF_FILE)  # the record, as the runner writes it before the report
    whatif_report.write_all(art, load_whatif(example))


def rerender(example: Path) -> None:
    """Render one example folder again in place, from its records."""
    _remove_rendered(example)
    if (example / WHATIF_FILE).is_file():
        _render_whatif(example)
    else:
        stage2.render(example)


def differences(shipped: Path, rendered: Path) -> list[str]:
    """How the folder `rendered` differs from `shipped`: files only in one, and files whose bytes differ (a PNG is
    compared by its presence alone: its bytes follow the matplotlib release)."""

    def files(folder: Path) -> set[str]:
        return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}

    ours, theirs = files(shipped), files(rendered)
    out = [f"{name}: shipped, not rendered" for name in sorted(ours - theirs)]
    out += [f"{name}: rendered, not shipped" for name in sorted(theirs - ours)]
    out += [
        f"{name}: differs"
        for name in sorted(ours & theirs)
        if not name.endswith(".png") and (shipped / name).read_bytes() != (rendered / name).read_bytes()
    ]
    return out


def examples() -> list[Path]:
    """Every shipped example folder."""
    return sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


def main(argv: Sequence[str] | None = None) -> None:
    names = list(sys.argv[1:] if argv is None else argv)
    known = {p.name: p for p in examples()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"no such example: {', '.join(unknown)} (the examples: {', '.join(known)})")
    for name in names or list(known):
        rerender(known[name])
        print(f"re-rendered examples/{name}")


if __name__ == "__main__":
    main()

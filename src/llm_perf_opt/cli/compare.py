"""`perf-compare <run_a> <run_b> [...]`: compare run folders side by side, the first one as baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_perf_opt.cli.common import run_guarded
from llm_perf_opt.pipeline.compare import Comparison, output_files, write_comparison


def _run(folders: list[Path], out: str) -> Comparison:
    result = write_comparison(folders, out)
    for skipped in result.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    print(f"\ncomparison: {output_files(out)[0]}")
    return result


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    parser = argparse.ArgumentParser(
        prog="perf-compare",
        description="Compare stage1-run or stage2-profile folders in Markdown (and the same figures as JSON next to "
        "it); the first folder is the baseline.",
    )
    parser.add_argument("folders", type=Path, nargs="+", metavar="run", help="run folders (at least two)")
    parser.add_argument(
        "--out",
        default="compare.md",
        help="Markdown to write, the record next to it as .json; a folder (existing, or ending in /) gets "
        "compare.md and compare.json inside it. Files of a run folder are never overwritten (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_guarded(lambda: _run(args.folders, args.out))


if __name__ == "__main__":
    main()

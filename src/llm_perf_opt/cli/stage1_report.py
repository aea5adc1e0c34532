"""`stage1-report <folder>`: rebuild a Stage 1 folder's Markdown reports and plots from its records (no model, no
GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from llm_perf_opt.cli.common import print_report_path, run_guarded


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="stage1-report", description=__doc__)
    parser.add_argument("folder", type=Path, help="a folder written by stage1-run (or a copy of one)")
    args = parser.parse_args(argv)
    from llm_perf_opt.pipeline.stage1 import render

    print_report_path(run_guarded(lambda: render(args.folder)))


if __name__ == "__main__":
    main()

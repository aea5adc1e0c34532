"""`perf-compare <run_a> <run_b> [...]`: compare run folders side by side, the first one as baseline; with
`--fail-on`, a regression gate (exit 1 when a rule regressed beyond its threshold and beyond noise)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_perf_opt.cli.common import run_guarded
from llm_perf_opt.cli.help_text import parser_text
from llm_perf_opt.pipeline.compare import GateOptions, gate_failed, output_files, write_comparison
from llm_perf_opt.pipeline.gate_rules import parse_rules
from llm_perf_opt.records.comparison import Comparison, WhatIfComparison

GATE_FAILED_EXIT = 1


def _run(folders: list[Path], out: str, options: GateOptions) -> Comparison | WhatIfComparison:
    result = write_comparison(folders, out, options)
    skipped = result.skipped if isinstance(result, Comparison) else ()
    for folder in skipped:
        print(f"skipped {folder.path}: {folder.reason}", file=sys.stderr)
    print(f"\ncomparison: {output_files(out)[0]}")
    if options.rules:
        print(f"gate: {'fail' if gate_failed(result) else 'pass'}")
    return result


def _parser() -> argparse.ArgumentParser:
    description, epilog = parser_text("perf-compare")
    parser = argparse.ArgumentParser(
        prog="perf-compare",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folders", type=Path, nargs="+", metavar="run", help="run folders (at least two)")
    parser.add_argument(
        "--out",
        default="compare.md",
        help="Markdown to write, the record next to it as .json; a folder (existing, or ending in /) gets "
        "compare.md and compare.json inside it. Files of a run folder are never overwritten (default: %(default)s)",
    )
    parser.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="RULES",
        help="comma-separated rules FIGURE:+N%% or FIGURE:+N<ms|s|B|KiB|MiB|GiB> (repeatable), e.g. "
        "decode_ms_per_token:+5%%,peak_gpu_memory:+1GiB: exit 1 when a figure grew by more than that, beyond noise",
    )
    parser.add_argument(
        "--fail-on-unjudged",
        action="store_true",
        help="also fail when a rule's change exceeds its threshold but cannot be judged (fewer than 3 passes)",
    )
    parser.add_argument(
        "--allow-different",
        action="store_true",
        help="judge the rules even when the runs differ in workload or device (listed in the gate section)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    args = _parser().parse_args(argv)

    def job() -> Comparison | WhatIfComparison:
        options = GateOptions(parse_rules(args.fail_on), args.fail_on_unjudged, args.allow_different)
        return _run(args.folders, args.out, options)

    if gate_failed(run_guarded(job)):
        sys.exit(GATE_FAILED_EXIT)


if __name__ == "__main__":
    main()

"""`perf-compare <run_a> <run_b> [...]`: compare run folders side by side, the first one as baseline; with
`--fail-on`, a regression gate whose result is the exit code: 0 pass, 1 fail (a rule regressed beyond its threshold
and beyond noise), 2 bad input, 3 inconclusive (a rule the noise does not let it judge), 4 unusable (a folder failed,
interrupted, missing, or the same run twice). The last line printed is the path of compare.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_perf_opt.cli.common import run_guarded
from llm_perf_opt.cli.help_text import command_parser
from llm_perf_opt.config_compose import new_run_id
from llm_perf_opt.pipeline.compare import GateOptions, gate_outcome, output_files, write_comparison
from llm_perf_opt.pipeline.gate_rules import parse_rules
from llm_perf_opt.records.comparison import GATE_EXIT_CODES, Comparison, WhatIfComparison

DEFAULT_OUT_ROOT = Path("tmp") / "compare"  # the default --out: a fresh folder under it, as other commands use tmp/


def _run(folders: list[Path], out: str, options: GateOptions) -> Comparison | WhatIfComparison:
    result = write_comparison(folders, out, options)
    for folder in result.skipped if isinstance(result, Comparison) else ():
        print(f"skipped {folder.path}: {folder.reason}", file=sys.stderr)
    verdict, problems, hint = gate_outcome(result)
    if verdict is not None:
        print(f"\ngate: {verdict}" + (f" (exit {GATE_EXIT_CODES[verdict]})" if GATE_EXIT_CODES[verdict] else ""))
        for problem in problems:
            print(f"not usable: {problem}")
        if hint:
            print(f"hint: {hint}")
    print(output_files(out)[0])  # the last line: the bare path of compare.md, for scripts
    return result


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("perf-compare")
    parser.add_argument("folders", type=Path, nargs="+", metavar="run", help="run folders (at least two)")
    parser.add_argument(
        "--out",
        default=None,
        help="Markdown to write, the record next to it as .json; a folder (existing, or ending in /) gets "
        "compare.md and compare.json inside it. Files of a run folder are never overwritten (default: a new folder "
        f"{DEFAULT_OUT_ROOT}/<timestamp>/)",
    )
    parser.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="RULES",
        help="comma-separated rules FIGURE:+N%% or FIGURE:+N<ms|s|B|KiB|MiB|GiB> (repeatable), e.g. "
        "decode_ms_per_token:+5%%,peak_gpu_memory:+1GiB: exit 1 when a figure grew by more than that, beyond noise; "
        "exit 3 when the noise leaves it open; exit 0 only when every rule is shown within its allowance",
    )
    parser.add_argument(
        "--fail-on-unjudged",
        action="store_true",
        help="count a rule the gate cannot judge (inconclusive: too few passes or too much noise, or a figure not "
        "measured) as a failure: exit 1 instead of 3",
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
    out = args.out if args.out is not None else f"{DEFAULT_OUT_ROOT / new_run_id()}/"

    def job() -> Comparison | WhatIfComparison:
        options = GateOptions(parse_rules(args.fail_on), args.fail_on_unjudged, args.allow_different)
        return _run(args.folders, out, options)

    verdict = gate_outcome(run_guarded(job))[0]
    if verdict is not None and GATE_EXIT_CODES[verdict]:
        sys.exit(GATE_EXIT_CODES[verdict])


if __name__ == "__main__":
    main()

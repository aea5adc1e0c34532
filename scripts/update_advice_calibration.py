"""Fold the savings measured by ``perf-whatif whatif=advised`` runs into the advice's calibration.

Run from the repository root after an advised what-if run::

    python scripts/update_advice_calibration.py tmp/whatif/<run_id> [more folders...]
    python scripts/update_advice_calibration.py tmp/whatif/<run_id> --dry-run     # say what it would fold in

Each folder's "Predicted against measured" rows (``whatif.json``: ``predictions``) give, per lever, the bound its
advice predicted from and the saving its rung measured on the parts of the page the bound lies in; each measured one
becomes a sample of its lever kind's share (``records.advice.calibrated`` through ``measure.advice.calibration_from``).
A row is left out, with the reason printed, where nothing was measured, where the baseline ran another workload than
the advised run (its objective per page more than 25% apart), or where that what-if run was folded in before (the
kind's ``sources``). The result is written over the package's ``advice_calibration.yaml`` (or ``--calibration``);
commit it with the folders' run ids in the message.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.measure.advice import calibration_from
from llm_perf_opt.records import advice as advice_records
from llm_perf_opt.records.advice import CALIBRATION_FILE, dump_calibration, load_calibration
from llm_perf_opt.records.folders import load_whatif
from llm_perf_opt.records.io import RecordError

SHIPPED = Path(advice_records.__file__).resolve().parent / CALIBRATION_FILE


def update(folders: Sequence[Path], calibration_file: Path, *, write: bool = True) -> tuple[list[str], bool]:
    """Fold every folder's measured predictions into `calibration_file` (written where anything was folded in, unless
    `write` is false): the lines saying what became of each row, and whether the calibration changed. RecordError
    for a folder that is no advised what-if run."""
    before = load_calibration(calibration_file.read_text(encoding="utf-8"), str(calibration_file))
    calibration = before
    lines: list[str] = []
    for folder in folders:
        record = load_whatif(folder)
        if not record.predictions:
            raise RecordError(
                f"{folder} holds no predictions: it is not a perf-whatif whatif=advised run",
                "Give the folder of `perf-whatif whatif=advised whatif.from_run=<stage1-run folder>`",
            )
        calibration, said = calibration_from(calibration, record)
        lines += said
    changed = calibration != before
    if write and changed:
        calibration_file.write_text(dump_calibration(calibration), encoding="utf-8")
    return lines, changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("folders", nargs="+", type=Path, help="perf-whatif whatif=advised folders")
    parser.add_argument("--calibration", type=Path, default=SHIPPED, help="the calibration file (default: shipped)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be folded in, write nothing")
    args = parser.parse_args(argv)
    try:
        lines, changed = update(args.folders, args.calibration, write=not args.dry_run)
    except (RecordError, ValueError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(lines))
    if not changed:
        print(f"nothing folded in: {args.calibration} left as it was")
    else:
        print(f"{'would write' if args.dry_run else 'wrote'} {args.calibration}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

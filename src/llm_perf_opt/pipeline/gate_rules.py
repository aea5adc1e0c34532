"""`--fail-on` rules read from the command line: `figure:+5%` or `figure:+3ms` (an allowed increase over the
baseline), comma-separated, the option repeatable. Bad input is a UserError (one paragraph, exit 2)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.gate import BYTES, MS, Figure
from llm_perf_opt.records.comparison import GateRule

# An allowed increase: a number ≥ 0 with an optional "+", then % or a unit.
THRESHOLD = re.compile(r"^\+?(\d+(?:\.\d*)?|\.\d+)\s*(%|ms|s|B|KiB|MiB|GiB)$")
# Each unit, the figure unit it applies to and its size in that unit.
UNITS: Mapping[str, tuple[str, float]] = {
    "ms": (MS, 1.0),
    "s": (MS, 1e3),
    "B": (BYTES, 1.0),
    "KiB": (BYTES, 2.0**10),
    "MiB": (BYTES, 2.0**20),
    "GiB": (BYTES, 2.0**30),
}
FORMS = "FIGURE:+N% or FIGURE:+N<unit> with a unit of ms, s, B, KiB, MiB or GiB (e.g. decode_ms_per_token:+5%)"


def parse_rule(text: str) -> GateRule:
    """One rule (figure name not yet checked; `unit` is that of the threshold, "%" for a percentage)."""
    figure, sep, threshold = text.strip().rpartition(":")
    figure, threshold = figure.strip(), threshold.strip()
    if not sep or not figure:
        raise UserError(f"--fail-on rule {text!r} names no figure", f"Write each rule as {FORMS}")
    match = THRESHOLD.match(threshold)
    if match is None:
        problem = f"--fail-on rule {text!r} has the threshold {threshold!r}, which is not an allowed increase"
        if threshold.startswith("-"):
            problem += " (a rule allows an increase; decreases are improvements and never fail)"
        raise UserError(problem, f"Write each rule as {FORMS}")
    value, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        return GateRule(text=text.strip(), figure=figure, percent=value, amount=None, unit="%")
    kind, scale = UNITS[unit]
    return GateRule(text=text.strip(), figure=figure, percent=None, amount=value * scale, unit=kind)


def parse_rules(options: Sequence[str]) -> tuple[GateRule, ...]:
    """Every rule of the `--fail-on` options (each a comma-separated list), in order."""
    rules = [parse_rule(part) for option in options for part in option.split(",") if part.strip()]
    if options and not rules:
        raise UserError("--fail-on was given without a rule", f"Write each rule as {FORMS}")
    return tuple(rules)


def resolve(rules: Sequence[GateRule], figures: Mapping[str, Figure]) -> tuple[GateRule, ...]:
    """The rules with their figures checked against `figures` and their units set to the figure's; UserError for
    an unknown figure (naming the nearest valid ones and listing all) or a unit of another kind."""
    resolved = []
    for rule in rules:
        figure = figures.get(rule.figure)
        if figure is None:
            near = difflib.get_close_matches(rule.figure, list(figures), n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(near)}? " if near else ""
            raise UserError(
                f"--fail-on rule {rule.text!r} names the unknown figure {rule.figure!r}",
                f"{hint}Name one of: {', '.join(figures)}",
            )
        if rule.unit not in ("%", figure.unit):
            raise UserError(
                f"--fail-on rule {rule.text!r} gives an amount in another unit than {rule.figure}'s ({figure.unit})",
                "Give a percentage, or " + ("ms or s" if figure.unit == MS else "B, KiB, MiB or GiB"),
            )
        resolved.append(attrs.evolve(rule, unit=figure.unit))
    return tuple(resolved)

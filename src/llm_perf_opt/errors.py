"""Errors the user can act on.

A :class:`UserError` carries one paragraph that names the problem and the fix. The CLI prints it without a
traceback, marks the run folder failed and exits with code 2. Everything else is a bug: one paragraph too, exit code
1, its traceback written to a file (`cli/bug_report.py`).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment: the message names the problem and how to fix it."""

    exit_code = 2

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem.rstrip(". ")
        fix = fix.strip().rstrip(".")
        self.fix = fix[:1].upper() + fix[1:]
        super().__init__(f"{self.problem}. {self.fix}.")


# YAML 1.1 words some tools read as booleans: refused here (with this hint) rather than read two ways.
_YAML11_WORDS = ("on", "off", "yes", "no", "y", "n")


def require_bool(name: str, value: object, fix: str | None = None) -> bool:
    """`value` when it is a boolean, else a UserError naming the setting `name` (and `fix`, when given)."""
    if isinstance(value, bool):
        return value
    hint = ""
    if isinstance(value, str) and value.strip().lower() in _YAML11_WORDS:
        hint = f" (only true and false are booleans here: {value} would be read as a string)"
    raise UserError(f"{name}={value} is not true or false{hint}", fix or f"Set {name}=true or {name}=false")


def require_whole(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int in [`minimum`, `maximum`], or a UserError naming the setting `name`."""
    within = f"from {minimum} to {maximum:,}" if maximum is not None else f"≥ {minimum}"
    fix = f"Set {name} to a whole number {within}"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UserError(f"{name}={value} is not a whole number", fix)
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{name}={value} is not a whole number", fix) from None
    if number < minimum or (maximum is not None and number > maximum):
        raise UserError(f"{name}={value} is out of range", fix)
    return number


def require_number(name: str, value: object, low: float, unit: str, *, above: bool = False) -> float:
    """`value` as a finite number ≥ `low` (> `low` when `above`), or a UserError naming the setting `name`."""
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = float("nan")
    inside = number > low if above else number >= low  # NaN fails both
    if not inside or number == float("inf"):
        bound = ">" if above else "≥"
        raise UserError(f"{name}={value} is out of range", f"Set {name} to a number of {unit} {bound} {low:g}")
    return number


def require_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """`value` (case-insensitive; null reads as none where none is allowed) when it is one of `allowed`."""
    text = "none" if value is None and "none" in allowed else str(value).strip().lower()
    if text not in allowed:
        raise UserError(f"{name}={value} is not a known value", f"Set {name} to one of {', '.join(allowed)}")
    return text

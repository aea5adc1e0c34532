"""Errors the user can act on.

A :class:`UserError` carries one paragraph that names the problem and the fix. The CLI prints it without a
traceback, marks the run folder failed and exits non-zero. Everything else is a bug and keeps its traceback.
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


def require_bool(name: str, value: object, fix: str | None = None) -> bool:
    """`value` when it is a boolean, else a UserError naming the setting `name` (and `fix`, when given)."""
    if isinstance(value, bool):
        return value
    raise UserError(f"{name}={value} is not true or false", fix or f"Set {name}=true or {name}=false")


def require_whole(name: str, value: object, minimum: int) -> int:
    """`value` as an int of at least `minimum`, or a UserError naming the setting `name`."""
    fix = f"Set {name} to a whole number ≥ {minimum}"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UserError(f"{name}={value} is not a whole number", fix)
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{name}={value} is not a whole number", fix) from None
    if number < minimum:
        raise UserError(f"{name}={value} is out of range", fix)
    return number

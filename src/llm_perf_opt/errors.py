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

"""Helpers shared by the tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import subprocess
import sys


def run_cli(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` as a user would run the console script, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, check=False
    )

"""A stand-in entry point for the rung fork server's tests (tests/test_rung_forks.py): `main()` acts on sys.argv."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    what, arg = sys.argv[1], sys.argv[2]
    if what == "exit":
        raise SystemExit(int(arg))
    if what == "env":
        print(f"{arg}={os.environ.get(arg, '')} pgid={os.getpgid(0)} pid={os.getpid()}")
    elif what == "sleep":
        print("sleeping", flush=True)
        time.sleep(float(arg))
    elif what == "raise":
        raise RuntimeError(arg)
    elif what == "module":
        print(f"{arg} {'loaded' if arg in sys.modules else 'not loaded'}")

"""An exception that reaches the top of a command and is not the user's (no UserError, no environment error): a bug.

It ends the command like bad input does — one paragraph on stderr, the run folder marked failed with the reason —
but with exit code 1, and its traceback is kept: written to `<run folder>/error.log` (a new file in the system's
temporary folder when the command has no run folder, or it cannot be written), and printed on stderr as well when
`LLM_PERF_OPT_TRACEBACK=1`.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

import llm_perf_opt

BUG_EXIT_CODE = 1
TRACEBACK_ENV = "LLM_PERF_OPT_TRACEBACK"  # =1: the traceback on stderr too
ERROR_LOG = "error.log"  # in the run folder
_MESSAGE_CHARS = 300  # of the exception's message in the paragraph (the file holds it whole)
# The libraries whose versions a report names (module, distribution), those the command imported
_LIBRARIES = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("hydra", "hydra-core"),
    ("omegaconf", "omegaconf"),
    ("attrs", "attrs"),
    ("cattrs", "cattrs"),
)


def what_failed(exc: BaseException) -> str:
    """The exception in a few words: its type, the first line of its message, and the line of code that raised it."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > _MESSAGE_CHARS or len(lines) > 1:
        message = message[:_MESSAGE_CHARS].rstrip() + " …"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (in {frames[-1].name}, {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}{': ' + message if message else ''}{where}"


def write_traceback(exc: BaseException, run_dir: Path | None) -> Path | None:
    """The file that now holds `exc`'s traceback, the command line and the versions that ran it: `run_dir`/error.log,
    else a new file in the temporary folder; None when neither can be written."""
    text = _report_text(exc)
    if run_dir is not None and Path(run_dir).is_dir() and _written(Path(run_dir) / ERROR_LOG, text):
        return (Path(run_dir) / ERROR_LOG).resolve()
    try:
        fd, name = tempfile.mkstemp(prefix=f"llm-perf-opt-error-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log")
    except OSError:
        return None
    os.close(fd)
    return Path(name) if _written(Path(name), text) else None


def _written(target: Path, text: str) -> bool:
    """Whether `text` could be written to `target` (False: the folder cannot take it)."""
    try:
        target.write_text(text, encoding="utf-8")
    except OSError:
        return False
    return True


def bug_paragraph(exc: BaseException, log: Path | None) -> str:
    """The one paragraph a bug ends a command with: what failed, whose fault it is, where the traceback is, and how
    to report it."""
    where = f"the full traceback is in {log}" if log is not None else "its traceback could not be written to a file"
    return (
        f"error: unexpected {what_failed(exc)}. This is a bug in llm-perf-opt or in a library it uses, not a problem "
        f"with your input; {where} (set {TRACEBACK_ENV}=1 to print it here too). Please report it on llm-perf-opt's "
        f"issue tracker with this message and {'that file' if log is not None else 'the traceback'}."
    )


def status_message(exc: BaseException, log: Path | None) -> str:
    """The run folder's reason for failing: what failed and where its traceback is."""
    return f"a bug: {what_failed(exc)}" + (f"; traceback in {log}" if log is not None else "")


def print_bug(exc: BaseException, log: Path | None) -> None:
    """The paragraph on stderr (with `LLM_PERF_OPT_TRACEBACK=1`, the traceback before it)."""
    if os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0"):
        traceback.print_exception(exc, file=sys.stderr)
    print(f"\n{bug_paragraph(exc, log)}", file=sys.stderr)


def _report_text(exc: BaseException) -> str:
    """What a bug report needs: the command line, the versions, the traceback."""
    loaded = [f"{dist} {_version(dist)}" for module, dist in _LIBRARIES if module in sys.modules]
    header = [
        f"command: {shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}",
        f"working folder: {_cwd()}",
        f"llm-perf-opt {llm_perf_opt.__version__}, Python {platform.python_version()} on {platform.platform()}",
        *([f"loaded: {', '.join(loaded)}"] if loaded else []),
        f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
    ]
    return "\n".join(header) + "\n\n" + "".join(traceback.format_exception(exc))


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError as exc:  # the working folder was removed while the command ran
        return f"(unknown: {exc.strerror or exc})"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(version unknown)"

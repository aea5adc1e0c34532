"""The Nsight tools Stage 2 runs into its folder: each command kept in its folder's `cmd.txt`, each run in the
capture's record (`capture.json`)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.nsight import commands
from llm_perf_opt.nsight.tools import Tool, ToolRun, check_run, find_tool, run_tool
from llm_perf_opt.progress import Feedback
from llm_perf_opt.records.folders import CAPTURE_FILE
from llm_perf_opt.records.stage2 import Capture, CapturedToolRun, ToolInfo

log = logging.getLogger("llm_perf_opt.stage2")


class ToolRuns:
    """The tools run into one Stage 2 folder and the capture's record of them."""

    def __init__(self, art: ArtifactsManager, feedback: Feedback, capture: Capture) -> None:
        self.art = art
        self.feedback = feedback
        self.capture = capture
        self._notes = threading.Lock()  # the capture's record is noted from the background thread too

    def note(self, **changes: Any) -> None:
        """Add `changes` to the capture's record (from the background thread too)."""
        with self._notes:
            self.capture = attrs.evolve(self.capture, **changes)

    def save(self) -> None:
        self.art.write_json(CAPTURE_FILE, self.capture)

    def find(self, name: str, binary: str | None) -> Tool:
        """The tool `name` (at `binary` when set), noted in the capture."""
        tool = find_tool(name, binary)
        self.note(tools={**self.capture.tools, name: ToolInfo(path=str(tool.path), version=tool.version)})
        return tool

    def timed(
        self,
        key: str,
        argv: list[str],
        log_rel: str,
        timeout_s: float,
        what: str,
        *,
        check: bool = True,
        background: bool = False,
    ) -> ToolRun:
        """Run a tool, its command in its folder's cmd.txt and its run in the capture; `background`: from the
        background thread (no progress bar: the foreground step has it)."""
        # the folder's cmd.txt gains the command: every command run there, in order (nsys/: profile, then export)
        cmd_rel = str(Path(log_rel).with_name("cmd.txt"))
        earlier = self.art.path(cmd_rel).read_text() if cmd_rel in self.art.written else ""
        self.art.write_text(cmd_rel, earlier + commands.shell_line(argv) + "\n")
        log.info("%s: %s", what, commands.shell_line(argv)[:200])
        started = time.perf_counter()
        with nullcontext() if background else self.feedback.step(what, part=key.replace("_", " ")):
            run = run_tool(argv, timeout_s=timeout_s, log_path=self.art.path(log_rel))
        self.art.record(log_rel)
        done = CapturedToolRun(
            argv=tuple(argv), returncode=run.returncode, seconds=time.perf_counter() - started, timed_out=run.timed_out
        )
        self.note(runs={**self.capture.runs, key: done})
        if check:
            check_run(run, what)
        return run

    def export(self, argv: list[str], log_rel: str, what: str) -> None:
        """Run an export whose output is its log (`ncu --import`), untimed and unrecorded; a failure raises."""
        check_run(run_tool(argv, timeout_s=600, log_path=self.art.path(log_rel)), what)

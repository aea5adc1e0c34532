"""Progress for long work (rich bars on stderr on a terminal, silence otherwise), where the command's time went, and
the one-screen summary at the end (stdout, with the logs; its last line is the report's bare path, so
`stage1-run | tail -1` names the report)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from llm_perf_opt.records.common import TimeBudget
from llm_perf_opt.time_ledger import TimeLedger

log = logging.getLogger("llm_perf_opt.progress")


def duration_text(seconds: float) -> str:
    """ "42 s", "3 min 05 s", "1 h 02 min"."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class RemainingColumn(ProgressColumn):
    """ "~3 min 05 s left", from the task's mean time per unit so far (blank until the first unit is done, once
    the task is finished, and without a total)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        if task.total is None or not task.completed or task.finished or elapsed is None:
            return Text("", style="progress.remaining")
        left = max(0.0, task.total - task.completed) * elapsed / task.completed
        return Text(f"~{duration_text(left)} left", style="progress.remaining")


class Feedback:
    """Progress bars on `stream` (stderr) and the final summary on `out` (stdout). Bars appear only on a terminal
    (logs carry the same events anyway); the summary is a table on a terminal, plain lines otherwise. Each step's
    wall time goes to the command's time budget (`ledger`), from the process's start."""

    def __init__(
        self, stream: IO[str] | None = None, *, interactive: bool | None = None, out: IO[str] | None = None
    ) -> None:
        stream = stream or sys.stderr
        out = out or sys.stdout
        self.interactive = stream.isatty() if interactive is None else interactive
        self.console = Console(file=stream, force_terminal=self.interactive, soft_wrap=True)
        self.out_interactive = out.isatty() if interactive is None else interactive
        self.out = Console(file=out, force_terminal=self.out_interactive, soft_wrap=True)
        self._progress: Progress | None = None
        self.ledger = TimeLedger()  # the process's start up to now: the budget's `start`

    @contextmanager
    def session(self) -> Iterator[None]:
        """Show bars while the block runs (no-op when not interactive)."""
        if not self.interactive:
            yield
            return
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            RemainingColumn(),
            console=self.console,
            transient=False,
        )
        with self._progress:
            try:
                yield
            finally:
                self._progress = None

    @contextmanager
    def step(self, description: str, total: int | None = None, *, part: str | None = None) -> Iterator[StepHandle]:
        """A unit of work (model build, images x passes, a profiler pass, an Nsight tool); its wall time goes to the
        log (where a run's time went, without a terminal) and to the time budget's `part` (short: "build",
        "passes"; default the description)."""
        handle = StepHandle(self._progress, description, total)
        started = time.perf_counter()
        try:
            with self.ledger.part(part or description):
                yield handle
        finally:
            handle.done()
            log.info("step done in %.1f s: %s", time.perf_counter() - started, description)

    @contextmanager
    def tally(self, description: str, total: int) -> Iterator[StepHandle]:
        """A count across steps (a what-if's rungs over its phases), its total growing as more are planned
        (`StepHandle.grow`); its time is the steps'."""
        handle = StepHandle(self._progress, description, total)
        try:
            yield handle
        finally:
            handle.done()

    def budget(self, note: str | None = None) -> TimeBudget:
        """Where the command's time went so far (`TimeLedger.budget`)."""
        return self.ledger.budget(note)

    def summary(
        self, title: str, rows: Sequence[tuple[str, str]], report: str, budget: TimeBudget | None = None
    ) -> None:
        """Key figures (a table on a terminal, plain lines otherwise), then where the time went, then the report's
        bare path as the last line (`| tail -1` gives it to a script)."""
        if self.out_interactive and rows:
            table = Table(title=title, show_header=False, title_justify="left")
            table.add_column(style="bold")
            table.add_column()
            for key, value in rows:
                table.add_row(key, value)
            self.out.print(table)
            lines = []
        else:
            lines = [title, *(f"  {key}: {value}" for key, value in rows)]
        if budget is not None:
            lines.append(f"  {budget.line}")
        lines.append(report)
        self.out.print("\n".join(lines), highlight=False, markup=False)


class StepHandle:
    """One progress task; `advance()` after each unit of work."""

    def __init__(self, progress: Progress | None, description: str, total: int | None) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=total) if progress is not None else None

    def advance(self, amount: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def grow(self, more: int) -> None:
        """`more` units to do than the total said so far."""
        if self._progress is not None and self._task is not None and more:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, total=(task.total or 0) + more)

    def done(self) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(
                self._task, completed=task.total if task.total is not None else 1, total=task.total or 1
            )

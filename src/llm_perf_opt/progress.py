"""Progress for long work (rich bars on a terminal, silence otherwise) and the one-screen summary at the end.

The bars go to stderr, the summary to stdout with the logs, so `stage1-run | tail -1` names the report."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

log = logging.getLogger("llm_perf_opt.progress")


class Feedback:
    """Progress bars on `stream` (stderr) and the final summary on `out` (stdout). Bars appear only on a terminal
    (logs carry the same events anyway); the summary is a table on a terminal, plain lines otherwise."""

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
            console=self.console,
            transient=False,
        )
        with self._progress:
            try:
                yield
            finally:
                self._progress = None

    @contextmanager
    def step(self, description: str, total: int | None = None) -> Iterator[StepHandle]:
        """A unit of work (model build, images x passes, a profiler pass, an Nsight tool); its wall time goes to the
        log (where a run's time went, without a terminal)."""
        handle = StepHandle(self._progress, description, total)
        started = time.perf_counter()
        try:
            yield handle
        finally:
            handle.done()
            log.info("step done in %.1f s: %s", time.perf_counter() - started, description)

    def summary(self, title: str, rows: Sequence[tuple[str, str]], report: str) -> None:
        """Key figures and where the report is (the last line): a table on a terminal, plain lines otherwise."""
        if self.out_interactive:
            table = Table(title=title, show_header=False, title_justify="left")
            table.add_column(style="bold")
            table.add_column()
            for key, value in rows:
                table.add_row(key, value)
            table.add_row("report", report)
            self.out.print(table)
            return
        lines = [title, *(f"  {key}: {value}" for key, value in rows), f"  report: {report}"]
        self.out.print("\n".join(lines), highlight=False, markup=False)


class StepHandle:
    """One progress task; `advance()` after each unit of work."""

    def __init__(self, progress: Progress | None, description: str, total: int | None) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=total) if progress is not None else None

    def advance(self, amount: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def done(self) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(
                self._task, completed=task.total if task.total is not None else 1, total=task.total or 1
            )

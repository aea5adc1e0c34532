"""Progress feedback: bars on a terminal, nothing but the summary when output is not a terminal."""

from __future__ import annotations

import io

import pytest
import torch
from rich.progress import Progress

from llm_perf_opt.progress import Feedback, RemainingColumn, duration_text
from llm_perf_opt.records.common import TimeBudget, TimePart

BUDGET = TimeBudget(total_s=12.0, parts=(TimePart("start", 3.0), TimePart("passes", 9.0)))


def test_non_terminal_output_shows_only_the_summary() -> None:
    bars, out = io.StringIO(), io.StringIO()  # not terminals
    feedback = Feedback(bars, out=out)
    assert not feedback.interactive
    with feedback.session(), feedback.step("images", total=3) as bar:
        for _ in range(3):
            bar.advance()
    assert bars.getvalue() == "" and out.getvalue() == ""
    feedback.summary("stage1-run x: complete", [("end to end (p50)", "886.4 ms")], "/runs/x/report.md", BUDGET)
    text = out.getvalue()
    assert text.splitlines() == [
        "stage1-run x: complete",
        "  end to end (p50): 886.4 ms",
        "  took 12 s: start 3, passes 9",
        "/runs/x/report.md",
    ]
    assert "\x1b[" not in text  # no terminal escape codes in logs
    assert bars.getvalue() == ""


def test_the_summary_goes_to_stdout_so_its_last_line_is_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """`stage1-run | tail -1` gives the report's bare path: the summary is printed on stdout, not on stderr."""
    Feedback().summary("stage1-run x: complete", [("end to end (p50)", "886.4 ms")], "/runs/x/report.md")
    printed = capsys.readouterr()
    assert printed.err == ""
    assert printed.out.splitlines()[-1] == "/runs/x/report.md"


def test_terminal_output_shows_progress_and_a_table() -> None:
    bars, out = io.StringIO(), io.StringIO()
    feedback = Feedback(bars, interactive=True, out=out)
    with feedback.session():
        with feedback.step("building model"):
            pass
        with feedback.step("images", total=2) as bar:
            bar.advance()
            bar.advance()
    shown = bars.getvalue()
    assert "building model" in shown and "images" in shown and "2/2" in shown
    feedback.summary("done", [("decode per token (p50)", "18.31 ms")], "/runs/x/report.md", BUDGET)
    lines = out.getvalue().splitlines()
    assert "decode per token (p50)" in out.getvalue()
    assert lines[-2:] == ["  took 12 s: start 3, passes 9", "/runs/x/report.md"]  # the table above them


def test_whatif_phases_and_rungs_show_done_of_total_elapsed_and_an_estimate() -> None:
    """The what-if's display: each phase a task, and a tally of the rungs over every phase whose total grows when
    the ladder is planned; a task with units done shows what is left at its mean time per unit so far."""
    bars, out = io.StringIO(), io.StringIO()
    feedback = Feedback(bars, interactive=True, out=out)
    with feedback.session(), feedback.tally("rungs (all phases)", total=1) as rungs:
        with feedback.step("the baseline", total=1, part="baseline") as phase:
            phase.advance()
            rungs.advance()
        rungs.grow(2)  # the ladder's rungs, planned once the levers ran
        with feedback.step("the ladder: 2 more rung(s)", total=2, part="ladder") as phase:
            for _ in range(2):
                phase.advance()
                rungs.advance()
    shown = bars.getvalue()
    assert "rungs (all phases)" in shown and "3/3" in shown and "the ladder: 2 more rung(s)" in shown
    assert [p.name for p in feedback.budget().parts] == ["start", "baseline", "ladder", "other"]


def test_the_estimate_is_the_units_left_at_the_mean_time_per_unit_so_far() -> None:
    now = [100.0]
    progress = Progress(get_time=lambda: now[0], auto_refresh=False, disable=True)
    task_id = progress.add_task("rungs", total=5)
    column = RemainingColumn()
    assert column.render(progress.tasks[task_id]).plain == ""  # nothing done yet: no estimate
    now[0] = 190.0
    progress.advance(task_id, 2)  # 2 rungs in 90 s: 45 s each, 3 left
    assert column.render(progress.tasks[task_id]).plain == "~2 min 15 s left"
    progress.advance(task_id, 3)
    assert column.render(progress.tasks[task_id]).plain == ""  # finished


def test_durations_read_in_seconds_minutes_and_hours() -> None:
    assert [duration_text(s) for s in (42.4, 185, 3720)] == ["42 s", "3 min 05 s", "1 h 02 min"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_job_device_without_a_gpu_is_auto() -> None:
    from llm_perf_opt.gpu_claim import job_device

    assert job_device() == "auto"

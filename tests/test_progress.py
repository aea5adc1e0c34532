"""Progress feedback: bars on a terminal, nothing but the summary when output is not a terminal."""

from __future__ import annotations

import io

import pytest
import torch

from llm_perf_opt.progress import Feedback


def test_non_terminal_output_shows_only_the_summary() -> None:
    bars, out = io.StringIO(), io.StringIO()  # not terminals
    feedback = Feedback(bars, out=out)
    assert not feedback.interactive
    with feedback.session(), feedback.step("images", total=3) as bar:
        for _ in range(3):
            bar.advance()
    assert bars.getvalue() == "" and out.getvalue() == ""
    feedback.summary("stage1-run x: complete", [("end to end (p50)", "886.4 ms")], "/runs/x/report.md")
    text = out.getvalue()
    assert text.splitlines() == [
        "stage1-run x: complete",
        "  end to end (p50): 886.4 ms",
        "  report: /runs/x/report.md",
    ]
    assert "\x1b[" not in text  # no terminal escape codes in logs
    assert bars.getvalue() == ""


def test_the_summary_goes_to_stdout_so_its_last_line_names_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """`stage1-run | tail -1` finds the report: the summary is printed on stdout with the logs, not on stderr."""
    Feedback().summary("stage1-run x: complete", [("end to end (p50)", "886.4 ms")], "/runs/x/report.md")
    printed = capsys.readouterr()
    assert printed.err == ""
    assert printed.out.splitlines()[-1] == "  report: /runs/x/report.md"


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
    feedback.summary("done", [("decode per token (p50)", "18.31 ms")], "/runs/x/report.md")
    assert "decode per token (p50)" in out.getvalue() and "/runs/x/report.md" in out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_job_device_without_a_gpu_is_auto() -> None:
    from llm_perf_opt.gpu_claim import job_device

    assert job_device() == "auto"

"""Progress feedback: bars on a terminal, nothing but the summary when output is not a terminal."""

from __future__ import annotations

import io

import pytest
import torch

from llm_perf_opt.progress import Feedback


def test_non_terminal_output_shows_only_the_summary() -> None:
    out = io.StringIO()  # not a terminal
    feedback = Feedback(out)
    assert not feedback.interactive
    with feedback.session(), feedback.step("images", total=3) as bar:
        for _ in range(3):
            bar.advance()
    assert out.getvalue() == ""
    feedback.summary("stage1-run x: complete", [("end to end (p50)", "886.4 ms")], "/runs/x/report.md")
    text = out.getvalue()
    assert text.splitlines() == [
        "stage1-run x: complete",
        "  end to end (p50): 886.4 ms",
        "  report: /runs/x/report.md",
    ]
    assert "\x1b[" not in text  # no terminal escape codes in logs


def test_terminal_output_shows_progress_and_a_table() -> None:
    out = io.StringIO()
    feedback = Feedback(out, interactive=True)
    with feedback.session():
        with feedback.step("building model"):
            pass
        with feedback.step("images", total=2) as bar:
            bar.advance()
            bar.advance()
    shown = out.getvalue()
    assert "building model" in shown and "images" in shown and "2/2" in shown
    feedback.summary("done", [("decode per token (p50)", "18.31 ms")], "/runs/x/report.md")
    assert "decode per token (p50)" in out.getvalue() and "/runs/x/report.md" in out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_job_device_without_a_gpu_is_auto() -> None:
    from llm_perf_opt.gpu_claim import job_device

    assert job_device() == "auto"

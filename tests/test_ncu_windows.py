"""The stage instances of Nsight Compute's profiler window (nsight/ncu_windows.py, instruments/profiler_window.py):
which prefill and decode step the workload brackets, and the kernels the nsys trace counted in them."""

from __future__ import annotations

import pytest
import torch

from llm_perf_opt.instruments.profiler_window import ProfilerWindow, middle_step
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.nsight.ncu_windows import BytesWindow, decode_bytes_window, prefill_bytes_window
from llm_perf_opt.records import vocabulary as vocab


def test_prefill_bytes_window_names_the_first_forward() -> None:
    assert prefill_bytes_window("prefill", [683, 690], 1) == BytesWindow("the prefill of the first image", 683)
    batch = prefill_bytes_window("vision/sam", [67, 73], 4)
    assert batch == BytesWindow("the vision/sam of the first batch (4 inputs)", 67)
    assert prefill_bytes_window("prefill", [], 1) == BytesWindow("the prefill of the first image", 0)


def test_decode_bytes_window_is_the_middle_step() -> None:
    assert decode_bytes_window([217, 216, 218], 4) == BytesWindow("decode step 2 of 3", 216)  # 3 steps: the second
    # 21 new tokens: step 10 of 20, past the trace's 3 steps: their mean (200) stands in
    assert decode_bytes_window([190, 200, 210], 21) == BytesWindow("decode step 10 of 20", 200)
    assert decode_bytes_window([217], 1).expected == 0 and decode_bytes_window([], 8).expected == 0
    assert (middle_step(3), middle_step(20), middle_step(1), middle_step(0)) == (1, 9, 0, None)


def _window(decode_steps: int, events: list[str]) -> ProfilerWindow:
    """A window whose cudaProfilerStart/Stop note themselves in `events`."""
    return ProfilerWindow(decode_steps, start=lambda: events.append("start"), stop=lambda: events.append("stop"))


def _pass(recorder: StageRecorder, steps: int, log: list[str]) -> None:
    """One pass's spans as the decode loop opens them, each noted in `log` when it begins."""
    with recorder.span(vocab.PREFILL):
        log.append("prefill")
        with recorder.span("vision/sam"):
            log.append("sam")
    with recorder.span(vocab.DECODE):
        for step in range(steps):
            with recorder.span(vocab.DECODE_STEP):
                log.append(f"step{step}")


@pytest.mark.parametrize(("steps", "inside"), [(3, ["prefill", "sam", "step1"]), (1, ["prefill", "sam", "step0"])])
def test_the_window_opens_around_the_first_prefill_and_the_middle_step_once(steps: int, inside: list[str]) -> None:
    events: list[str] = []  # one timeline: the window's calls between the spans they bracket
    window = _window(steps, events)
    recorder = StageRecorder(torch.device("cpu"), nvtx=False, window=window)
    _pass(recorder, steps, events)
    _pass(recorder, steps, events)  # a second pass runs outside the window
    opened = [i for i, e in enumerate(events) if e == "start"]
    closed = [i for i, e in enumerate(events) if e == "stop"]
    assert len(opened) == len(closed) == 2 and window.closed
    seen = [e for a, b in zip(opened, closed, strict=True) for e in events[a + 1 : b]]
    assert seen == inside


def test_a_pass_without_decode_steps_closes_after_its_prefill() -> None:
    events: list[str] = []
    window = _window(0, events)
    recorder = StageRecorder(torch.device("cpu"), nvtx=False, window=window)
    _pass(recorder, 0, [])
    _pass(recorder, 0, [])
    assert events == ["start", "stop"] and window.closed

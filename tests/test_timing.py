"""StageRecorder on the CPU: nesting, totals, order, misuse, and NVTX ranges without a GPU or a profiler."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from llm_perf_opt.instruments import nvtx_ranges, timing
from llm_perf_opt.instruments.timing import StageRecorder

CPU = torch.device("cpu")


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter for the timing module: every call advances 10 ms unless told otherwise."""
    state = {"now": 100.0, "step": 0.010}

    def perf_counter() -> float:
        state["now"] += state["step"]
        return state["now"]

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=perf_counter))
    return state


def test_cpu_recorder_uses_perf_counter() -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    assert not recorder.uses_cuda_events
    assert recorder.method == "time.perf_counter (CPU)"
    assert recorder.spans_ms() == []
    assert recorder.totals_ms() == {}


def test_nested_spans_in_start_order_with_exact_times(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    recorder.begin("prefill")  # t = 0
    recorder.begin("vision/sam")  # 10
    recorder.end("vision/sam")  # 20
    recorder.begin("vision/sam")  # 30
    recorder.end("vision/sam")  # 40
    recorder.end("prefill")  # 50
    with recorder.span("decode"), recorder.span("decode/step"):  # begins at 60 and 70
        pass  # decode/step ends at 80, decode at 90
    spans = recorder.spans_ms()
    assert [name for name, _ in spans] == ["prefill", "vision/sam", "vision/sam", "decode", "decode/step"]
    assert [ms for _, ms in spans] == pytest.approx([50.0, 10.0, 10.0, 30.0, 10.0])
    assert recorder.totals_ms() == pytest.approx(
        {"prefill": 50.0, "vision/sam": 20.0, "decode": 30.0, "decode/step": 10.0}
    )


def test_same_name_nesting_closes_the_innermost(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    recorder.begin("x")  # 0
    recorder.begin("x")  # 10
    recorder.end("x")  # 20: closes the inner span
    recorder.end("x")  # 30
    spans = recorder.spans_ms()
    assert [name for name, _ in spans] == ["x", "x"]
    assert [ms for _, ms in spans] == pytest.approx([30.0, 10.0])


def test_open_spans_are_left_out_until_closed(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    recorder.begin("prefill")
    recorder.begin("decode")
    recorder.end("decode")
    assert [name for name, _ in recorder.spans_ms()] == ["decode"]
    recorder.end("prefill")
    assert [name for name, _ in recorder.spans_ms()] == ["prefill", "decode"]


def test_real_clock_measures_elapsed_time() -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    with recorder.span("sleep"):
        time.sleep(0.02)
    ((name, ms),) = recorder.spans_ms()
    assert name == "sleep"
    assert 15.0 <= ms < 2000.0


def test_end_without_begin_raises() -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    with pytest.raises(RuntimeError, match="without a matching begin"):
        recorder.end("prefill")
    recorder.begin("prefill")
    recorder.end("prefill")
    with pytest.raises(RuntimeError, match=r"end\('prefill'\)"):
        recorder.end("prefill")  # already closed


def test_span_closes_on_exception(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    with pytest.raises(ValueError), recorder.span("prefill"):
        raise ValueError("boom")
    assert [name for name, _ in recorder.spans_ms()] == ["prefill"]


def test_reset_forgets_everything(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=False)
    recorder.begin("open")
    with recorder.span("closed"):
        pass
    recorder.reset()
    assert recorder.spans_ms() == []
    with pytest.raises(RuntimeError):
        recorder.end("open")


def test_nvtx_ranges_work_without_a_gpu_or_profiler(clock) -> None:
    recorder = StageRecorder(CPU, nvtx=True)
    with recorder.span("prefill"), recorder.span("vision/sam"):
        pass
    assert [name for name, _ in recorder.spans_ms()] == ["prefill", "vision/sam"]
    nvtx_ranges.push("preprocess")
    nvtx_ranges.pop()


def test_nvtx_push_pop_pair_with_spans(clock, monkeypatch) -> None:
    calls: list[tuple[str, str | None]] = []
    monkeypatch.setattr(nvtx_ranges, "push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(nvtx_ranges, "pop", lambda: calls.append(("pop", None)))
    recorder = StageRecorder(CPU, nvtx=True)
    with recorder.span("prefill"), recorder.span("vision/sam"):
        pass
    assert calls == [("push", "prefill"), ("push", "vision/sam"), ("pop", None), ("pop", None)]
    calls.clear()
    quiet = StageRecorder(CPU, nvtx=False)
    with quiet.span("prefill"):
        pass
    assert calls == []


def test_cuda_events_are_recorded_on_the_models_gpu_stream(monkeypatch) -> None:
    """On cuda:1 every event goes to cuda:1's current stream, never to the current device's (GPU 0's) stream;
    the final synchronisation is cuda:1's too. CUDA itself is faked: this runs on any machine."""
    streams = {index: SimpleNamespace(device_index=index) for index in (0, 1)}
    recorded: list[tuple[int, object]] = []
    synced: list[torch.device] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.at: float | None = None

        def record(self, stream=None) -> None:
            assert stream is not None, "recorded on the current device's stream (GPU 0), not the model's"
            recorded.append((stream.device_index, self))
            self.at = 10.0 * len(recorded)

        def elapsed_time(self, end: FakeEvent) -> float:
            assert self.at is not None and end.at is not None
            return end.at - self.at

    def current_stream(device=None):
        assert isinstance(device, torch.device), "current_stream() without a device is GPU 0's"
        return streams[device.index]

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    recorder = StageRecorder(torch.device("cuda", 1), nvtx=False)
    assert recorder.uses_cuda_events and recorder.method == "CUDA events (torch.cuda.Event)"
    with recorder.span("prefill"), recorder.span("vision/sam"):
        pass
    assert [index for index, _ in recorded] == [1, 1, 1, 1]
    assert recorder.spans_ms() == [("prefill", 30.0), ("vision/sam", 10.0)]
    assert synced == [torch.device("cuda", 1)]

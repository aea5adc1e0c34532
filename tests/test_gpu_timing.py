"""GPU timing on the model's device (`pytest -m gpu`): skips without CUDA; the cuda:1 test needs two GPUs."""

from __future__ import annotations

import time

import pytest
import torch

from llm_perf_opt.instruments.timing import StageRecorder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _time_unsynchronised_matmuls(device: torch.device) -> tuple[float, float, float]:
    """(event ms, host enqueue ms, wall ms to the end of the GPU work) of 40 chained 8192² bf16 matmuls on
    `device`, launched without any synchronisation inside the span."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) / 90.0
    for _ in range(3):  # warm-up: cuBLAS handles and workspaces on this device
        a = a @ a
    torch.cuda.synchronize(device)
    recorder = StageRecorder(device, nvtx=False)
    start = time.perf_counter()
    with recorder.span("work"):
        for _ in range(40):
            a = a @ a
    enqueue_ms = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize(device)
    wall_ms = (time.perf_counter() - start) * 1e3
    (span,) = recorder.spans_ms()
    return span[1], enqueue_ms, wall_ms


def _check(event_ms: float, enqueue_ms: float, wall_ms: float) -> None:
    # 40 x 1.1 TFLOP is tens of ms of GPU work; launching it takes well under a millisecond per matmul.
    assert event_ms > 5 * enqueue_ms, (event_ms, enqueue_ms)
    assert 0.5 * wall_ms < event_ms <= wall_ms * 1.05, (event_ms, wall_ms)


def test_events_time_gpu_work_on_cuda0() -> None:
    _check(*_time_unsynchronised_matmuls(torch.device("cuda", 0)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_events_time_gpu_work_on_cuda1_while_gpu0_is_current() -> None:
    """With GPU 0 current, events on GPU 0's stream would see an idle GPU and time the host's enqueue only."""
    assert torch.cuda.current_device() == 0
    event_ms, enqueue_ms, wall_ms = _time_unsynchronised_matmuls(torch.device("cuda", 1))
    assert torch.cuda.current_device() == 0  # the recorder did not move the current device
    _check(event_ms, enqueue_ms, wall_ms)

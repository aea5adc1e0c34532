"""Jobs sharing a process (a reused launcher worker): the second one starts from cleared compile state."""

from __future__ import annotations

import pytest
import torch

from llm_perf_opt.session import process_state


def test_only_a_reused_process_is_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    monkeypatch.setattr(process_state, "_jobs_started", 0)
    counters["frames"]["ok"] += 3  # what an earlier job's compilation left
    assert process_state.start_clean(torch.device("cpu")) is False
    assert counters["frames"]["ok"] >= 3  # the first job in a process changes nothing
    assert process_state.start_clean(torch.device("cpu")) is True
    assert counters["frames"]["ok"] == 0

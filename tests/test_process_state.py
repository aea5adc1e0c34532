"""Jobs sharing a process (a reused launcher worker): the second one starts from cleared compile state and keeps no
figure an earlier job could have touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.session import process_state


def test_only_a_reused_process_is_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    monkeypatch.setattr(process_state, "_jobs_started", 0)
    counters["frames"]["ok"] += 3  # what an earlier job's compilation left
    assert process_state.start_clean(torch.device("cpu")) is False
    assert counters["frames"]["ok"] >= 3  # the first job in a process changes nothing
    assert process_state.start_clean(torch.device("cpu")) is True
    assert counters["frames"]["ok"] == 0


def test_a_job_in_a_reused_process_keeps_no_first_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier job warmed what a first pass pays for: the run leaves its first passes out, and its host peak, and
    says why."""
    cfg = compose_config(
        "stage1",
        "model=deepseek_ocr2_tiny",
        "device=cpu",
        "run.repeats=1",
        "run.warmup=1",
        "infer.max_new_tokens=2",
        "pipeline.torch_profiler.enable=false",
        "pipeline.memory.enable=false",
        "pipeline.energy.enable=false",
    )
    monkeypatch.setattr(process_state, "_jobs_started", 1)  # one job ran in this process before
    Stage1Run(command_config(cfg), tmp_path / "run", run_id="second").execute()
    metrics = load_stage1(tmp_path / "run").metrics
    assert metrics.first_passes == () and metrics.host_peak_rss_bytes is None
    assert metrics.records  # the timed pass is kept
    assert any("so are the inputs' first passes" in w for w in metrics.warnings)

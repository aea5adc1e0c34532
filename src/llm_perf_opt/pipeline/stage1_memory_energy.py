"""Stage 1's memory pass and energy pass, after the timed passes (never timed): each measured, or the reason it
was not, into the run's measurements."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.measure.energy import EnergySettings, EnergyUnavailable, energy_pass
from llm_perf_opt.measure.memory import SNAPSHOT_FILE, MemorySettings, memory_pass
from llm_perf_opt.measure.stage1_analysis import Stage1Measurements
from llm_perf_opt.progress import Feedback
from llm_perf_opt.session.session import InferenceSession

log = logging.getLogger(__name__)


def measure_memory_and_energy(
    state: Stage1Measurements,
    session: InferenceSession,
    work: tuple[tuple[Path, ...], str, int],
    settings: tuple[MemorySettings, EnergySettings],
    feedback: Feedback,
    art: ArtifactsManager,
) -> None:
    """The memory and energy passes over `work` = (paths of the first input or batch, its key, new tokens); where
    one cannot run, the reason is recorded instead."""
    paths, key, new_tokens = work
    memory, energy = settings
    device = session.device.type
    if not memory.enable:
        state.memory_reason = "disabled (pipeline.memory.enable=false)"
    elif device != "cuda":
        state.memory_reason = f"not measured on {device}: the memory pass needs a CUDA GPU"
    else:
        _memory(state, session, work, memory, feedback, art)
    if not energy.enable:
        state.energy_reason = "disabled (pipeline.energy.enable=false)"
    elif device != "cuda":
        state.energy_reason = f"not measured on {device}: NVML measures NVIDIA GPUs only"
    else:
        try:
            with feedback.step("energy pass (NVML energy counter: idle, prefill, whole pass)"):
                state.energy = energy_pass(session, paths, key, new_tokens, energy)
        except EnergyUnavailable as exc:
            log.warning("energy not available: %s", exc.reason)
            state.energy_reason = exc.reason


def _memory(
    state: Stage1Measurements,
    session: InferenceSession,
    work: tuple[tuple[Path, ...], str, int],
    settings: MemorySettings,
    feedback: Feedback,
    art: ArtifactsManager,
) -> None:
    """The memory pass; its snapshot saved as memory/snapshot.pickle. A pass that fails (out of memory, an allocator
    refusing the history) is recorded as not available, after the timed passes it cannot spoil."""
    try:
        with feedback.step("memory pass (allocator peaks per stage, snapshot)"):
            outcome = memory_pass(session, *work, settings)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        log.warning("memory pass failed: %s: %s", type(exc).__name__, exc)
        state.memory_reason = f"the memory pass failed: {type(exc).__name__}: {exc}"
        return
    state.memory = outcome.measured
    if outcome.snapshot is not None:
        art.path(SNAPSHOT_FILE).write_bytes(outcome.snapshot)
        art.record(SNAPSHOT_FILE)

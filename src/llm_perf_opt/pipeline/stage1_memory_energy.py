"""Stage 1's memory pass and energy pass, after the timed passes (never timed): each measured, or the reason it
was not, into the run's measurements. The energy pass runs in two parts: its loops before the profiled pass, its
idle window over the profiler's CPU-only post-processing (`MemoryAndEnergy.idle_during`), so idle power costs no time
of its own."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_schema import EnergySchema, MemorySchema
from llm_perf_opt.instruments.energy import EnergyMeter, EnergyUnavailable
from llm_perf_opt.instruments.memory import SNAPSHOT_FILE, memory_pass
from llm_perf_opt.measure.stage1_analysis import Stage1Measurements
from llm_perf_opt.progress import Feedback
from llm_perf_opt.session.session import InferenceSession

log = logging.getLogger(__name__)

Work = tuple[tuple[Path, ...], str, int]  # paths of the first input or batch, its key, new tokens


class MemoryAndEnergy:
    """The memory pass and the energy pass over `work` for one Stage 1 run: `measure()` after the timed passes,
    `idle_during()` around CPU-only work that follows (the GPU idle), `finish()` at the end (`close()` always)."""

    def __init__(
        self,
        state: Stage1Measurements,
        session: InferenceSession,
        work: Work,
        settings: tuple[MemorySchema, EnergySchema],
        feedback: Feedback,
    ) -> None:
        self.state, self.session, self.work, self.feedback = state, session, work, feedback
        self.memory, self.energy = settings
        self.meter: EnergyMeter | None = None

    def measure(self, art: ArtifactsManager) -> None:
        """The memory pass, then the energy loops; where one cannot run, the reason is recorded instead."""
        device = self.session.device.type
        if not self.memory.enable:
            self.state.memory_reason = "disabled (pipeline.memory.enable=false)"
        elif device != "cuda":
            self.state.memory_reason = f"not measured on {device}: the memory pass needs a CUDA GPU"
        else:
            self._memory(art)
        if not self.energy.enable:
            self.state.energy_reason = "disabled (pipeline.energy.enable=false)"
        elif device != "cuda":
            self.state.energy_reason = f"not measured on {device}: NVML measures NVIDIA GPUs only"
        else:
            paths, _, new_tokens = self.work
            try:
                what = "energy pass (NVML energy counter: prefill-only loop, decode-only loop)"
                with self.feedback.step(what, part="energy"):
                    self.meter = EnergyMeter.open(self.session.device, self.energy)
                    self.meter.loops(self.session, paths, new_tokens)
            except EnergyUnavailable as exc:
                self._unavailable(exc)

    @property
    def measures_idle(self) -> bool:
        """The energy pass ran its loops and still needs its idle window (`idle_during` or `finish`)."""
        return self.meter is not None

    @contextlib.contextmanager
    def idle_during(self, what: str) -> Iterator[None]:
        """The energy pass's idle window over the block (CPU-only work), when the energy loops ran."""
        with contextlib.nullcontext() if self.meter is None else self.meter.idle_during(what):
            yield

    def finish(self) -> None:
        """The energy pass's record (idle power over a sleep where no block measured it)."""
        if self.meter is None:
            return
        paths, key, new_tokens = self.work
        try:
            self.state.energy = self.meter.finish(key, len(paths), new_tokens)
        except EnergyUnavailable as exc:
            self._unavailable(exc)
        finally:
            self.meter = None

    def close(self) -> None:
        """Release NVML when the run ends before `finish`."""
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    def _unavailable(self, exc: EnergyUnavailable) -> None:
        log.warning("energy not available: %s", exc.reason)
        self.state.energy_reason = exc.reason
        self.close()

    def _memory(self, art: ArtifactsManager) -> None:
        """The memory pass; its snapshot saved as memory/snapshot.pickle. A pass that fails (out of memory, an
        allocator refusing the history) is recorded as not available, after the timed passes it cannot spoil."""
        try:
            with self.feedback.step("memory pass (allocator peaks per stage, snapshot)", part="memory"):
                outcome = memory_pass(self.session, *self.work, self.memory)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            log.warning("memory pass failed: %s: %s", type(exc).__name__, exc)
            self.state.memory_reason = f"the memory pass failed: {type(exc).__name__}: {exc}"
            return
        self.state.memory = outcome.measured
        if outcome.snapshot is not None:
            art.path(SNAPSHOT_FILE).write_bytes(outcome.snapshot)
            art.record(SNAPSHOT_FILE)

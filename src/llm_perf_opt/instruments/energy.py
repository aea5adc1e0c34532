"""The energy pass: the GPU's cumulative energy counter (NVML `nvmlDeviceGetTotalEnergyConsumption`, mJ) read
around work repeated long enough to measure, and around time the GPU sits idle.

The counter moves about every 100 ms and one read costs a few ms, so each window repeats its work for about
`pipeline.energy.loop_seconds` (`config_schema.EnergySchema`) and is refused below `MIN_WINDOW_S` (10 counter
updates). Idle power costs no time of its own where the run has CPU-only work to do anyway
(`EnergyMeter.idle_during`: the profiler's post-processing); otherwise it is a sleep. Whatever stops a figure (no
`pynvml`, no GPU, NVML refusing, a counter that does not move or goes backwards, a window too short) raises
`EnergyUnavailable` with the reason; the pipeline records it as "not available: <reason>".
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch

from llm_perf_opt.config_schema import EnergySchema
from llm_perf_opt.instruments.measured_session import DecodeNotRepeatable, MeasuredSession, P
from llm_perf_opt.instruments.timing import NullRecorder
from llm_perf_opt.records.memory import IDLE_SLEEP, EnergyPass, EnergyWindow

log = logging.getLogger("llm_perf_opt.energy")
COUNTER_PERIOD_S = 0.1  # the energy counter's update period (about)
MIN_WINDOW_S = 10 * COUNTER_PERIOD_S
WINDOW_SETTING = {"idle": "idle_seconds", "prefill": "prefill_seconds"}  # sizes the window (else loop_seconds)


class CompiledShapes(Protocol):
    """What the energy pass reads of a session's runtime settings (`session.runtime.RuntimeSettings`)."""

    @property
    def compiles_prefill(self) -> bool: ...

    @property
    def static_cache_len(self) -> int | None: ...


class EnergyCounter(Protocol):
    """A GPU's energy counter (`NvmlCounter`, or a fake in tests)."""

    def read_mj(self) -> int:
        """The energy used since the driver loaded, in millijoules."""


class EnergySession(MeasuredSession[P], Protocol[P]):
    """What `EnergyMeter.loops` drives (`session.session.InferenceSession`): passes, and their decode steps again."""

    @property
    def runtime(self) -> CompiledShapes: ...

    def repeat_decode(self, repeater: Callable[[Callable[[], None]], None]) -> AbstractContextManager[None]:
        """Within the block, `repeater` gets each pass's decode section to run again over the same prompt; a pass
        whose KV cache cannot rewind raises DecodeNotRepeatable."""


class EnergyUnavailable(Exception):
    """Energy cannot be measured here; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def load_nvml() -> ModuleType:
    """The `pynvml` module of nvidia-ml-py, or EnergyUnavailable."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise EnergyUnavailable(
            f"pynvml is not installed ({exc}); pip install nvidia-ml-py (the `gpu` extra)"
        ) from None


class NvmlCounter:
    """The energy counter of one GPU through NVML."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.error = getattr(nvml, "NVMLError", RuntimeError)  # what NVML's calls raise

    @classmethod
    def open(cls, nvml: Any, device: torch.device) -> NvmlCounter:
        """Initialise NVML and find `device`'s handle (by UUID, else PCI bus id, else index)."""
        error = getattr(nvml, "NVMLError", RuntimeError)
        try:
            nvml.nvmlInit()
            counter = cls(nvml, gpu_handle(nvml, device))
            counter.read_mj()
        except error as exc:
            raise EnergyUnavailable(f"NVML refused: {exc}") from None
        return counter

    def read_mj(self) -> int:
        """The counter now (mJ since the driver loaded)."""
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.error as exc:
            raise EnergyUnavailable(f"NVML refused the energy counter: {exc}") from None

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.error as exc:
            raise EnergyUnavailable(f"NVML shutdown failed: {exc}") from None


def gpu_handle(nvml: Any, device: torch.device) -> Any:
    """NVML's handle of torch's `device` (CUDA_VISIBLE_DEVICES renumbers torch's devices, not NVML's): by UUID,
    else by PCI bus id, else by index (only where nothing renumbers). Strings go to pynvml as bytes, which every
    nvidia-ml-py release takes."""
    error = getattr(nvml, "NVMLError", RuntimeError)
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(
                (text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}").encode()
            )
        except error as exc:  # a MIG slice or an older driver: the PCI bus id below
            log.info("NVML does not know %s (%s): finding the GPU by its PCI bus id", text, exc)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, dev = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        return nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{dev:02X}.0".encode())
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        raise EnergyUnavailable("cannot tell torch's GPU among NVML's (no UUID or PCI id; CUDA_VISIBLE_DEVICES set)")
    return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)


def next_update(
    counter: EnergyCounter, clock: Callable[[], float], limit_s: float = 2 * COUNTER_PERIOD_S
) -> tuple[int, float]:
    """Read the counter until it moves (at most `limit_s`): its new value and the time it was read, so that a window
    opens and closes on the counter's own updates instead of up to a period away from them. A counter that does not
    move within the limit gives its last value (the window's checks then say why)."""
    first = counter.read_mj()
    deadline = clock() + limit_s
    value = first
    while value == first and clock() < deadline:
        value = counter.read_mj()
    return value, clock()


def window(
    counter: EnergyCounter,
    what: str,
    work: Callable[[], None],
    min_seconds: float,
    *,
    clock: Callable[[], float] = time.perf_counter,
    idle: bool = False,
) -> EnergyWindow:
    """Repeat `work` (which ends synchronised with the device) for about `min_seconds` (it stops at the repetition
    that ends nearest to it, once MIN_WINDOW_S have passed), between two updates of the counter: the window opens on
    an update, and after the work it waits for the next one (that wait, `tail_seconds`, is idle time the analysis
    takes off at idle power; none for an `idle` window). EnergyUnavailable for a window shorter than MIN_WINDOW_S, a
    counter that did not move (stalled or unsupported) or went backwards (wrapped or reset)."""
    start_mj, start = next_update(counter, clock)
    iterations = 0
    while True:
        work()
        iterations += 1
        elapsed = clock() - start
        if elapsed >= MIN_WINDOW_S and elapsed + elapsed / iterations / 2 >= min_seconds:
            break
    work_end = clock()
    return _closed(counter, what, (start_mj, start), work_end, iterations, clock, idle=idle)


def _closed(
    counter: EnergyCounter,
    what: str,
    opened: tuple[int, float],
    work_end: float,
    iterations: int,
    clock: Callable[[], float],
    *,
    idle: bool,
) -> EnergyWindow:
    """Close the window `opened` = (counter, time) on the counter's next update after `work_end`, checked."""
    start_mj, start = opened
    end_mj, end = next_update(counter, clock)
    seconds = end - start
    delta = end_mj - start_mj
    if work_end - start < MIN_WINDOW_S:
        setting = WINDOW_SETTING.get(what, "loop_seconds")
        raise EnergyUnavailable(
            f"the {what} window lasted {work_end - start:.3f} s, shorter than {MIN_WINDOW_S:.1f} s (10 updates of "
            f"the ~{COUNTER_PERIOD_S * 1e3:.0f} ms counter): raise pipeline.energy.{setting}"
        )
    if delta < 0:
        raise EnergyUnavailable(
            f"the energy counter went backwards by {-delta} mJ over the {what} window (wrapped or reset)"
        )
    if delta == 0:
        raise EnergyUnavailable(
            f"the energy counter did not move over {seconds:.2f} s of {what} (stalled or unsupported)"
        )
    tail = 0.0 if idle else end - work_end
    return EnergyWindow(what=what, iterations=iterations, seconds=seconds, millijoules=delta, tail_seconds=tail)


def idle_window(
    counter: EnergyCounter, seconds: float, *, sleep: Callable[[float], None] = time.sleep, **kw: Any
) -> EnergyWindow:
    """The counter over `seconds` of sleep (the device idle)."""
    return window(counter, "idle", lambda: sleep(COUNTER_PERIOD_S), seconds, idle=True, **kw)


class EnergyMeter:
    """The energy pass in parts: `loops` over the model's work, then idle power over CPU-only work the run does
    anyway (`idle_during`), else over a sleep (`finish`). Owns the NVML counter until `finish` or `close`."""

    def __init__(
        self,
        counter: Any,
        settings: EnergySchema,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.counter, self.settings, self.clock, self.sleep = counter, settings, clock, sleep
        self.prefill: EnergyWindow | None = None
        self.prefill_note: str | None = None
        self.whole: EnergyWindow | None = None
        self.decode: EnergyWindow | None = None
        self.decode_note: str | None = None  # why the decode-only loop did not run
        self.idle: EnergyWindow | None = None
        self.idle_source = IDLE_SLEEP
        self.idle_refused: str | None = None  # why the idle window over CPU work could not be used

    @classmethod
    def open(cls, device: torch.device, settings: EnergySchema) -> EnergyMeter:
        """The meter of `device`'s counter; EnergyUnavailable when NVML cannot measure."""
        return cls(NvmlCounter.open(load_nvml(), device), settings)

    def loops(self, session: EnergySession[P], paths: Sequence[Path], new_tokens: int) -> None:
        """A prefill-only loop (unless it would compile a new shape) and a decode-only loop (the decode steps of one
        pass over `paths`, one input or a batch, repeated with the KV cache rewound to the prompt); a whole-pass loop
        where either cannot run. Each repetition ends with a device synchronisation."""
        prepared = [session.prepare(path) for path in paths]
        device = session.device

        def synced(work: Callable[[], object]) -> Callable[[], None]:
            def once() -> None:
                work()
                torch.cuda.synchronize(device)

            return once

        def run(tokens: int) -> Callable[[], None]:
            return synced(lambda: session.generate_batch(prepared, tokens, NullRecorder(device)))

        def decode_loop(section: Callable[[], None]) -> None:
            torch.cuda.synchronize(device)
            self.decode = self._window("decode", synced(section), self.settings.loop_seconds)

        torch.cuda.synchronize(device)
        try:
            self.prefill_note = prefill_blocker(session)
            if self.prefill_note is None:
                self.prefill = self._window("prefill", run(1), self.settings.prefill_seconds)
            if new_tokens < 2:
                self.decode_note = "one new token per pass: no decode step"
            else:
                try:
                    with session.repeat_decode(decode_loop):
                        run(new_tokens)()
                except DecodeNotRepeatable as exc:
                    self.decode_note = f"the decode steps cannot be repeated alone: {exc.reason}"
            if self._needs_whole(new_tokens):
                self.whole = self._window("pass", run(new_tokens), self.settings.loop_seconds)
        finally:
            if session.routing is not None:
                session.routing.begin_pass()  # forget the loops' routing

    def _needs_whole(self, new_tokens: int) -> bool:
        """Whether the pass's figures need a whole-pass loop: the prefill-only loop did not run, or the decode-only
        loop did not where the pass decodes."""
        return self.prefill is None or (self.decode is None and new_tokens > 1)

    def _window(self, what: str, work: Callable[[], None], seconds: float) -> EnergyWindow:
        return window(self.counter, what, work, seconds, clock=self.clock)

    @contextmanager
    def idle_during(self, what: str) -> Iterator[None]:
        """Idle power over the block, which must leave the GPU idle (CPU-only work), padded with a sleep to
        `idle_seconds`. A counter that refuses here is kept as the reason (`finish` then sleeps); it never
        interrupts the block."""
        try:
            opened = next_update(self.counter, self.clock)
        except EnergyUnavailable as exc:
            self.idle_refused = exc.reason
            yield
            return
        yield
        rest = opened[1] + self.settings.idle_seconds - self.clock()
        if rest > 0:
            self.sleep(rest)
        try:
            self.idle = _closed(self.counter, "idle", opened, self.clock(), 1, self.clock, idle=True)
            self.idle_source = what
        except EnergyUnavailable as exc:
            log.info("idle power over %s not measured (%s): a sleep instead", what, exc.reason)
            self.idle_refused = exc.reason

    def finish(self, key: str, pages: int, new_tokens: int) -> EnergyPass:
        """The pass's record (a sleep measures idle power where `idle_during` did not); closes the counter."""
        try:
            if self.whole is None and self._needs_whole(new_tokens):
                raise EnergyUnavailable("the energy loops did not run")
            if self.idle is None:
                self.idle = idle_window(self.counter, self.settings.idle_seconds, sleep=self.sleep, clock=self.clock)
        finally:
            self.close()
        return EnergyPass(
            input=key,
            pages=pages,
            new_tokens=new_tokens,
            idle=self.idle,
            whole=self.whole,
            prefill=self.prefill,
            prefill_note=self.prefill_note,
            idle_source=self.idle_source,
            decode=self.decode,
            decode_note=self.decode_note,
        )

    def close(self) -> None:
        """Shut NVML down (once); a failure is logged, never raised over the run's figures."""
        counter, self.counter = self.counter, None
        if counter is None:
            return
        try:
            counter.close()
        except EnergyUnavailable as exc:
            log.warning("%s", exc.reason)


def prefill_blocker(session: EnergySession[P]) -> str | None:
    """Why a prefill-only loop (one new token) would not measure the timed prefill, or None: a compiled prefill on a
    static cache sized per pass would compile (and capture) a new shape."""
    runtime = session.runtime
    if runtime.compiles_prefill and runtime.static_cache_len is None:
        return (
            "a prefill-only loop would compile a new shape (runtime.compile=prefill_decode with a static cache sized "
            "per pass; set runtime.static_cache_len to split prefill from decode)"
        )
    return None

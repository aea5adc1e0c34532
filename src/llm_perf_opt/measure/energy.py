"""The energy pass: the GPU's cumulative energy counter (NVML `nvmlDeviceGetTotalEnergyConsumption`, mJ) read
around work repeated long enough to measure, and around an idle sleep before it.

The counter moves about every 100 ms and one read costs a few ms, so each window repeats its work for at least
`EnergySettings.loop_seconds` and is refused below `MIN_WINDOW_S` (10 counter updates). Whatever stops a figure
(no `pynvml`, no GPU, NVML refusing, a counter that does not move or goes backwards, a window too short) raises
`EnergyUnavailable` with the reason; the pipeline records it as "not available: <reason>".
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs
import torch

from llm_perf_opt.measure.timing import NullRecorder
from llm_perf_opt.records.memory import EnergyPass, EnergyWindow

if TYPE_CHECKING:
    from llm_perf_opt.session.session import InferenceSession

log = logging.getLogger("llm_perf_opt.energy")
COUNTER_PERIOD_S = 0.1  # the energy counter's update period (about)
MIN_WINDOW_S = 10 * COUNTER_PERIOD_S
METHOD = (
    "NVML total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ); each loop opens and closes on an update "
    "of the counter (the wait after the loop's last device synchronisation taken off at idle power); idle power "
    "from the counter over a sleep before the loops"
)


class EnergyUnavailable(Exception):
    """Energy cannot be measured here; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class EnergySettings:
    """`pipeline.energy`: the energy pass (CUDA and pynvml only)."""

    enable: bool = True
    loop_seconds: float = 2.0  # each loop repeats its work at least this long
    idle_seconds: float = 1.0  # the idle window before the loops


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
        self.nvml = nvml
        self.handle = handle

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
        error = getattr(self.nvml, "NVMLError", RuntimeError)
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except error as exc:
            raise EnergyUnavailable(f"NVML refused the energy counter: {exc}") from None

    def close(self) -> None:
        error = getattr(self.nvml, "NVMLError", RuntimeError)
        try:
            self.nvml.nvmlShutdown()
        except error as exc:
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


def next_update(counter: Any, clock: Callable[[], float], limit_s: float = 2 * COUNTER_PERIOD_S) -> tuple[int, float]:
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
    counter: Any,
    what: str,
    work: Callable[[], None],
    min_seconds: float,
    *,
    clock: Callable[[], float] = time.perf_counter,
    idle: bool = False,
) -> EnergyWindow:
    """Repeat `work` (which ends synchronised with the device) until `min_seconds` have passed, between two updates
    of the counter: the window opens on an update, and after the work it waits for the next one (that wait,
    `tail_seconds`, is idle time the analysis takes off at idle power; none for an `idle` window). EnergyUnavailable
    for a window shorter than MIN_WINDOW_S, a counter that did not move (stalled or unsupported) or went backwards
    (wrapped or reset)."""
    start_mj, start = next_update(counter, clock)
    iterations = 0
    while True:
        work()
        iterations += 1
        if clock() - start >= min_seconds:
            break
    work_end = clock()
    end_mj, end = next_update(counter, clock)
    seconds = end - start
    delta = end_mj - start_mj
    if work_end - start < MIN_WINDOW_S:
        raise EnergyUnavailable(
            f"the {what} window lasted {work_end - start:.3f} s, shorter than {MIN_WINDOW_S:.1f} s (10 updates of "
            f"the ~{COUNTER_PERIOD_S * 1e3:.0f} ms counter): raise pipeline.energy.loop_seconds"
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
    counter: Any, seconds: float, *, sleep: Callable[[float], None] = time.sleep, **kw: Any
) -> EnergyWindow:
    """The counter over `seconds` of sleep (the device idle)."""
    return window(counter, "idle", lambda: sleep(COUNTER_PERIOD_S), seconds, idle=True, **kw)


def energy_pass(
    session: InferenceSession, paths: Sequence[Path], key: str, new_tokens: int, settings: EnergySettings
) -> EnergyPass:
    """Idle, then a prefill-only loop (unless it would compile a new shape) and a whole-pass loop over `paths`
    (one input or a batch), after each repetition a device synchronisation. CUDA only; EnergyUnavailable when NVML
    cannot measure."""
    counter = NvmlCounter.open(load_nvml(), session.device)
    try:
        prepared = [session.prepare(path) for path in paths]
        device = session.device

        def run(tokens: int) -> Callable[[], None]:
            def once() -> None:
                session.generate_batch(prepared, tokens, NullRecorder(device))
                torch.cuda.synchronize(device)

            return once

        torch.cuda.synchronize(device)
        idle = idle_window(counter, settings.idle_seconds)
        prefill, note = None, prefill_blocker(session)
        if note is None:
            prefill = window(counter, "prefill", run(1), settings.loop_seconds)
        whole = window(counter, "pass", run(new_tokens), settings.loop_seconds)
    finally:
        if session.routing is not None:
            session.routing.begin_pass()  # forget the loops' routing
        counter.close()
    return EnergyPass(
        input=key,
        pages=len(paths),
        new_tokens=new_tokens,
        idle=idle,
        whole=whole,
        prefill=prefill,
        prefill_note=note,
    )


def prefill_blocker(session: InferenceSession) -> str | None:
    """Why a prefill-only loop (one new token) would not measure the timed prefill, or None: a compiled prefill on a
    static cache sized per pass would compile (and capture) a new shape."""
    runtime = session.runtime
    if runtime.compiles_prefill and runtime.static_cache_len is None:
        return (
            "a prefill-only loop would compile a new shape (runtime.compile=prefill_decode with a static cache sized "
            "per pass; set runtime.static_cache_len to split prefill from decode)"
        )
    return None

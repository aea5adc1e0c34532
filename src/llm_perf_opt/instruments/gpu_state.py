"""The GPU's clock and power state when a run starts (for env.json): steady numbers need steady clocks, so a
run says what the clocks were (current and maximum SM and memory clocks, application clocks, performance state,
persistence mode, temperature, power limit). Read through NVML (`pynvml`); without it, or where NVML refuses,
the reason is recorded instead of figures."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llm_perf_opt.instruments.energy import EnergyUnavailable, gpu_handle, load_nvml


def _reading(read: Callable[[], object], error: type[BaseException]) -> object:
    """One NVML query, or None where this GPU or driver does not support it."""
    try:
        return read()
    except error:
        return None


def clock_state(device: torch.device) -> dict[str, object]:
    """The clock and power state of `device`, or {"unavailable": reason}."""
    if device.type != "cuda":
        return {"unavailable": f"not a CUDA device ({device.type})"}
    try:
        nvml = load_nvml()
    except EnergyUnavailable as exc:
        return {"unavailable": exc.reason}
    error = getattr(nvml, "NVMLError", RuntimeError)
    try:
        nvml.nvmlInit()
        handle = gpu_handle(nvml, device)
    except (error, EnergyUnavailable) as exc:
        return {"unavailable": f"NVML refused: {exc}"}
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    queries: dict[str, Callable[[], object]] = {
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, sm),
        "memory_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, mem),
        "max_sm_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm),
        "max_memory_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, mem),
        "applications_sm_clock_mhz": lambda: nvml.nvmlDeviceGetApplicationsClock(handle, sm),
        "performance_state": lambda: nvml.nvmlDeviceGetPerformanceState(handle),
        "persistence_mode": lambda: bool(nvml.nvmlDeviceGetPersistenceMode(handle)),
        "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
    }
    state = {name: _reading(query, error) for name, query in queries.items()}
    state["source"] = "NVML (nvidia-ml-py), read when the run started"
    return state

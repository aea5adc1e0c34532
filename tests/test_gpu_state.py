"""env.json's GPU clock state: read through NVML, one figure None where the GPU does not support its query, and the
reason instead of figures without NVML or off the GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from llm_perf_opt.instruments import gpu_state
from llm_perf_opt.instruments.energy import EnergyUnavailable


class _NvmlError(Exception):
    pass


def _fake_nvml() -> Any:
    def unsupported(*_: Any) -> Any:
        raise _NvmlError("Not Supported")

    return SimpleNamespace(
        NVMLError=_NvmlError,
        NVML_CLOCK_SM=0,
        NVML_CLOCK_MEM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 0 else 2619,
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980 if kind == 0 else 2619,
        nvmlDeviceGetApplicationsClock=unsupported,
        nvmlDeviceGetPerformanceState=lambda h: 0,
        nvmlDeviceGetPersistenceMode=lambda h: 1,
        nvmlDeviceGetTemperature=lambda h, sensor: 41,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
    )


def test_the_clock_state_is_read_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_state, "load_nvml", _fake_nvml)
    monkeypatch.setattr(gpu_state, "gpu_handle", lambda nvml, device: "handle")
    state = gpu_state.clock_state(torch.device("cuda", 0))
    assert state["sm_clock_mhz"] == 1980 and state["max_memory_clock_mhz"] == 2619
    assert state["applications_sm_clock_mhz"] is None  # not supported here: no figure, no failure
    assert state["persistence_mode"] is True and state["power_limit_w"] == 700.0 and "NVML" in state["source"]


def test_without_nvml_or_off_the_gpu_the_reason_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "not a CUDA device" in gpu_state.clock_state(torch.device("cpu"))["unavailable"]

    def missing() -> Any:
        raise EnergyUnavailable("pynvml is not installed")

    monkeypatch.setattr(gpu_state, "load_nvml", missing)
    assert gpu_state.clock_state(torch.device("cuda", 0)) == {"unavailable": "pynvml is not installed"}
    refusing = _fake_nvml()
    refusing.nvmlInit = lambda: (_ for _ in ()).throw(_NvmlError("Insufficient Permissions"))
    monkeypatch.setattr(gpu_state, "load_nvml", lambda: refusing)
    assert "Insufficient Permissions" in gpu_state.clock_state(torch.device("cuda", 0))["unavailable"]

"""The software and hardware a run used (`env.json`)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown (nvidia-smi failed: {exc})"
    if done.returncode != 0:
        return f"unknown (nvidia-smi exit {done.returncode})"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def _version(module: str) -> str | None:
    try:
        return version(module)
    except PackageNotFoundError:
        return None


def collect_env(device: torch.device, gpu_state: dict[str, object] | None = None) -> dict[str, object]:
    """A JSON-ready description of the machine and software stack (`gpu_state`: the GPU's clocks and power state,
    read by the pipeline through `instruments.gpu_state`)."""
    gpu: dict[str, object] | None = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {
            "name": props.name,
            "index": device.index,
            "memory_bytes": int(props.total_memory),
            "multiprocessors": int(props.multi_processor_count),
            "compute_capability": f"{props.major}.{props.minor}",
            "driver": _nvidia_driver(),
            "visible_devices": torch.cuda.device_count(),
            "clocks": gpu_state,
        }
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count()},
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch_threads": torch.get_num_threads(),
        "transformers": _version("transformers"),
        "hydra_core": _version("hydra-core"),
        "nvtx": _version("nvtx"),
        "llm_perf_opt": _version("llm-perf-opt"),
        "gpu": gpu,
        "env_vars": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS") if k in os.environ},
    }

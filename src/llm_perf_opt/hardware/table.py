"""Peak compute and memory bandwidth per GPU, each figure with its source, from ``gpus.yaml`` next to this module
(dense tensor-core TFLOP/s per dtype, GB/s). MFU and MBU divide by these peaks, so a peak is either right and
sourced or absent (``None``: callers print n/a and point at ``hardware.peak_tflops`` / ``peak_bandwidth_gbps``).
"""

from __future__ import annotations

import functools
import math
import re
import types
from collections.abc import Mapping
from importlib import resources

import attrs
import yaml

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.vocabulary import canonical_dtype

DTYPE_KEYS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""Keys allowed in ``dense_tflops``."""

_DTYPE_LABEL: Mapping[str, str] = {
    "fp32": "FP32 (non-tensor-core)",
    "tf32": "TF32 tensor core",
    "bf16": "BF16 tensor core",
    "fp16": "FP16 tensor core",
    "fp8": "FP8 tensor core",
}

# A MIG slice reports e.g. "NVIDIA A100-SXM4-80GB MIG 3g.40gb": a fraction of the GPU, so no full-GPU peak
# applies to it.
_MIG_RE = re.compile(r"\bMIG\b", re.IGNORECASE)


def _frozen_mapping(value: Mapping[str, float]) -> Mapping[str, float]:
    return types.MappingProxyType(dict(value))


@attrs.frozen
class GpuSpec:
    """One row of the GPU table: dense peaks by dtype key, memory and bandwidth, with sources."""

    key: str
    display_name: str
    match: tuple[str, ...]
    dense_tflops: Mapping[str, float] = attrs.field(converter=_frozen_mapping, hash=False)
    memory_gb: float
    bandwidth_gbps: float
    sources: tuple[str, ...]
    note: str = ""


def _positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"gpus.yaml: {what} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"gpus.yaml: {what} must be finite and > 0, got {value!r}")
    return float(value)


def _parse_entry(raw: object, index: int) -> GpuSpec:
    if not isinstance(raw, dict):
        raise ValueError(f"gpus.yaml: entry {index} is not a mapping")
    required = {"key", "display_name", "match", "dense_tflops", "memory_gb", "bandwidth_gbps", "sources"}
    missing = required - raw.keys()
    unknown = raw.keys() - required - {"note"}
    if missing or unknown:
        raise ValueError(f"gpus.yaml: entry {index}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    key = str(raw["key"])
    match = raw["match"]
    if not isinstance(match, list) or not match or not all(isinstance(m, str) for m in match):
        raise ValueError(f"gpus.yaml: {key}: match must be a non-empty list of strings")
    for pattern in match:
        re.compile(pattern)  # fail on load, not on first lookup
    tflops = raw["dense_tflops"]
    if not isinstance(tflops, dict) or not tflops:
        raise ValueError(f"gpus.yaml: {key}: dense_tflops must be a non-empty mapping")
    if bad := set(tflops) - set(DTYPE_KEYS):
        raise ValueError(f"gpus.yaml: {key}: unknown dtype keys {sorted(bad)}; allowed {list(DTYPE_KEYS)}")
    sources = raw["sources"]
    if not isinstance(sources, list) or not sources or not all(str(u).startswith("https://") for u in sources):
        raise ValueError(f"gpus.yaml: {key}: sources must be a non-empty list of https:// URLs")
    return GpuSpec(
        key=key,
        display_name=str(raw["display_name"]),
        match=tuple(match),
        dense_tflops={k: _positive(v, f"{key}.dense_tflops.{k}") for k, v in tflops.items()},
        memory_gb=_positive(raw["memory_gb"], f"{key}.memory_gb"),
        bandwidth_gbps=_positive(raw["bandwidth_gbps"], f"{key}.bandwidth_gbps"),
        sources=tuple(str(s) for s in sources),
        note=str(raw.get("note") or "").strip(),
    )


@functools.cache
def load_gpu_table() -> tuple[GpuSpec, ...]:
    """Read and validate the packaged ``gpus.yaml`` (cached); order is match priority."""
    text = resources.files("llm_perf_opt.hardware").joinpath("gpus.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("gpus.yaml: expected a top-level 'gpus' list")
    specs = tuple(_parse_entry(raw, i) for i, raw in enumerate(data["gpus"]))
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"gpus.yaml: duplicate keys in {keys}")
    return specs


@functools.cache
def _compiled() -> tuple[tuple[GpuSpec, tuple[re.Pattern[str], ...]], ...]:
    return tuple((s, tuple(re.compile(p, re.IGNORECASE) for p in s.match)) for s in load_gpu_table())


def match_gpu(device_name: str) -> GpuSpec | None:
    """First table entry with a regex found in ``device_name``; None if none matches or it is a MIG slice."""
    name = device_name.strip()
    if not name or _MIG_RE.search(name):
        return None
    for spec, patterns in _compiled():
        if any(p.search(name) for p in patterns):
            return spec
    return None


def compute_dtype_key(dtype: str, *, tf32_matmul: bool) -> str:
    """Map a dtype name (``"bfloat16"``, ``"torch.float16"``, ``"fp8"``, ...) to a ``dense_tflops`` key.

    float32 maps to ``"tf32"`` when TF32 matmuls are allowed, else ``"fp32"``. Unknown names raise ValueError.
    """
    name = str(dtype).strip().lower().removeprefix("torch.")
    canonical = canonical_dtype(name)
    if canonical is not None:
        return {"bfloat16": "bf16", "float16": "fp16", "float32": "tf32" if tf32_matmul else "fp32"}[canonical]
    if name == "tf32":
        return "tf32"
    if name == "fp8" or name.startswith("float8"):
        return "fp8"
    raise ValueError(f"unknown compute dtype {dtype!r}; expected bf16, fp16, fp32 or fp8")


def _check_override(value: float, setting: str) -> float:
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or not math.isfinite(value) or value <= 0:
        raise UserError(f"{setting}={value!r} is not a positive number", f"Set {setting} to a value > 0")
    return float(value)


def peak_compute(
    device_name: str, dtype: str, *, tf32_matmul: bool = False, override_tflops: float | None = None
) -> PeakFigure | None:
    """Dense peak FLOP/s for ``dtype`` on ``device_name``; an override always wins.

    None when the device is not in the table or the table has no figure for the dtype.
    """
    key = compute_dtype_key(dtype, tf32_matmul=tf32_matmul)
    if override_tflops is not None:
        tflops = _check_override(override_tflops, "hardware.peak_tflops")
        source = f"user override: hardware.peak_tflops={override_tflops:g}"
    else:
        spec = match_gpu(device_name)
        if spec is None or key not in spec.dense_tflops:
            return None
        tflops = spec.dense_tflops[key]
        source = f"datasheet: {spec.display_name}, dense {_DTYPE_LABEL[key]} ({spec.sources[0]})"
    return PeakFigure(value=tflops * 1e12, unit="FLOP/s", dtype_key=key, source=source, device_name=device_name)


def peak_bandwidth(device_name: str, *, override_gbps: float | None = None) -> PeakFigure | None:
    """Peak memory bandwidth in B/s for ``device_name``; an override always wins; None if unknown."""
    if override_gbps is not None:
        gbps = _check_override(override_gbps, "hardware.peak_bandwidth_gbps")
        source = f"user override: hardware.peak_bandwidth_gbps={override_gbps:g}"
    else:
        spec = match_gpu(device_name)
        if spec is None:
            return None
        gbps = spec.bandwidth_gbps
        source = f"datasheet: {spec.display_name}, peak memory bandwidth {gbps:g} GB/s ({spec.sources[0]})"
    return PeakFigure(value=gbps * 1e9, unit="B/s", dtype_key=None, source=source, device_name=device_name)

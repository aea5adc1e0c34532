"""Achievable peaks: what this GPU reaches on a calibration GEMM and copy, measured once and cached.

`hardware.peaks=datasheet` (default) divides MFU and MBU by the datasheet peaks only; `hardware.peaks=measured`
adds these as a second denominator: how close a stage gets to what the card actually sustains (a large bf16 GEMM
reaches about 74% of the H100's datasheet rate). Each figure is measured on first use per device, compute dtype
and torch version (`instruments.calibration`) and cached as JSON under `~/.cache/llm_perf_opt/` (or
`$XDG_CACHE_HOME/llm_perf_opt/`); a damaged or foreign cache file is measured again and rewritten.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import attrs
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.hardware.table import compute_dtype_key
from llm_perf_opt.instruments import calibration
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.io import RecordError, load_file, save

DATASHEET = "datasheet"
MEASURED = "measured"
PEAKS_SETTINGS = (DATASHEET, MEASURED)

# Compute dtype key -> (GEMM dtype, TF32 allowed); fp8 has no plain torch.matmul, so it is not measured.
_GEMM: Mapping[str, tuple[torch.dtype, bool]] = {
    "bf16": (torch.bfloat16, False),
    "fp16": (torch.float16, False),
    "tf32": (torch.float32, True),
    "fp32": (torch.float32, False),
}
BANDWIDTH_KEY = "bandwidth"


@attrs.frozen
class MeasuredFigure:
    value: float  # FLOP/s or B/s
    unit: str
    method: str  # the workload and how it was timed
    measured: str  # ISO date and time (UTC)


@attrs.frozen
class PeaksCache:
    """The cache file of one device and torch version: figure key (dtype key or "bandwidth") -> figure."""

    device_name: str
    torch: str
    figures: Mapping[str, MeasuredFigure] = attrs.field(factory=dict)


def check_peaks_setting(value: object) -> str:
    """`hardware.peaks` as "datasheet" or "measured", else a UserError."""
    if value not in PEAKS_SETTINGS:
        raise UserError(
            f"hardware.peaks={value!r} is not a peaks setting",
            "Set hardware.peaks=datasheet (datasheet peaks only) or hardware.peaks=measured (also the calibration "
            "GEMM and copy measured on this GPU)",
        )
    return str(value)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm_perf_opt"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.+]+", "-", text.lower()).strip("-")


def cache_path(device_name: str, cache_dir: Path | None = None) -> Path:
    """`peaks-<device name>-<torch version>.json` in `cache_dir` (default: `default_cache_dir()`)."""
    folder = cache_dir if cache_dir is not None else default_cache_dir()
    return folder / f"peaks-{_slug(device_name)}-{_slug(torch.__version__)}.json"


def _read_cache(path: Path, device_name: str) -> PeaksCache:
    """The cache at `path`; an empty one when it is missing, damaged or written for another device or torch."""
    empty = PeaksCache(device_name=device_name, torch=torch.__version__)
    if not path.is_file():
        return empty
    try:
        cached = load_file(path, PeaksCache, versioned=False)
    except RecordError:
        return empty  # damaged: measured again and rewritten by the caller
    same = cached.device_name == device_name and cached.torch == torch.__version__
    return cached if same else empty


def _measure(key: str, device: torch.device) -> MeasuredFigure:
    try:
        if key == BANDWIDTH_KEY:
            rate = calibration.achieved_rate(calibration.copy_workload(device), device)
        else:
            dtype, tf32 = _GEMM[key]
            with calibration.tf32_matmuls(tf32):
                rate = calibration.achieved_rate(calibration.gemm_workload(device, dtype), device)
    except torch.cuda.OutOfMemoryError:
        raise UserError(
            f"not enough free memory on {device} to measure its achievable peaks (calibration GEMM and copy, "
            "about 1.5 GiB)",
            "Free GPU memory, or set hardware.peaks=datasheet",
        ) from None
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    return MeasuredFigure(value=rate.value, unit=rate.unit, method=rate.description, measured=stamp)


def _peak(key: str, device: torch.device, cache_dir: Path | None) -> PeakFigure:
    """The cached figure `key` of `device` as a peak, measured and written to the cache first if absent."""
    name = torch.cuda.get_device_name(device)
    path = cache_path(name, cache_dir)
    cache = _read_cache(path, name)
    if key not in cache.figures:
        cache = attrs.evolve(cache, figures={**cache.figures, key: _measure(key, device)})
        path.parent.mkdir(parents=True, exist_ok=True)
        save(cache, path)
    figure = cache.figures[key]
    return PeakFigure(
        value=figure.value,
        unit=figure.unit,
        dtype_key=None if key == BANDWIDTH_KEY else key,
        source=f"measured on this device: {figure.method}, {figure.measured}, torch {torch.__version__} "
        f"(cached in {path})",
        device_name=name,
    )


def measured_peak_compute(
    device: torch.device, dtype: str, *, tf32_matmul: bool = False, cache_dir: Path | None = None
) -> PeakFigure | None:
    """Achievable FLOP/s of a large GEMM in the compute dtype on `device` (measured once, then cached); None on a
    non-CUDA device and for fp8 (no plain matmul to measure)."""
    key = compute_dtype_key(dtype, tf32_matmul=tf32_matmul)
    if device.type != "cuda" or key not in _GEMM:
        return None
    return _peak(key, device, cache_dir)


def measured_peak_bandwidth(device: torch.device, *, cache_dir: Path | None = None) -> PeakFigure | None:
    """Achievable B/s of a large device-to-device copy on `device` (measured once, then cached); None off CUDA."""
    if device.type != "cuda":
        return None
    return _peak(BANDWIDTH_KEY, device, cache_dir)

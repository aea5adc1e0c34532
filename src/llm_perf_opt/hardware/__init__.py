"""Hardware peaks (compute and memory bandwidth) with their sources, for MFU and MBU."""

from llm_perf_opt.hardware.table import (
    DTYPE_KEYS,
    GpuSpec,
    PeakFigure,
    compute_dtype_key,
    load_gpu_table,
    match_gpu,
    peak_bandwidth,
    peak_compute,
)

__all__ = [
    "DTYPE_KEYS",
    "GpuSpec",
    "PeakFigure",
    "compute_dtype_key",
    "load_gpu_table",
    "match_gpu",
    "peak_bandwidth",
    "peak_compute",
]

"""Achievable peaks measured on a real GPU (`pytest -m gpu`); skips without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm_perf_opt.hardware.table import peak_bandwidth, peak_compute
from llm_perf_opt.instruments.measured_peaks import cache_path, measured_peak_bandwidth, measured_peak_compute

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_measured_peaks_are_real_fractions_of_the_datasheet_and_cached(tmp_path: Path) -> None:
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    gemm = measured_peak_compute(device, "bfloat16", cache_dir=tmp_path)
    copy = measured_peak_bandwidth(device, cache_dir=tmp_path)
    assert gemm is not None and copy is not None
    assert gemm.source.startswith("measured on this device: 8192³ bfloat16 GEMM")
    assert cache_path(name, tmp_path).is_file()
    datasheet_gemm, datasheet_copy = peak_compute(name, "bfloat16"), peak_bandwidth(name)
    if datasheet_gemm is not None:  # a large bf16 GEMM reaches a good part of the dense peak, never more
        assert 0.3 * datasheet_gemm.value < gemm.value <= 1.02 * datasheet_gemm.value
    if datasheet_copy is not None:
        assert 0.3 * datasheet_copy.value < copy.value <= 1.02 * datasheet_copy.value
    # The second call reads the cache: the same figures, no new measurement.
    assert measured_peak_compute(device, "bfloat16", cache_dir=tmp_path) == gemm
    assert measured_peak_bandwidth(device, cache_dir=tmp_path) == copy

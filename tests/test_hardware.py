"""GPU peak table: name matching, dense values against the reference, sources and overrides."""

from __future__ import annotations

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.hardware import (
    DTYPE_KEYS,
    GpuSpec,
    compute_dtype_key,
    load_gpu_table,
    match_gpu,
    peak_bandwidth,
    peak_compute,
)

H100_SXM = "NVIDIA H100 80GB HBM3"

# Names as torch.cuda.get_device_name() reports them.
REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100_sxm",
    "NVIDIA H100 PCIe": "h100_pcie",
    "NVIDIA H100 NVL": "h100_nvl",
    "NVIDIA H200": "h200_sxm",
    "NVIDIA H200 NVL": "h200_nvl",
    "NVIDIA A100-SXM4-80GB": "a100_sxm4_80gb",
    "NVIDIA A100 80GB PCIe": "a100_pcie_80gb",
    "NVIDIA A100-SXM4-40GB": "a100_40gb",
    "NVIDIA A100-PCIE-40GB": "a100_40gb",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx_4090",
    "NVIDIA GeForce RTX 5090": "rtx_5090",
    "NVIDIA B200": "b200",
    "NVIDIA A800-SXM4-80GB": "a800_sxm4_80gb",
    "NVIDIA A800 80GB PCIe": "a800_pcie_80gb",
    "NVIDIA H800": "h800_sxm",
    "NVIDIA H800 PCIe": "h800_pcie",
    "NVIDIA GH200 480GB": "gh200_hbm3",
    "NVIDIA GH200 144G HBM3e": "gh200_hbm3e",
    "NVIDIA GH200 144GB HBM3e": "gh200_hbm3e",
    "NVIDIA GH200": "gh200_unspecified",
    "NVIDIA H100": "h100_unspecified",
    "NVIDIA L40": "l40",
}

# Dense values from /work/shared/reference/deepseek-ocr-facts.md section 6 (TFLOP/s, GB/s).
REFERENCE_ROWS = {
    "a100_sxm4_80gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 80, 2039),
    "a100_pcie_80gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 80, 1935),
    "a100_40gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 40, 1555),
    "h100_sxm": ({"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979}, 80, 3350),
    "h100_pcie": ({"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513}, 80, 2000),
    "h100_nvl": ({"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, 94, 3900),
    "h200_sxm": ({"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979}, 141, 4800),
    "h200_nvl": ({"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, 141, 4800),
    "l4": ({"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5}, 24, 300),
    "l40s": ({"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733}, 48, 864),
    # GeForce: FP32-accumulate figures.
    "rtx_4090": ({"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3}, 24, 1008),
    # fp8 absent: the FP32-accumulate FP8 rate is marked uncertain in the reference.
    "rtx_5090": ({"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5}, 32, 1792),
    "b200": ({"fp32": 75, "tf32": 1100, "bf16": 2250, "fp16": 2250, "fp8": 4500}, 180, 7700),
}

# Rows not in the reference, checked against the pages their `sources` list (see gpus.yaml notes).
_HOPPER = {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979}
CHECKED_ROWS = {
    "a800_sxm4_80gb": REFERENCE_ROWS["a100_sxm4_80gb"],  # the A100 chip, NVLink cut
    "a800_pcie_80gb": REFERENCE_ROWS["a100_pcie_80gb"],
    "h800_pcie": REFERENCE_ROWS["h100_pcie"],  # the H100 chip, NVLink and FP64 cut
    "h800_sxm": REFERENCE_ROWS["h100_sxm"],
    "h100_unspecified": (_HOPPER, 80, 3900),  # SXM5 compute, NVL bandwidth: the family's highest
    "gh200_hbm3e": (_HOPPER, 144, 4900),
    "gh200_hbm3": (_HOPPER, 96, 4000),
    "gh200_unspecified": (_HOPPER, 144, 4900),
    "l40": ({"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362}, 48, 864),
}
ALL_ROWS = REFERENCE_ROWS | CHECKED_ROWS


@pytest.mark.parametrize(("name", "key"), sorted(REAL_NAMES.items()))
def test_real_device_names_match(name: str, key: str) -> None:
    spec = match_gpu(name)
    assert spec is not None and spec.key == key


def test_matching_is_case_insensitive() -> None:
    spec = match_gpu("nvidia h100 nvl")
    assert spec is not None and spec.key == "h100_nvl"


def test_l4_l40_and_l40s_stay_apart() -> None:
    l4, l40, l40s = match_gpu("NVIDIA L4"), match_gpu("NVIDIA L40"), match_gpu("NVIDIA L40S")
    assert l4 is not None and l4.key == "l4"
    assert l40 is not None and l40.key == "l40"
    assert l40s is not None and l40s.key == "l40s"


def test_bare_h100_gets_the_familys_highest_peaks_and_says_so() -> None:
    compute, bandwidth = peak_compute("NVIDIA H100", "bfloat16"), peak_bandwidth("NVIDIA H100")
    assert compute is not None and bandwidth is not None
    family = [s for s in load_gpu_table() if s.key in ("h100_sxm", "h100_pcie", "h100_nvl")]
    assert compute.value == max(s.dense_tflops["bf16"] for s in family) * 1e12  # SXM5: 989.4
    assert bandwidth.value == max(s.bandwidth_gbps for s in family) * 1e9  # NVL: 3,900 GB/s
    for figure in (compute, bandwidth):
        assert "form factor not in the device name" in figure.source and "lower bounds" in figure.source
    # Only the bare name: a name with its form factor keeps its own row.
    assert match_gpu("NVIDIA H100 80GB HBM3").key == "h100_sxm"  # type: ignore[union-attr]
    assert match_gpu("NVIDIA H100 PCIe").key == "h100_pcie"  # type: ignore[union-attr]


def test_gh200_memory_variants() -> None:
    assert peak_bandwidth("NVIDIA GH200 480GB").value == 4000e9  # type: ignore[union-attr]
    assert peak_bandwidth("NVIDIA GH200 144G HBM3e").value == 4900e9  # type: ignore[union-attr]
    bare = peak_bandwidth("NVIDIA GH200")
    assert bare is not None and bare.value == 4900e9 and "lower bound" in bare.source
    assert peak_compute("NVIDIA GH200 480GB", "bf16").value == 989.4e12  # type: ignore[union-attr]
    assert match_gpu("NVIDIA GH200 480GB").key != "h200_sxm"  # type: ignore[union-attr]


def test_export_variants_use_their_base_chip_and_say_so() -> None:
    h800 = peak_compute("NVIDIA H800", "bf16")
    assert h800 is not None and h800.value == 989.4e12 and "H100 SXM5 figures" in h800.source
    a800 = peak_bandwidth("NVIDIA A800-SXM4-80GB")
    assert a800 is not None and a800.value == 2039e9 and "A100 SXM4 80GB figures" in a800.source


@pytest.mark.parametrize(
    "name",
    [
        "cpu",
        "",
        "AMD EPYC 7763 64-Core Processor",
        "AMD Instinct MI300X",
        "NVIDIA GeForce RTX 3090",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA GB200",
        "NVIDIA A10",
        "NVIDIA A800-SXM4-40GB",  # A800 40GB parts: not verified
        "NVIDIA A800 40GB Active",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "NVIDIA GH200 480GB MIG 1g.12gb",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
    ],
)
def test_unknown_or_partial_devices_have_no_peak(name: str) -> None:
    assert match_gpu(name) is None
    assert peak_compute(name, "bfloat16") is None
    assert peak_bandwidth(name) is None


def test_table_covers_reference_and_checked_rows_exactly() -> None:
    assert [s.key for s in load_gpu_table()] == [
        "a100_sxm4_80gb", "a100_pcie_80gb", "a100_40gb", "a800_sxm4_80gb", "a800_pcie_80gb", "h100_nvl",
        "h100_pcie", "h100_sxm", "h100_unspecified", "h800_pcie", "h800_sxm", "h200_nvl", "h200_sxm",
        "gh200_hbm3e", "gh200_hbm3", "gh200_unspecified", "l4", "l40s", "l40", "rtx_4090", "rtx_5090", "b200",
    ]  # fmt: skip
    assert set(ALL_ROWS) == {s.key for s in load_gpu_table()}


@pytest.mark.parametrize("key", sorted(ALL_ROWS))
def test_dense_values_equal_reference(key: str) -> None:
    tflops, memory_gb, bandwidth_gbps = ALL_ROWS[key]
    spec = next(s for s in load_gpu_table() if s.key == key)
    assert dict(spec.dense_tflops) == tflops
    assert spec.memory_gb == memory_gb
    assert spec.bandwidth_gbps == bandwidth_gbps


@pytest.mark.parametrize("spec", load_gpu_table(), ids=lambda s: s.key)
def test_entry_sanity(spec: GpuSpec) -> None:
    assert spec.sources and all(s.startswith("https://") for s in spec.sources)
    assert set(spec.dense_tflops) <= set(DTYPE_KEYS)
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(spec.dense_tflops)
    d = spec.dense_tflops
    assert d["bf16"] >= d["tf32"] >= d["fp32"] > 0
    assert d["fp16"] == d["bf16"]
    if "fp8" in d:
        assert d["fp8"] >= d["bf16"]
    assert spec.memory_gb > 0 and spec.bandwidth_gbps > 0


def test_h100_sxm_bf16_peak_and_source() -> None:
    peak = peak_compute(H100_SXM, "bfloat16")
    assert peak is not None
    assert peak.value == pytest.approx(989.4e12, rel=1e-12)
    assert peak.unit == "FLOP/s" and peak.dtype_key == "bf16" and peak.device_name == H100_SXM
    assert peak.source.startswith("datasheet: NVIDIA H100 SXM5, dense BF16 tensor core (https://")


def test_fp32_picks_tf32_or_plain_fp32() -> None:
    on = peak_compute(H100_SXM, "float32", tf32_matmul=True)
    off = peak_compute(H100_SXM, "float32", tf32_matmul=False)
    assert on is not None and on.dtype_key == "tf32" and on.value == pytest.approx(494.7e12)
    assert off is not None and off.dtype_key == "fp32" and off.value == pytest.approx(67e12)
    assert "TF32" in on.source and "FP32 (non-tensor-core)" in off.source


def test_missing_dtype_figure_is_none() -> None:
    assert peak_compute("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_compute("NVIDIA GeForce RTX 5090", "float8_e4m3fn") is None
    fp8 = peak_compute(H100_SXM, "float8_e4m3fn")
    assert fp8 is not None and fp8.value == pytest.approx(1979e12)


def test_geforce_uses_fp32_accumulate_rate() -> None:
    peak = peak_compute("NVIDIA GeForce RTX 4090", "float16")
    assert peak is not None and peak.value == pytest.approx(165.2e12)


def test_overrides_win() -> None:
    peak = peak_compute(H100_SXM, "bf16", override_tflops=500.0)
    assert peak is not None and peak.value == pytest.approx(500e12)
    assert peak.source == "user override: hardware.peak_tflops=500"
    cpu = peak_compute("cpu", "float32", override_tflops=1.5)
    assert cpu is not None and cpu.value == pytest.approx(1.5e12) and cpu.dtype_key == "fp32"
    bw = peak_bandwidth("cpu", override_gbps=204.8)
    assert bw is not None and bw.value == pytest.approx(204.8e9) and bw.unit == "B/s"
    assert bw.source == "user override: hardware.peak_bandwidth_gbps=204.8"
    bw_known = peak_bandwidth(H100_SXM, override_gbps=3000)
    assert bw_known is not None and bw_known.value == pytest.approx(3e12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_overrides_raise(bad: float) -> None:
    with pytest.raises(UserError):
        peak_compute(H100_SXM, "bf16", override_tflops=bad)
    with pytest.raises(UserError):
        peak_bandwidth(H100_SXM, override_gbps=bad)


def test_h100_sxm_bandwidth() -> None:
    bw = peak_bandwidth(H100_SXM)
    assert bw is not None
    assert bw.value == pytest.approx(3.35e12, rel=1e-12)
    assert bw.unit == "B/s" and bw.dtype_key is None
    assert bw.source.startswith("datasheet: NVIDIA H100 SXM5") and "https://" in bw.source


@pytest.mark.parametrize(
    ("dtype", "tf32", "key"),
    [
        ("bfloat16", False, "bf16"),
        ("bf16", False, "bf16"),
        ("torch.bfloat16", False, "bf16"),
        ("float16", False, "fp16"),
        ("fp16", False, "fp16"),
        ("half", False, "fp16"),
        ("float32", False, "fp32"),
        ("float32", True, "tf32"),
        ("fp32", True, "tf32"),
        ("float8_e4m3fn", False, "fp8"),
        ("fp8", False, "fp8"),
    ],
)
def test_compute_dtype_key(dtype: str, tf32: bool, key: str) -> None:
    assert compute_dtype_key(dtype, tf32_matmul=tf32) == key


@pytest.mark.parametrize("dtype", ["int8", "float64", "", "bogus"])
def test_compute_dtype_key_unknown_raises(dtype: str) -> None:
    with pytest.raises(ValueError, match="unknown compute dtype"):
        compute_dtype_key(dtype, tf32_matmul=False)


def test_table_is_cached() -> None:
    assert load_gpu_table() is load_gpu_table()

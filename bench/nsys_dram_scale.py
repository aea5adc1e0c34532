"""Benchmark (issue 25): the scale of Nsight Systems' sampled DRAM throughput, checked against kernels whose DRAM
traffic is known, so the sampled bytes Stage 2 reports rest on a checked 100%.

`workload` runs, inside NVTX ranges of the toolkit's domain, kernels that move a known number of bytes far larger
than L2: `torch.mul(x, 2, out=y)` over 2 GiB bf16 (reads 2 GiB, writes 2 GiB) and `x.sum()` (reads 2 GiB), with idle
gaps between them. `analyse` integrates the sampled "DRAM Read/Write Bandwidth [Throughput %]" over each range's
kernels' busy intervals (what Stage 2 does, `nsight/gpu_metrics.py`) and prints sampled / known bytes at the GPU's
datasheet DRAM peak.

    nsys profile --trace=cuda,nvtx --gpu-metrics-devices=all --gpu-metrics-frequency=100000 -o scale \\
        python bench/nsys_dram_scale.py workload
    nsys export --type=sqlite -o scale.sqlite scale.nsys-rep
    python bench/nsys_dram_scale.py analyse scale.sqlite
    python bench/nsys_dram_scale.py samples scale.sqlite    # how the DRAM samples are stored (ids, periods, gaps)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

GIB = 1 << 30
SIZE_BYTES = 2 * GIB
RANGES = {"scale/mul": (SIZE_BYTES, SIZE_BYTES), "scale/sum": (SIZE_BYTES, 0)}  # range -> known (read, write) bytes
REPEATS = 5


def workload() -> None:
    import nvtx
    import torch

    from llm_perf_opt.records import vocabulary as vocab

    x = torch.ones(SIZE_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    for _ in range(2):  # warm-up, outside every range
        torch.mul(x, 2, out=y)
        x.sum()
    torch.cuda.synchronize()
    for _ in range(REPEATS):
        for name in RANGES:
            with nvtx.annotate(name, domain=vocab.NVTX_DOMAIN):
                if name == "scale/mul":
                    torch.mul(x, 2, out=y)
                else:
                    x.sum()
                torch.cuda.synchronize()
            time.sleep(0.01)  # an idle gap the busy-interval integral must leave out


def analyse(sqlite: Path) -> None:
    from llm_perf_opt.hardware.table import peak_bandwidth
    from llm_perf_opt.nsight.gpu_metrics import merge_intervals
    from llm_perf_opt.nsight.nsys_trace import NsysTrace

    with NsysTrace(sqlite) as trace:
        samples = trace.dram_samples()
        if samples is None:
            raise SystemExit(f"{sqlite}: no sampled DRAM throughput (was nsys run with --gpu-metrics-devices?)")
        read, write = samples
        device = trace.device().name or ""
        peak = peak_bandwidth(device)
        if peak is None:
            raise SystemExit(f"no datasheet DRAM peak for {device!r}")
        print(
            f"{device}: datasheet DRAM peak {peak.value / 1e9:,.0f} GB/s ({peak.source}); sample period "
            f"{(read.period_ns or 0) / 1e3:.1f} us"
        )
        print("| range | instance | busy ms | read GB (known) | written GB (known) | sampled / known read | write |")
        print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, (known_read, known_write) in RANGES.items():
            for i, intervals in enumerate(trace.instance_intervals(name)):
                busy = merge_intervals(intervals)
                ms = sum(e - s for s, e in busy) / 1e6
                got_read = read.integral(busy) * peak.value
                got_write = write.integral(busy) * peak.value
                r = f"{got_read / known_read:.3f}"
                w = f"{got_write / known_write:.3f}" if known_write else f"({got_write / 1e9:.3f} GB)"
                print(
                    f"| {name} | {i} | {ms:.3f} | {got_read / 1e9:.3f} ({known_read / 1e9:.3f}) | "
                    f"{got_write / 1e9:.3f} ({known_write / 1e9:.3f}) | {r} | {w} |"
                )


def samples(sqlite: Path) -> None:
    """The export's DRAM metric rows: per (typeId, metricId) the sample count, time span, period and gaps, and how
    many samples fall inside each range instance's GPU window."""
    import sqlite3

    import numpy as np

    conn = sqlite3.connect(f"{sqlite.resolve().as_uri()}?mode=ro", uri=True)
    info = conn.execute(
        "SELECT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE '%DRAM%'"
    ).fetchall()
    print("TARGET_INFO_GPU_METRICS (DRAM):", info)
    print("typeIds:", conn.execute("SELECT DISTINCT typeId FROM GPU_METRICS").fetchall())
    for type_id, metric, name in info:
        rows = conn.execute(
            "SELECT timestamp, value FROM GPU_METRICS WHERE typeId = ? AND metricId = ? ORDER BY timestamp",
            (type_id, metric),
        ).fetchall()
        if not rows:
            print(f"{type_id}/{metric} {name}: no samples")
            continue
        t = np.array([r[0] for r in rows], dtype=np.float64)
        v = np.array([r[1] for r in rows], dtype=np.float64)
        d = np.diff(t)
        big = d[d > 3 * np.median(d)] if d.size else d
        print(
            f"{type_id}/{metric} {name}: {t.size} samples, {t[0]:.0f}..{t[-1]:.0f} ns ({(t[-1] - t[0]) / 1e9:.3f} s), "
            f"median period {np.median(d) / 1e3 if d.size else 0:.2f} us, {big.size} gaps > 3x ({big.sum() / 1e9:.3f} "
            f"s), value min/mean/max {v.min():.1f}/{v.mean():.2f}/{v.max():.1f}, nonzero {np.count_nonzero(v)}"
        )
        if big.size:
            print("   largest gaps (ms):", np.round(np.sort(big)[-5:] / 1e6, 3).tolist())
    kernels = conn.execute("SELECT MIN(start), MAX(end), COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    print("kernels: first start, last end, count:", kernels)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("workload")
    a = sub.add_parser("analyse")
    a.add_argument("sqlite", type=Path)
    d = sub.add_parser("samples")
    d.add_argument("sqlite", type=Path)
    args = ap.parse_args()
    if args.what == "workload":
        workload()
    elif args.what == "samples":
        samples(args.sqlite)
    else:
        analyse(args.sqlite)


if __name__ == "__main__":
    main()

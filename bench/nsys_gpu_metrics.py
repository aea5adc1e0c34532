"""Experiment (issue 25): DRAM bytes per stage instance from Nsight Systems' sampled GPU metrics, beside Nsight
Compute's bytes pass, to see whether sampling could replace the ncu pass (16 ms of ncu per kernel).

    nsys profile --trace=cuda,nvtx --gpu-metrics-devices=all --gpu-metrics-frequency=100000 -o gm <stage1 workload>
    nsys export --type=sqlite -o gm.sqlite gm.nsys-rep
    python bench/nsys_gpu_metrics.py gm.sqlite [--peak-gbps 3350]

Prints the sampled metrics' names, then per NVTX range instance of the toolkit's domain (its GPU window: first kernel
start to last kernel end) the integral of every DRAM metric over the window: percent x seconds, and bytes when the
metric is a throughput in % of the peak (`--peak-gbps`, the DRAM peak the percentage is taken of).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
from pathlib import Path

from llm_perf_opt.nsight.nsys_trace import NsysTrace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sqlite", type=Path)
    ap.add_argument("--peak-gbps", type=float, default=3350.0)
    ap.add_argument("--ranges", nargs="*", default=["prefill", "vision/sam", "vision/clip", "decode/step"])
    args = ap.parse_args()
    with NsysTrace(args.sqlite) as trace:
        trace.stage_times()  # builds the range tables
        conn = trace._conn
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        print("GPU metric tables:", sorted(t for t in tables if "METRIC" in t.upper()))
        for table in sorted(t for t in tables if "METRIC" in t.upper()):
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            print(f"  {table}: {columns}")
        if "TARGET_INFO_GPU_METRICS" not in tables or "GPU_METRICS" not in tables:
            print("no sampled GPU metrics in this export")
            return
        names = dict(conn.execute("SELECT DISTINCT metricId, metricName FROM TARGET_INFO_GPU_METRICS").fetchall())
        for mid, name in sorted(names.items()):
            print(f"  {mid}: {name}")
        dram = {mid: name for mid, name in names.items() if "DRAM" in name.upper()}
        samples: dict[int, tuple[list[int], list[float]]] = {}
        for mid in dram:
            rows = conn.execute(
                "SELECT timestamp, value FROM GPU_METRICS WHERE metricId = ? ORDER BY timestamp", (mid,)
            ).fetchall()
            samples[mid] = ([r[0] for r in rows], [float(r[1]) for r in rows])
        some = next(iter(samples.values()), ([], []))[0]
        if len(some) > 1:
            gaps = sorted(b - a for a, b in itertools.pairwise(some))
            print(f"samples per metric: {len(some)}, median period {gaps[len(gaps) // 2] / 1e3:.1f} us")
        windows = conn.execute(
            """SELECT g.name, s.first_start, s.last_end, s.kernels FROM temp.nvtx_ranges AS g
               JOIN temp.nvtx_range_stats AS s ON s.rid = g.rid ORDER BY g.start"""
        ).fetchall()
        print("| range | instance | kernels | GPU window ms | " + " | ".join(dram.values()) + " |")
        seen: dict[str, int] = {}
        for name, start, end, kernels in windows:
            if name not in args.ranges:
                continue
            seen[name] = seen.get(name, 0) + 1
            cells = []
            for mid in dram:
                ts, vs = samples[mid]
                lo, hi = bisect.bisect_right(ts, start), bisect.bisect_right(ts, end)
                # a sample at ts covers (previous ts, ts]: add the ones ending inside the window, and the next one
                # (it covers the window's tail) weighted by the part of it inside
                total = 0.0
                for i in range(lo, min(hi + 1, len(ts))):
                    a = ts[i - 1] if i > 0 else ts[i]
                    b = ts[i]
                    inside = max(0, min(b, end) - max(a, start))
                    total += vs[i] / 100.0 * inside * 1e-9
                cells.append(f"{total * 1e3:.3f} ms at peak = {total * args.peak_gbps:.3f} GB")
            print(f"| {name} | {seen[name]} | {kernels} | {(end - start) / 1e6:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

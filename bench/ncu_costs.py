"""What one Nsight Compute process costs per profiled kernel, by option: the facts behind Stage 2's ncu plan.

    python bench/ncu_costs.py [--ncu ncu] [--prefill 1200] [--step 300]

Runs a small torch workload (one "prefill" NVTX range of `--prefill` kernels, then three "decode_step" ranges of
`--step` kernels each, after a warm-up) under several ncu command lines and prints, per line, the wall time, the
kernels profiled and the seconds per kernel. The workload brackets its prefill and its middle decode step with
cudaProfilerStart/Stop, so `--profile-from-start off` variants see exactly those two instances.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BYTES = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


def workload(prefill: int, step: int) -> None:
    """The profiled program: mixed elementwise, reduction and matmul kernels of a few shapes."""
    import nvtx
    import torch

    dev = torch.device("cuda")
    xs = [torch.randn(n, device=dev, dtype=torch.bfloat16) for n in (1 << 12, 1 << 18, 1 << 22)]
    a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)

    def kernels(count: int) -> None:
        for i in range(count):
            x = xs[i % 3]
            if i % 5 == 4:
                _ = a @ a
            elif i % 5 == 3:
                _ = x.sum()
            else:
                _ = x * 1.5 + 0.5 if i % 2 else torch.nn.functional.silu(x)

    kernels(200)  # warm-up, outside every range and window
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()
    cudart.cudaProfilerStart()
    with nvtx.annotate("prefill", domain="llm_perf_opt"):
        kernels(prefill)
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()
    for s in range(3):
        if s == 1:
            cudart.cudaProfilerStart()
        with nvtx.annotate("decode_step", domain="llm_perf_opt"):
            kernels(step)
        torch.cuda.synchronize()
        if s == 1:
            cudart.cudaProfilerStop()


def count_results(ncu: str, rep: Path) -> int:
    if not rep.is_file():
        return 0
    out = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw"], capture_output=True, text=True)
    rows = list(csv.reader(io.StringIO(out.stdout)))
    return max(0, len(rows) - 2)  # header and units rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--prefill", type=int, default=1200)
    ap.add_argument("--step", type=int, default=300)
    ap.add_argument("--workload", action="store_true")
    args = ap.parse_args()
    if args.workload:
        workload(args.prefill, args.step)
        return
    me = [sys.executable, __file__, "--workload", "--prefill", str(args.prefill), "--step", str(args.step)]
    common = [args.ncu, "--target-processes", "all", "--clock-control", "none"]
    window = ["--profile-from-start", "off", "--cache-control", "none"]
    variants = {
        "none (regex matching nothing)": ["-k", "regex:^nothing$", *window],
        "bytes, nvtx prefill/ (before 2026-11-26)": [
            *["--cache-control", "none", "--nvtx", "--nvtx-include", "llm_perf_opt@prefill/", "--metrics", BYTES]
        ],
        "bytes, profiler window (prefill + step 2)": [*window, "--metrics", BYTES],
        "bytes, window, caches flushed": ["--profile-from-start", "off", "--metrics", BYTES, "--cache-control", "all"],
        "SpeedOfLight, window, 3 kernels, per-launch-config x1": [
            *window,
            "-k",
            "regex:^(elementwise_kernel|vectorized_elementwise_kernel|reduce_kernel)$",
            "--filter-mode",
            "per-launch-config",
            "--launch-count",
            "1",
            "--section",
            "SpeedOfLight",
        ],
        # last: on the H100 this one ran past 300 s for 1,950 kernels (> 150 ms of ncu per kernel)
        "SpeedOfLight + bytes, window, all kernels": [*window, "--section", "SpeedOfLight", "--metrics", BYTES],
    }
    print(f"workload: prefill {args.prefill} kernels, middle step {args.step}")
    print("| variant | wall s | results | s per result |")
    print("| :--- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, opts) in enumerate(variants.items()):
            rep = Path(tmp) / f"v{i}"
            argv = [*common, *opts, "-f", "-o", str(rep), *me]
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True)
            wall = time.perf_counter() - start
            n = count_results(args.ncu, rep.with_suffix(".ncu-rep"))
            per = f"{wall / n:.4f}" if n else "-"
            print(f"| {name} | {wall:.1f} | {n} | {per} |", flush=True)
            if done.returncode:
                print(f"  rc={done.returncode}: {done.stderr[-600:]} {done.stdout[-600:]}")


if __name__ == "__main__":
    main()

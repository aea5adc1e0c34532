"""Calibration: the toolkit's timing and MFU/MBU code against workloads whose FLOPs and bytes are known exactly.

- compute-bound: a bf16 GEMM (default 8192 x 8192 x 8192, 2·M·N·K FLOPs per product);
- memory-bound: a device-to-device copy of a large buffer (bytes moved = 2 x size: one read, one write).

The workloads are `llm_perf_opt.instruments.calibration`'s (the same that `hardware.peaks=measured` times). Each is
timed twice per repeat in one process: once through the toolkit (`calibration.timed_seconds`, a StageRecorder
span, then `measure.mfu.utilization` against the hardware table's peak) and once directly (raw CUDA events around
the same loop). The toolkit's MFU/MBU must agree with the direct measurement within 3%; the figures also show how
far the datasheet peaks are from what the card reaches.

    python bench/calibration.py --out calibration.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from llm_perf_opt.hardware.table import peak_bandwidth, peak_compute
from llm_perf_opt.instruments import calibration
from llm_perf_opt.measure.mfu import utilization


def _direct_seconds(run: Callable[[], None], iters: int, device: torch.device) -> float:
    stream = torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iters):
        run()
    end.record(stream)
    torch.cuda.synchronize(device)
    return float(start.elapsed_time(end)) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192, help="GEMM M = N = K")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="copy buffer size in GiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("calibration needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)

    gemm = calibration.gemm_workload(device, torch.bfloat16, args.size)
    copy = calibration.copy_workload(device, args.copy_gib)
    workloads = {
        "gemm_bf16": (gemm, peak_compute(name, "bfloat16")),
        "copy": (copy, peak_bandwidth(name)),
    }
    result: dict[str, object] = {
        "benchmark": "calibration",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": name,
        "torch": torch.__version__,
        "iters": args.iters,
        "repeats": args.repeats,
    }
    for key, (workload, peak) in workloads.items():
        run, work = workload.run, workload.work_per_run
        for _ in range(3):
            run()
        torch.cuda.synchronize(device)
        toolkit, direct = [], []
        for _ in range(args.repeats):
            toolkit.append(calibration.timed_seconds(run, args.iters, device))
            direct.append(_direct_seconds(run, args.iters, device))
        t_rate, t_frac = utilization(work * args.iters, statistics.median(toolkit), peak)
        d_rate = work * args.iters / statistics.median(direct)
        direct_frac = d_rate / peak.value if peak else None
        result[key] = {
            "work_per_iter": work,
            "unit": workload.unit,
            "peak": None if peak is None else {"value": peak.value, "unit": peak.unit, "source": peak.source},
            "toolkit_rate": t_rate,
            "toolkit_fraction_of_peak": t_frac,
            "direct_rate": d_rate,
            "direct_fraction_of_peak": direct_frac,
            "agreement_pct": None if not t_frac or not direct_frac else (t_frac / direct_frac - 1) * 100,
        }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

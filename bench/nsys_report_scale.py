"""Benchmark: NsysTrace on a synthetic nsys SQLite export with a million kernels.

Builds an export in the nsys schema (the CREATE TABLE statements of the tables NsysTrace reads, copied from the
2025.3 fixture in tests/fixtures/nsys) shaped like a long DeepSeek-OCR run: images of 200,000 kernel launches each,
every image a preprocess range, a prefill range with vision/sam, vision/encoder and vision/projector nested in it,
and a decode range holding decode/step ranges of 200 kernels; ~100 distinct kernels over two streams (so kernels
overlap), a few launches outside every range, non-launch runtime calls, and a second NVTX domain to filter out.
Then times the questions Stage 2 asks: stage_times, top_kernels(20) over everything and per stage, decode_steps
(the first per-stage top_kernels call folds every stage at once; the later ones read the result). Building the
export is not timed. Target: at most 15 s in total on a 2-core machine.

    python bench/nsys_report_scale.py --records 1000000 --out nsys_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.pipeline.stage2 import render

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
    domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
    int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
    globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL,
    callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
    launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
    gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
    blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
    isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
    smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT,
    ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER,
    maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER,
    maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER,
    maxBlocksPerSm INTEGER, maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER,
    maxBlockDimZ INTEGER, maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER,
    computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER);
"""

PID, TID = 4242, 4242
GLOBAL_PID = (1 << 48) | (PID << 24)
GLOBAL_TID = GLOBAL_PID | TID
PER_IMAGE = 200_000  # kernel launches per image
STEP = 200  # kernels per decode step
LAUNCH_NS = 10_000  # one launch call every 10 µs on the CPU, each 4 µs long
IMAGE_GAP_NS = 1_000_000
KERNEL_NAMES = 100
SHORT_NAMES = 40  # several template instances share a base name, as at::native kernels do
NON_LAUNCH_EVERY = 4  # one non-launch runtime call per 4 launches
# Kernel positions within an image: [first, last] of each range (nested ones inside prefill).
LAYOUT = {
    "preprocess": (0, 9),  # positions 10..19 launch outside every range
    "prefill": (20, 1999),
    "vision/sam": (20, 699),
    "vision/encoder": (700, 1699),
    "vision/projector": (1700, 1749),
    "decode": (2000, PER_IMAGE - 1),
}
# Launch-call start of kernel position i (a SQL expression and its Python twin).
LAUNCH_SQL = f"(i * {LAUNCH_NS} + (i / {PER_IMAGE}) * {IMAGE_GAP_NS})"


def launch_ns(i: int) -> int:
    return i * LAUNCH_NS + (i // PER_IMAGE) * IMAGE_GAP_NS


def build(path: Path, records: int) -> dict[str, int]:
    """Write the synthetic export to `path`; the row counts."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    strings = {"llm_perf_opt_range": 1, "cudaLaunchKernel_v7000": 2, "cudaStreamIsCapturing_v10000": 3}
    names = [*LAYOUT, "decode/step", "cub::DeviceScan::InclusiveScan"]
    name_ids = {name: 10 + n for n, name in enumerate(names)}
    rows = [(v, k) for k, v in strings.items()] + [(v, k) for k, v in name_ids.items()]
    rows += [(100 + s, f"kernel_{s}") for s in range(SHORT_NAMES)]
    rows += [(1000 + d, f"void kernel_{d % SHORT_NAMES}<(int){d}>(float *, int)") for d in range(KERNEL_NAMES)]
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", rows)
    conn.execute(
        "INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, memoryBandwidth, clockRate, smCount, chipName, "
        "computeMajor, computeMinor) VALUES (0, 0, 'NVIDIA H100 80GB HBM3', 85017493504, 3352320000000, "
        "1980000000, 132, 'GH100', 9, 0)"
    )
    # Kernels: on two streams, 2-15 µs long, starting 5-8 µs after their launch call: neighbours overlap.
    conn.execute(
        f"""WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < {records - 1})
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid,
            demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ,
            staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)
        SELECT {LAUNCH_SQL} + 5000 + (i * 13) % 3000,
               {LAUNCH_SQL} + 5000 + (i * 13) % 3000 + 2000 + (i * 7919) % 13000,
               0, 1, 7 + i % 2, i + 1, {GLOBAL_PID},
               1000 + (i * 37) % {KERNEL_NAMES}, 100 + ((i * 37) % {KERNEL_NAMES}) % {SHORT_NAMES},
               32, 128, 1, 1, 256, 1, 1, 0, 0, 0, 0, i
        FROM seq"""
    )
    conn.execute(
        f"""INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId,
            returnValue)
        SELECT k.start - 5000 - (k.gridId * 13) % 3000, k.start - 1000 - (k.gridId * 13) % 3000, 1, {GLOBAL_TID},
               k.correlationId, 2, 0
        FROM CUPTI_ACTIVITY_KIND_KERNEL AS k"""
    )
    conn.execute(
        f"""WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + {NON_LAUNCH_EVERY} FROM seq
                                     WHERE i < {records - NON_LAUNCH_EVERY})
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue)
        SELECT {LAUNCH_SQL} + 4500, {LAUNCH_SQL} + 5500, 1, {GLOBAL_TID}, {records + 1} + i, 3, 0 FROM seq"""
    )
    nvtx: list[tuple[int, int | None, int, str | None, int | None, int]] = [
        (0, None, 75, "llm_perf_opt", None, 1),
        (0, None, 75, "CCCL", None, 2),
    ]
    images = -(-records // PER_IMAGE)
    for image in range(images):
        base = image * PER_IMAGE

        def span(first: int, last: int, base: int = base) -> tuple[int, int]:
            return launch_ns(base + first) - 1000, launch_ns(base + last) + 5000

        for name, (first, last) in LAYOUT.items():
            if base + first < records:
                start, end = span(first, min(last, records - 1 - base))
                nvtx.append((start, end, 59, None, name_ids[name], 1))
        for first in range(LAYOUT["decode"][0], PER_IMAGE, STEP):
            if base + first < records:
                start, end = span(first, min(first + STEP - 1, records - 1 - base))
                nvtx.append((start, end, 59, None, name_ids["decode/step"], 1))
        start, end = span(LAYOUT["decode"][0] + 3, LAYOUT["decode"][0] + 4)  # another domain's range, ignored
        nvtx.append((start, end, 59, None, name_ids["cub::DeviceScan::InclusiveScan"], 2))
    conn.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, domainId, globalTid) VALUES (?, ?, ?, ?, ?, ?, "
        f"{GLOBAL_TID})",
        nvtx,
    )
    conn.commit()
    counts = {
        table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
    }
    conn.close()
    return counts


def timed(seconds: dict[str, float], key: str, call: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = call()
    seconds[key] = round(time.perf_counter() - start, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="kernel records")
    parser.add_argument("--db", type=Path, default=None, help="keep the synthetic export here (default: temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "synthetic.sqlite"
        path.unlink(missing_ok=True)
        start = time.perf_counter()
        counts = build(path, args.records)
        build_s = time.perf_counter() - start

        seconds: dict[str, float] = {}
        start = time.perf_counter()
        trace = timed(seconds, "open", lambda: NsysTrace(path))
        with trace:
            stage_list = timed(seconds, "stage_times", trace.stage_times)
            timed(seconds, "top_kernels_all", lambda: trace.top_kernels(20))
            for name in [stage.stage for stage in stage_list]:
                timed(seconds, f"top_kernels[{name}]", partial(trace.top_kernels, 20, stage=name))
            steps = timed(seconds, "decode_steps", trace.decode_steps)
        total_s = time.perf_counter() - start

        # The whole report build of `stage2-report` on a Stage 2 folder holding this export.
        folder = Path(tmp) / "stage2"
        (folder / "nsys").mkdir(parents=True)
        (folder / "nsys" / "report.sqlite").symlink_to(path.resolve())
        (folder / "capture.json").write_text(json.dumps({"run_id": "synthetic", "mode": "light", "tools": {}}))
        start = time.perf_counter()
        render(folder)
        render_s = time.perf_counter() - start

    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "processor": platform.processor(),
            "arch": platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
        },
        "records": {
            "kernels": counts["CUPTI_ACTIVITY_KIND_KERNEL"],
            "runtime": counts["CUPTI_ACTIVITY_KIND_RUNTIME"],
            "nvtx": counts["NVTX_EVENTS"],
        },
        "build_s": round(build_s, 2),
        "seconds": seconds,
        "total_s": round(total_s, 2),
        "render_s": round(render_s, 2),
        "target_s": 15,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "check": {
            "stages": {s.stage: {"instances": s.instances, "kernels": s.kernels} for s in stage_list},
            "decode_steps": steps.steps if steps else 0,
            "kernels_per_step": steps.kernels_per_step if steps else 0,
            "step_gpu_busy_fraction": round(steps.gpu_busy_fraction, 4) if steps else 0,
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""GPU time per NVTX stage from an Nsight Systems SQLite export (`nsys export --type sqlite`).

One :class:`NsysTrace` per export, one method per question (in the manner of HolisticTraceAnalysis). Every
aggregation runs inside SQLite; Python only reads the few result rows. The export is opened read-only
(`mode=ro`) and the working tables are TEMP tables of this connection, so the user's file is never written.

Attribution (the rule `nsys stats --report nvtx_kern_sum` applies): a kernel belongs to every range of the domain,
on the thread that launched it, whose [start, end] contains the start of the CUDA API call (runtime or driver
launch, matched by correlationId within the process) that launched it. Nested ranges therefore each get the
kernel: a decode/step kernel also counts for decode. Kernels launched outside every range of the domain belong
to no stage; ranges that never ended (end NULL) are ignored.

Projection: `nsys stats --report nvtx_gpu_proj_sum`'s "Total Proj Time" is, per range instance, the end of the
last GPU operation launched inside the range minus the start of the first one, summed over instances: the
`StageGpuTime.span_ms` here, gaps included, not the busy union (on the tiny H100 fixture decode projects to
120.3 ms while its kernels keep the GPU busy for 2.4 ms of it). nsys counts memcpy/memset operations ("Total GPU
Ops") in the projection as well as kernels; this span is kernels only, so the two agree to the nanosecond where
kernels open and close every instance, and differ where copies do (preprocess, mostly host-to-device copies:
14.7 ms projected, 10.8 ms kernel span). The projection can exceed the range's own time when the GPU runs behind
the CPU.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Self

from llm_perf_opt.errors import UserError
from llm_perf_opt.nsight.gpu_metrics import READ_METRIC, WRITE_METRIC, SampledRate
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage2 import DecodeStepStats, KernelStat, StageGpuTime, TraceGpu

__all__ = ["DecodeStepStats", "KernelStat", "NsysTrace", "StageGpuTime", "TraceGpu"]

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
STRINGS_TABLE = "StringIds"
GPU_TABLE = "TARGET_INFO_GPU"
GPU_METRICS_TABLE = "GPU_METRICS"  # nsys --gpu-metrics-devices: one row per (metric, sample)
GPU_METRICS_INFO_TABLE = "TARGET_INFO_GPU_METRICS"  # the sampled metrics' names and ids
REQUIRED_TABLES = (STRINGS_TABLE, KERNEL_TABLE, RUNTIME_TABLE)

# ENUM_NSYS_EVENT_TYPE ids.
NVTX_PUSH_POP_RANGE = 59
NVTX_START_END_RANGE = 60
NVTX_DOMAIN_CREATE = 75

_NS_PER_MS = 1e6
_ALL = 1_000_000_000  # a `top_kernels` limit above any trace's number of distinct kernels
_Step = Literal["ranges", "kernel_totals", "stage_kernels"]
# A serialized GlobalId packs (host/vm, pid, tid); shifting the 24 thread-id bits out leaves the process, which is
# what a kernel's globalPid holds. correlationId and NVTX domainId are only unique within one process.
_PID_SHIFT = 24

_RANGES_SQL = f"""
INSERT INTO temp.nvtx_ranges (name, tid, start, stop)
SELECT COALESCE(e.text, s.value), e.globalTid, e.start, e."end"
FROM {NVTX_TABLE} AS e
JOIN (
    SELECT DISTINCT d.globalTid >> {_PID_SHIFT} AS proc, d.domainId AS domain_id
    FROM {NVTX_TABLE} AS d LEFT JOIN {STRINGS_TABLE} AS ds ON ds.id = d.textId
    WHERE d.eventType = {NVTX_DOMAIN_CREATE} AND COALESCE(d.text, ds.value) = :domain
) AS dom ON dom.domain_id = e.domainId AND dom.proc = e.globalTid >> {_PID_SHIFT}
LEFT JOIN {STRINGS_TABLE} AS s ON s.id = e.textId
WHERE e.eventType IN ({NVTX_PUSH_POP_RANGE}, {NVTX_START_END_RANGE})
  AND e."end" IS NOT NULL AND e."end" >= e.start AND COALESCE(e.text, s.value) IS NOT NULL
ORDER BY e.start, e.rowid
"""

# Each range name's id: the rid of its first instance.
_NAME_IDS_SQL = """
UPDATE temp.nvtx_ranges SET sid = (SELECT MIN(f.rid) FROM temp.nvtx_ranges AS f WHERE f.name = nvtx_ranges.name)
"""

# Launch calls (runtime or driver API) of the threads that hold ranges, keyed for the kernel side's lookup.
_CALLS_SQL = f"""
INSERT OR IGNORE INTO temp.nvtx_calls (proc, corr, tid, launch)
SELECT globalTid >> {_PID_SHIFT}, correlationId, globalTid, start
FROM {RUNTIME_TABLE}
WHERE globalTid IN (SELECT tid FROM temp.nvtx_ranges) AND correlationId IS NOT NULL
"""

# Their kernels (a CUDA graph launch has many), keyed by (thread, launch-call start).
_LAUNCHES_SQL = f"""
INSERT INTO temp.nvtx_launches (tid, launch, krow, kstart, kstop, demangled, short)
SELECT c.tid, c.launch, k.rowid, k.start, k."end", k.demangledName, k.shortName
FROM {KERNEL_TABLE} AS k
JOIN temp.nvtx_calls AS c ON c.corr = k.correlationId AND c.proc = k.globalPid >> {_PID_SHIFT}
"""

# One row per (range instance, kernel launched inside it), in kernel start order within the instance.
_MEMBERS_SQL = """
INSERT INTO temp.nvtx_members (rid, kstart, krow, kstop, sid, demangled, short)
SELECT g.rid, l.kstart, l.krow, l.kstop, g.sid, l.demangled, l.short
FROM temp.nvtx_ranges AS g
JOIN temp.nvtx_launches AS l ON l.tid = g.tid AND l.launch BETWEEN g.start AND g.stop
"""

# Per range instance, folded row by row in kernel start order (SQLite inserts the rows of INSERT ... SELECT in the
# order of its ORDER BY; this UPSERT fold is ~2.5x faster than the equivalent window function): `busy` is the
# length of the union of the kernels' GPU intervals, each kernel adding only the part of it that ends after every
# kernel started before it (`reach`, the latest end so far) has ended.
_RANGE_STATS_SQL = """
INSERT INTO temp.nvtx_range_stats (rid, kernels, kernel_ns, first_start, last_end, reach, busy_ns)
SELECT rid, 1, kstop - kstart, kstart, kstop, kstop, kstop - kstart
FROM temp.nvtx_members WHERE true
ORDER BY rid, kstart, krow
ON CONFLICT (rid) DO UPDATE SET
    kernels = kernels + 1,
    kernel_ns = kernel_ns + excluded.kernel_ns,
    last_end = MAX(last_end, excluded.last_end),
    reach = MAX(reach, excluded.last_end),
    busy_ns = busy_ns + MAX(0, excluded.last_end - MAX(excluded.first_start, reach))
"""

_STAGES_SQL = """
SELECT g.name, COUNT(*), SUM(g.stop - g.start), TOTAL(s.kernel_ns), TOTAL(s.busy_ns),
       TOTAL(s.last_end - s.first_start), COALESCE(SUM(s.kernels), 0), MIN(g.start) AS first_start
FROM temp.nvtx_ranges AS g LEFT JOIN temp.nvtx_range_stats AS s ON s.rid = g.rid
{where}
GROUP BY g.name
ORDER BY first_start, g.name
"""

# Per-kernel totals, folded by UPSERT: over the whole trace, and per (range name, kernel).
_KERNEL_TOTALS_SQL = f"""
INSERT INTO temp.nvtx_kernel_totals (demangled, short, calls, total, low, high)
SELECT demangledName, shortName, 1, "end" - start, "end" - start, "end" - start
FROM {KERNEL_TABLE} WHERE true
ON CONFLICT (demangled, short) DO UPDATE SET
    calls = calls + 1, total = total + excluded.total, low = MIN(low, excluded.low), high = MAX(high, excluded.high)
"""

_STAGE_KERNELS_SQL = """
INSERT INTO temp.nvtx_stage_kernels (sid, demangled, short, calls, total, low, high)
SELECT sid, demangled, short, 1, kstop - kstart, kstop - kstart, kstop - kstart
FROM temp.nvtx_members WHERE true
ON CONFLICT (sid, demangled, short) DO UPDATE SET
    calls = calls + 1, total = total + excluded.total, low = MIN(low, excluded.low), high = MAX(high, excluded.high)
"""

# Top kernels by total time; `share_of` is the kernel time of every row selected (a window over the few rows).
_TOP_SQL = f"""
SELECT COALESCE(ss.value, ''), COALESCE(sd.value, ''), t.calls, t.total, t.low, t.high, t.share_of
FROM (
    SELECT demangled, short, calls, total, low, high, SUM(total) OVER () AS share_of
    FROM {{source}}
    ORDER BY total DESC, demangled, short
    LIMIT :n
) AS t
LEFT JOIN {STRINGS_TABLE} AS sd ON sd.id = t.demangled
LEFT JOIN {STRINGS_TABLE} AS ss ON ss.id = t.short
ORDER BY t.total DESC, t.demangled, t.short
"""

_TEMP_SCHEMA = """
CREATE TEMP TABLE nvtx_ranges (rid INTEGER PRIMARY KEY, name TEXT NOT NULL, tid INTEGER NOT NULL,
                               start INTEGER NOT NULL, stop INTEGER NOT NULL, sid INTEGER);
CREATE INDEX temp.nvtx_ranges_by_name ON nvtx_ranges (name);
CREATE TEMP TABLE nvtx_calls (proc INTEGER, corr INTEGER, tid INTEGER, launch INTEGER,
                              PRIMARY KEY (corr, proc)) WITHOUT ROWID;
CREATE TEMP TABLE nvtx_launches (tid INTEGER, launch INTEGER, krow INTEGER, kstart INTEGER, kstop INTEGER,
                                 demangled INTEGER, short INTEGER, PRIMARY KEY (tid, launch, krow)) WITHOUT ROWID;
CREATE TEMP TABLE nvtx_members (rid INTEGER, kstart INTEGER, krow INTEGER, kstop INTEGER, sid INTEGER,
                                demangled INTEGER, short INTEGER, PRIMARY KEY (rid, kstart, krow)) WITHOUT ROWID;
CREATE TEMP TABLE nvtx_range_stats (rid INTEGER PRIMARY KEY, kernels INTEGER, kernel_ns INTEGER,
                                    first_start INTEGER, last_end INTEGER, reach INTEGER, busy_ns INTEGER);
CREATE TEMP TABLE nvtx_kernel_totals (demangled INTEGER, short INTEGER, calls INTEGER, total INTEGER, low INTEGER,
                                      high INTEGER, PRIMARY KEY (demangled, short)) WITHOUT ROWID;
CREATE TEMP TABLE nvtx_stage_kernels (sid INTEGER, demangled INTEGER, short INTEGER, calls INTEGER, total INTEGER,
                                      low INTEGER, high INTEGER, PRIMARY KEY (sid, demangled, short)) WITHOUT ROWID;
"""

# TARGET_INFO_GPU column -> field of TraceGpu.
_DEVICE_KEYS = {
    "name": "name",
    "chipName": "chip",
    "id": "device_id",
    "busLocation": "bus",
    "totalMemory": "memory_bytes",
    "memoryBandwidth": "memory_bandwidth_bytes_per_s",
    "clockRate": "clock_hz",
    "smCount": "sm_count",
    "l2CacheSize": "l2_cache_bytes",
}


_FIX = (
    "Export the capture with `nsys export --type sqlite --output trace.sqlite trace.nsys-rep` "
    "(captured with --trace=cuda,nvtx) and pass the .sqlite file (or it gzipped, .sqlite.gz)"
)


def _gunzip(path: Path) -> Path:
    """`path` (gzip) decompressed into a temporary file, which the caller removes."""
    fd, name = tempfile.mkstemp(prefix=f"{path.stem}.", suffix=".sqlite")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path) as packed:
            shutil.copyfileobj(packed, out)
    except (OSError, EOFError) as exc:
        Path(name).unlink(missing_ok=True)
        raise UserError(f"{path} is not a readable gzip file ({exc})", _FIX) from None
    return Path(name)


class NsysTrace:
    """An nsys SQLite export, opened read-only; answers questions about the ranges of one NVTX domain. A gzipped
    export (`.gz`) is decompressed into a temporary file, removed on close."""

    def __init__(self, sqlite_path: Path, domain: str = vocab.NVTX_DOMAIN) -> None:
        self.path = Path(sqlite_path)
        self.domain = domain
        if not self.path.is_file():
            raise UserError(f"the nsys export {self.path} does not exist", _FIX)
        self._unpacked = _gunzip(self.path) if self.path.suffix == ".gz" else None
        try:
            self._conn = self._connect(self._unpacked or self.path)
        except BaseException:
            self._remove_unpacked()
            raise
        # TEMP tables live in a temporary file that SQLite keeps in this page cache until it outgrows it (a trace
        # of 1M kernels fits), so a huge trace spills to disk instead of exhausting memory.
        self._conn.execute("PRAGMA temp.cache_size = -262144")  # KiB
        self._built: set[str] = set()  # TEMP tables filled so far

    def _connect(self, database: Path) -> sqlite3.Connection:
        """A read-only connection to `database`, checked to be an nsys export with a CUDA trace."""
        conn = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
        try:
            self._tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise UserError(f"{self.path} is not an SQLite database ({exc})", _FIX) from None
        missing = [t for t in REQUIRED_TABLES if t not in self._tables]
        if missing:
            conn.close()
            raise UserError(
                f"{self.path} is not an Nsight Systems export with a CUDA trace: it has no {', '.join(missing)} "
                "table (nsys leaves the kernel tables out when no kernel ran)",
                _FIX,
            )
        return conn

    # ---- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (the TEMP tables go with it) and remove a decompressed copy."""
        self._conn.close()
        self._remove_unpacked()

    def _remove_unpacked(self) -> None:
        if self._unpacked is not None:
            self._unpacked.unlink(missing_ok=True)
            self._unpacked = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- questions ------------------------------------------------------------------------------------
    def device(self) -> TraceGpu:
        """The GPU that ran most kernels, from TARGET_INFO_GPU (all fields None when the export has none)."""
        if GPU_TABLE not in self._tables:
            return TraceGpu()
        cursor = self._conn.execute(
            f"""SELECT g.*, (SELECT COUNT(*) FROM {GPU_TABLE}) AS gpus_in_trace
            FROM {GPU_TABLE} AS g
            LEFT JOIN (SELECT deviceId, COUNT(*) AS n FROM {KERNEL_TABLE} GROUP BY deviceId) AS used
              ON used.deviceId = g.id
            ORDER BY COALESCE(used.n, 0) DESC, g.id
            LIMIT 1"""
        )
        row = cursor.fetchone()
        if row is None:
            return TraceGpu()
        values = dict(zip((c[0] for c in cursor.description), row, strict=True))
        info: dict[str, Any] = {key: values[col] for col, key in _DEVICE_KEYS.items() if values.get(col) is not None}
        if values.get("computeMajor") is not None and values.get("computeMinor") is not None:
            info["compute_capability"] = f"{values['computeMajor']}.{values['computeMinor']}"
        return TraceGpu(**info, gpus_in_trace=values["gpus_in_trace"])

    def stage_times(self) -> list[StageGpuTime]:
        """Every range name of the domain, in the order of its first start."""
        self._build("ranges")
        return [self._stage(row) for row in self._conn.execute(_STAGES_SQL.format(where=""))]

    def top_kernels(self, n: int, stage: str | None = None) -> list[KernelStat]:
        """The `n` kernels with the most GPU time inside `stage` (None: over every kernel of the trace). A kernel is
        one demangled name; `share` is its part of the kernel time of the stage (or of the trace)."""
        if stage is None:
            self._build("kernel_totals")
            sql = _TOP_SQL.format(source="temp.nvtx_kernel_totals")
            params: dict[str, Any] = {"n": n}
        else:
            self._build("stage_kernels")
            source = "temp.nvtx_stage_kernels WHERE sid = (SELECT MIN(rid) FROM temp.nvtx_ranges WHERE name = :stage)"
            sql, params = _TOP_SQL.format(source=source), {"n": n, "stage": stage}
        return [
            KernelStat(
                name=name,
                demangled=demangled,
                stage=stage,
                calls=calls,
                total_ms=total / _NS_PER_MS,
                mean_ms=total / calls / _NS_PER_MS,
                min_ms=low / _NS_PER_MS,
                max_ms=high / _NS_PER_MS,
                share=total / share_of if share_of else 0.0,
            )
            for name, demangled, calls, total, low, high, share_of in self._conn.execute(sql, params)
        ]

    def kernels_in(self, ranges: Sequence[str]) -> list[KernelStat]:
        """Every kernel launched inside the ranges `ranges` (which must not nest), merged per kernel, hottest first;
        `stage` is None and `share` is of their summed kernel time."""
        merged: dict[tuple[str, str], list[float]] = {}
        for stage in ranges:
            for k in self.top_kernels(_ALL, stage=stage):
                key = (k.name, k.demangled)
                calls, total, low, high = merged.get(key, [0, 0.0, float("inf"), 0.0])
                merged[key] = [calls + k.calls, total + k.total_ms, min(low, k.min_ms), max(high, k.max_ms)]
        grand = sum(v[1] for v in merged.values())
        out = [
            KernelStat(
                name=name,
                demangled=demangled,
                stage=None,
                calls=int(calls),
                total_ms=total,
                mean_ms=total / calls,
                min_ms=low,
                max_ms=high,
                share=total / grand if grand else 0.0,
            )
            for (name, demangled), (calls, total, low, high) in merged.items()
        ]
        return sorted(out, key=lambda k: (-k.total_ms, k.demangled, k.name))

    def stage_kernels(self, stage: str) -> list[KernelStat]:
        """Every kernel launched inside `stage`, hottest first."""
        return self.top_kernels(_ALL, stage=stage)

    def decode_steps(self, step_range: str = vocab.DECODE_STEP) -> DecodeStepStats | None:
        """Per-step averages over the instances of `step_range` (None when the trace has none)."""
        self._build("ranges")
        row = self._conn.execute(_STAGES_SQL.format(where="WHERE g.name = :name"), {"name": step_range}).fetchone()
        if row is None:
            return None
        stage = self._stage(row)
        return DecodeStepStats(
            steps=stage.instances,
            kernels_per_step=stage.kernels / stage.instances,
            mean_kernel_us=stage.kernel_ms * 1e3 / stage.kernels if stage.kernels else 0.0,
            step_wall_ms=stage.wall_ms / stage.instances,
            gpu_busy_fraction=stage.busy_fraction,
        )

    def instance_kernels(self, stage: str) -> list[int]:
        """Kernel launches inside each instance of range `stage`, in the order the instances start."""
        self._build("ranges")
        sql = """SELECT COALESCE(s.kernels, 0) FROM temp.nvtx_ranges AS g
                 LEFT JOIN temp.nvtx_range_stats AS s ON s.rid = g.rid
                 WHERE g.name = :name ORDER BY g.start, g.rid"""
        return [int(n) for (n,) in self._conn.execute(sql, {"name": stage})]

    def instance_intervals(self, stage: str) -> list[list[tuple[int, int]]]:
        """The GPU intervals ([start, end) in ns) of the kernels launched inside each instance of range `stage`, in
        the order the instances start."""
        self._build("ranges")
        sql = """SELECT m.rid, m.kstart, m.kstop FROM temp.nvtx_members AS m
                 JOIN temp.nvtx_ranges AS g ON g.rid = m.rid
                 WHERE g.name = :name ORDER BY g.start, g.rid, m.kstart"""
        instances: dict[int, list[tuple[int, int]]] = {}
        for rid, start, stop in self._conn.execute(sql, {"name": stage}):
            instances.setdefault(int(rid), []).append((int(start), int(stop)))
        return list(instances.values())

    def dram_samples(self) -> tuple[SampledRate, SampledRate] | None:
        """Nsight Systems' sampled DRAM read and write throughput of the first GPU sampled (`--gpu-metrics-devices`),
        or None when the trace has no such samples."""
        if not {GPU_METRICS_TABLE, GPU_METRICS_INFO_TABLE} <= self._tables:
            return None
        names = (READ_METRIC, WRITE_METRIC)
        ids = self._conn.execute(
            f"""SELECT metricName, metricId, typeId FROM {GPU_METRICS_INFO_TABLE}
                WHERE metricName IN (?, ?) ORDER BY typeId""",
            names,
        ).fetchall()
        first: dict[str, tuple[int, int]] = {}
        for name, metric, gpu in ids:
            first.setdefault(name, (int(metric), int(gpu)))
        if len(first) < len(names):
            return None
        sql = f"SELECT timestamp, value FROM {GPU_METRICS_TABLE} WHERE metricId = ? AND typeId = ? ORDER BY timestamp"
        rates = []
        for name in names:
            rows = self._conn.execute(sql, first[name]).fetchall()
            rates.append(SampledRate.from_samples([t for t, _ in rows], [float(v) for _, v in rows]))
        return rates[0], rates[1]

    def kernel_count(self) -> int:
        """Kernel launches in the whole trace."""
        (count,) = self._conn.execute(f"SELECT COUNT(*) FROM {KERNEL_TABLE}").fetchone()
        return int(count)

    # ---- internals ------------------------------------------------------------------------------------
    @staticmethod
    def _stage(row: tuple[Any, ...]) -> StageGpuTime:
        name, instances, wall_ns, kernel_ns, busy_ns, span_ns, kernels, _first = row
        return StageGpuTime(
            stage=name,
            instances=instances,
            wall_ms=wall_ns / _NS_PER_MS,
            kernel_ms=kernel_ns / _NS_PER_MS,
            gpu_busy_ms=busy_ns / _NS_PER_MS,
            span_ms=span_ns / _NS_PER_MS,
            kernels=kernels,
            busy_fraction=busy_ns / wall_ns if wall_ns else 0.0,
        )

    def _build(self, step: _Step) -> None:
        """Fill the TEMP tables `step` needs, once: "ranges": the domain's ranges, the kernels launched in them,
        per-instance statistics; "kernel_totals": per kernel over the trace; "stage_kernels": per (range, kernel)."""
        if step in self._built:
            return
        if not self._built:
            self._conn.executescript(_TEMP_SCHEMA)
            self._built.add("schema")
        if step == "stage_kernels":
            self._build("ranges")
        with self._conn:
            if step == "ranges":
                if NVTX_TABLE in self._tables:
                    self._conn.execute(_RANGES_SQL, {"domain": self.domain})
                for sql in (_NAME_IDS_SQL, _CALLS_SQL, _LAUNCHES_SQL, _MEMBERS_SQL, _RANGE_STATS_SQL):
                    self._conn.execute(sql)
            elif step == "kernel_totals":
                self._conn.execute(_KERNEL_TOTALS_SQL)
            else:
                self._conn.execute(_STAGE_KERNELS_SQL)
        self._built.add(step)

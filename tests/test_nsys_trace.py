"""NsysTrace on the real H100 export (cross-checked against the `nsys stats` CSVs of the same capture) and on small
hand-built exports in the same schema (overlapping kernels, other threads and processes, no NVTX, not nsys)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.nsight.nsys_stats import read_stats_csv
from llm_perf_opt.nsight.nsys_trace import KERNEL_TABLE, NVTX_TABLE, RUNTIME_TABLE, NsysTrace, StageGpuTime

FIXTURES = Path(__file__).parent / "fixtures" / "nsys"
DOMAIN = "llm_perf_opt"
STAGES = ["preprocess", "prefill", "vision/sam", "vision/encoder", "vision/projector", "decode", "decode/step"]
SCHEMA_TABLES = ("StringIds", NVTX_TABLE, RUNTIME_TABLE, KERNEL_TABLE, "TARGET_INFO_GPU")


def _csv(name: str) -> list[dict[str, Any]]:
    return read_stats_csv(FIXTURES / f"h100_tiny_{name}.csv")


def _by_range(rows: list[dict[str, Any]], key: str = "Range") -> dict[str, dict[str, Any]]:
    return {row[key].removeprefix(f"{DOMAIN}:"): row for row in rows if row[key].startswith(f"{DOMAIN}:")}


@pytest.fixture(scope="module")
def tiny_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nsys") / "h100_tiny.sqlite"
    with gzip.open(FIXTURES / "h100_tiny.sqlite.gz", "rb") as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


@pytest.fixture(scope="module")
def trace(tiny_sqlite: Path) -> Iterator[NsysTrace]:
    with NsysTrace(tiny_sqlite) as opened:
        yield opened


@pytest.fixture(scope="module")
def stages(trace: NsysTrace) -> dict[str, StageGpuTime]:
    return {s.stage: s for s in trace.stage_times()}


# ---- the real export ----------------------------------------------------------------------------------------


def test_device_comes_from_target_info(trace: NsysTrace) -> None:
    device = trace.device()
    assert device.name == "NVIDIA H100 80GB HBM3"
    assert device.sm_count == 132
    assert device.memory_bytes == 85017493504
    assert device.clock_hz == 1980000000
    assert device.memory_bandwidth_bytes_per_s == 3352320000000
    assert device.compute_capability == "9.0"
    assert device.gpus_in_trace == 1
    assert device.driver is None  # the trace does not hold it; the analysis adds env.json's


def test_stage_times_lists_the_domain_ranges_in_first_start_order(trace: NsysTrace) -> None:
    # The CCCL domain's cub::DeviceScan ranges on the same thread are left out.
    assert [s.stage for s in trace.stage_times()] == STAGES


def test_kernel_time_per_stage_matches_nvtx_kern_sum(stages: dict[str, StageGpuTime]) -> None:
    kernels: dict[str, int] = defaultdict(int)
    total_ns: dict[str, int] = defaultdict(int)
    for row in _csv("nvtx_kern_sum"):
        if row["NVTX Range"].startswith(f"{DOMAIN}:"):
            stage = row["NVTX Range"].removeprefix(f"{DOMAIN}:")
            kernels[stage] += row["Kern Inst"]
            total_ns[stage] += row["Total Time (ns)"]
    assert set(kernels) == set(STAGES)
    for stage in STAGES:
        assert stages[stage].kernels == kernels[stage], stage
        assert stages[stage].kernel_ms == pytest.approx(total_ns[stage] / 1e6, rel=0.01), stage
    # Every decode kernel runs inside a decode step.
    assert stages["decode"].kernels == stages["decode/step"].kernels == 1302


def test_instances_and_wall_time_match_nsys(stages: dict[str, StageGpuTime]) -> None:
    projection = _by_range(_csv("nvtx_gpu_proj_sum"))
    summary = _by_range(_csv("nvtx_sum"))
    for stage in STAGES:
        assert stages[stage].instances == projection[stage]["Range Instances"] == summary[stage]["Instances"]
        assert stages[stage].wall_ms == pytest.approx(projection[stage]["Total Range Time (ns)"] / 1e6, rel=0.01)
        assert stages[stage].wall_ms == pytest.approx(summary[stage]["Total Time (ns)"] / 1e6, rel=0.01)


def test_nsys_projected_time_is_the_kernel_span_not_the_busy_time(stages: dict[str, StageGpuTime]) -> None:
    projection = _by_range(_csv("nvtx_gpu_proj_sum"))
    for stage in STAGES:
        projected_ms = projection[stage]["Total Proj Time (ns)"] / 1e6
        if stage == "preprocess":
            # nsys projects copies too: preprocess's H2D copies outlast its 4 small kernels.
            assert stages[stage].span_ms < 0.8 * projected_ms
        else:
            assert stages[stage].span_ms == pytest.approx(projected_ms, rel=0.01), stage
    # Decode's projection is almost all gaps between kernels: busy is 2 % of it.
    assert stages["decode"].gpu_busy_ms < 0.05 * projection["decode"]["Total Proj Time (ns)"] / 1e6


def test_busy_time_is_the_union_of_kernel_intervals(tiny_sqlite: Path, stages: dict[str, StageGpuTime]) -> None:
    """An independent per-instance union in Python over the raw rows agrees with the SQL fold."""
    with sqlite3.connect(tiny_sqlite) as conn:
        ranges = conn.execute(
            f"""SELECT s.value, e.start, e."end", e.globalTid FROM {NVTX_TABLE} AS e JOIN StringIds AS s
            ON s.id = e.textId WHERE e.eventType = 59 AND e.domainId = 1"""
        ).fetchall()
        launches = conn.execute(
            f"""SELECT r.start, r.globalTid, k.start, k."end" FROM {KERNEL_TABLE} AS k
            JOIN {RUNTIME_TABLE} AS r ON r.correlationId = k.correlationId"""
        ).fetchall()
    busy_ns: dict[str, int] = defaultdict(int)
    for name, start, end, tid in ranges:
        intervals = sorted((ks, ke) for launch, t, ks, ke in launches if t == tid and start <= launch <= end)
        reach = -1  # end of the union so far
        for ks, ke in intervals:
            if ks >= reach:
                busy_ns[name] += ke - ks
            elif ke > reach:
                busy_ns[name] += ke - reach
            reach = max(reach, ke)
    for stage in STAGES:
        assert stages[stage].gpu_busy_ms == pytest.approx(busy_ns[stage] / 1e6, abs=1e-9), stage
        assert stages[stage].gpu_busy_ms <= stages[stage].span_ms
        assert stages[stage].busy_fraction == pytest.approx(stages[stage].gpu_busy_ms / stages[stage].wall_ms)


def test_top_kernels_over_the_trace_match_cuda_gpu_kern_sum(trace: NsysTrace) -> None:
    expected = _csv("cuda_gpu_kern_sum")
    top = trace.top_kernels(5)
    assert len(top) == 5
    for kernel, row in zip(top, expected[:5], strict=True):
        assert kernel.stage is None
        assert kernel.demangled == row["Name"]
        assert kernel.calls == row["Instances"]
        assert kernel.total_ms == pytest.approx(row["Total Time (ns)"] / 1e6, rel=0.01)
        assert kernel.min_ms == pytest.approx(row["Min (ns)"] / 1e6, rel=0.01)
        assert kernel.max_ms == pytest.approx(row["Max (ns)"] / 1e6, rel=0.01)
        assert kernel.share == pytest.approx(row["Time (%)"] / 100, abs=0.001)
        assert kernel.mean_ms == pytest.approx(kernel.total_ms / kernel.calls)
    # shortName is the base name that ncu -k matches: three of the top five are `elementwise_kernel` instances.
    assert [k.name for k in top].count("elementwise_kernel") == 3
    assert trace.kernel_count() == sum(row["Instances"] for row in expected) == 4153


def test_top_kernels_of_a_stage_match_nvtx_kern_sum(trace: NsysTrace) -> None:
    rows = [r for r in _csv("nvtx_kern_sum") if r["NVTX Range"] == f"{DOMAIN}:decode"]
    rows.sort(key=lambda r: -r["Total Time (ns)"])
    top = trace.top_kernels(5, stage="decode")
    for kernel, row in zip(top, rows[:5], strict=True):
        assert kernel.stage == "decode"
        assert kernel.demangled == row["Kernel Name"]
        assert kernel.calls == row["Kern Inst"]
        assert kernel.total_ms == pytest.approx(row["Total Time (ns)"] / 1e6, rel=0.01)
    every = trace.top_kernels(10_000, stage="decode")
    assert len(every) == len(rows)
    assert sum(k.share for k in every) == pytest.approx(1.0)
    assert sum(k.calls for k in every) == 1302


def test_top_kernels_of_an_unknown_stage_is_empty(trace: NsysTrace) -> None:
    assert trace.top_kernels(5, stage="no-such-stage") == []


def test_decode_steps(trace: NsysTrace, stages: dict[str, StageGpuTime]) -> None:
    steps = trace.decode_steps()
    assert steps is not None
    assert steps.steps == 6  # warm-up + measured run, 3 steps each (max_new_tokens=4)
    assert steps.kernels_per_step == pytest.approx(217.0)
    assert steps.mean_kernel_us == pytest.approx(2371.006 / 1302, rel=1e-6)
    assert steps.step_wall_ms == pytest.approx(120.742178 / 6, rel=1e-6)
    assert steps.gpu_busy_fraction == pytest.approx(stages["decode/step"].busy_fraction)
    assert trace.decode_steps("no-such-range") is None


def test_another_domain_is_analysed_on_its_own(tiny_sqlite: Path) -> None:
    range_name = "CCCL:cub::DeviceScan::InclusiveScan"
    rows = [r for r in _csv("nvtx_kern_sum") if r["NVTX Range"] == range_name]
    with NsysTrace(tiny_sqlite, domain="CCCL") as cccl:
        scans = {s.stage: s for s in cccl.stage_times()}
    assert set(scans) == {"cub::DeviceScan::ExclusiveScan", "cub::DeviceScan::InclusiveScan"}
    inclusive = scans["cub::DeviceScan::InclusiveScan"]
    assert inclusive.instances == 22
    assert inclusive.kernels == sum(r["Kern Inst"] for r in rows) == 44
    assert inclusive.kernel_ms == pytest.approx(sum(r["Total Time (ns)"] for r in rows) / 1e6, rel=0.01)
    projection = {r["Range"]: r for r in _csv("nvtx_gpu_proj_sum")}[range_name]
    assert inclusive.span_ms == pytest.approx(projection["Total Proj Time (ns)"] / 1e6, rel=0.01)


def test_the_export_is_left_untouched(tiny_sqlite: Path) -> None:
    before = hashlib.sha256(tiny_sqlite.read_bytes()).hexdigest()
    with NsysTrace(tiny_sqlite) as fresh:
        fresh.stage_times()
        fresh.top_kernels(3, stage="prefill")
        fresh.top_kernels(3)
    assert hashlib.sha256(tiny_sqlite.read_bytes()).hexdigest() == before
    assert not list(tiny_sqlite.parent.glob("*-journal"))


def test_closed_trace_refuses_queries(tiny_sqlite: Path) -> None:
    with NsysTrace(tiny_sqlite) as opened:
        assert opened.kernel_count() == 4153
    with pytest.raises(sqlite3.ProgrammingError):
        opened.kernel_count()


# ---- hand-built exports -------------------------------------------------------------------------------------

PID, OTHER_PID = 7, 8
GPID, OTHER_GPID = (1 << 48) | (PID << 24), (1 << 48) | (OTHER_PID << 24)
TID, OTHER_TID = GPID | 7, GPID | 9


def _build(path: Path, schema_from: Path, *, nvtx: bool = True) -> Path:
    """An export with the fixture's schema and a handful of rows whose answers are worked out by hand."""
    with sqlite3.connect(schema_from) as src:
        statements = [
            src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] for t in SCHEMA_TABLES
        ]
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    names = {
        "prefill": 1,
        "vision/sam": 2,
        "decode": 3,
        "decode/step": 4,
        "gemm": 10,
        "void gemm<1>(float *)": 11,
        "gemm2": 12,
        "void gemm<2>(float *)": 13,
        "copy": 14,
        "void copy(char *)": 15,
        "cudaLaunchKernel": 20,
    }
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in names.items()])
    if nvtx:
        conn.executemany(
            f"INSERT INTO {NVTX_TABLE} (start, end, eventType, text, textId, domainId, globalTid) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (0, None, 75, DOMAIN, None, 1, TID),
                (0, None, 75, "other", None, 2, TID),
                (1000, 2000, 59, None, 1, 1, TID),  # prefill
                (1100, 1500, 59, None, 2, 1, TID),  # vision/sam inside it
                (900, 2100, 59, None, 1, 2, TID),  # "prefill" of another domain: ignored
                (3000, 4000, 59, None, 3, 1, TID),  # decode
                (3000, 3400, 59, None, 4, 1, TID),  # decode/step 1
                (3500, 4000, 59, None, 4, 1, TID),  # decode/step 2
                (3000, None, 59, "decode", None, 1, TID),  # never ended: ignored
            ],
        )
    # (correlationId, launching thread, launch-call start, [(gpu start, gpu end, short, demangled, stream)])
    launches = [
        (1, TID, 1200, [(10000, 10100, 10, 11, 7)]),  # prefill + sam
        (2, TID, 1300, [(10050, 10200, 12, 13, 8)]),  # prefill + sam, overlaps the first by 50 ns
        (3, TID, 1600, [(10300, 10400, 10, 11, 7)]),  # prefill only
        (4, OTHER_TID, 1700, [(10400, 10500, 14, 15, 7)]),  # another thread: no stage
        (5, TID, 2500, [(10600, 10700, 14, 15, 7)]),  # between the ranges: no stage
        (6, TID, 3100, [(20000, 20300, 10, 11, 7)]),  # decode + step 1
        (7, TID, 3200, [(20100, 20250, 14, 15, 8)]),  # decode + step 1, inside the one before
        (8, TID, 3600, [(20500, 20600, 12, 13, 7)]),  # decode + step 2
        (9, TID, 3700, [(20700, 20800, 14, 15, 7), (20800, 20900, 14, 15, 7)]),  # a graph launch: two kernels
    ]
    for corr, tid, launch, kernels in launches:
        conn.execute(
            f"INSERT INTO {RUNTIME_TABLE} (start, end, eventClass, globalTid, correlationId, nameId, returnValue) "
            "VALUES (?, ?, 1, ?, ?, 20, 0)",
            (launch, launch + 50, tid, corr),
        )
        for start, end, short, demangled, stream in kernels:
            _kernel(conn, start, end, corr, GPID, short, demangled, stream)
    # Another process's kernel reusing correlationId 1 (ids are per process): it must not join prefill's launch.
    _kernel(conn, 30000, 30100, 1, OTHER_GPID, 14, 15, 7)
    conn.commit()
    conn.close()
    return path


def _kernel(
    conn: sqlite3.Connection, start: int, end: int, corr: int, gpid: int, short: int, demangled: int, stream: int
) -> None:
    conn.execute(
        f"""INSERT INTO {KERNEL_TABLE} (start, end, deviceId, contextId, streamId, correlationId, globalPid,
        demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ,
        staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)
        VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, ?)""",
        (start, end, stream, corr, gpid, demangled, short, corr),
    )


@pytest.fixture()
def built(tmp_path: Path, tiny_sqlite: Path) -> Iterator[NsysTrace]:
    with NsysTrace(_build(tmp_path / "built.sqlite", tiny_sqlite)) as opened:
        yield opened


def test_hand_built_attribution_busy_and_span(built: NsysTrace) -> None:
    got = {s.stage: s for s in built.stage_times()}
    assert list(got) == ["prefill", "vision/sam", "decode", "decode/step"]
    ns = 1e-6  # ms per ns
    expected = {
        # instances, wall, kernels, kernel time, busy (union), span
        "prefill": (1, 1000, 3, 350, 300, 400),
        "vision/sam": (1, 400, 2, 250, 200, 200),
        "decode": (1, 1000, 5, 750, 600, 900),
        "decode/step": (2, 900, 5, 750, 600, 700),
    }
    for stage, (instances, wall, kernels, kernel_ns, busy, span) in expected.items():
        s = got[stage]
        assert (s.instances, s.kernels) == (instances, kernels), stage
        assert s.wall_ms == pytest.approx(wall * ns), stage
        assert s.kernel_ms == pytest.approx(kernel_ns * ns), stage
        assert s.gpu_busy_ms == pytest.approx(busy * ns), stage
        assert s.span_ms == pytest.approx(span * ns), stage
        assert s.busy_fraction == pytest.approx(busy / wall), stage
    steps = built.decode_steps()
    assert steps is not None
    assert (steps.steps, steps.kernels_per_step) == (2, 2.5)
    assert steps.mean_kernel_us == pytest.approx(0.15)
    assert steps.step_wall_ms == pytest.approx(450 * ns)
    assert steps.gpu_busy_fraction == pytest.approx(600 / 900)


def test_hand_built_top_kernels(built: NsysTrace) -> None:
    overall = built.top_kernels(10)
    assert [(k.name, k.calls) for k in overall] == [("copy", 6), ("gemm", 3), ("gemm2", 2)]
    assert overall[0].total_ms == pytest.approx(650e-6)
    assert overall[1].min_ms == pytest.approx(100e-6)
    assert sum(k.share for k in overall) == pytest.approx(1.0)
    assert built.kernel_count() == 11
    decode = built.top_kernels(2, stage="decode")
    assert [(k.name, k.demangled, k.calls) for k in decode] == [
        ("copy", "void copy(char *)", 3),
        ("gemm", "void gemm<1>(float *)", 1),
    ]
    assert decode[0].share == pytest.approx(350 / 750)
    assert decode[1].max_ms == pytest.approx(300e-6)


@pytest.mark.parametrize("drop_table", [False, True])
def test_export_without_ranges_of_the_domain(tmp_path: Path, tiny_sqlite: Path, drop_table: bool) -> None:
    path = _build(tmp_path / "no_nvtx.sqlite", tiny_sqlite, nvtx=False)
    if drop_table:
        with sqlite3.connect(path) as conn:
            conn.execute(f"DROP TABLE {NVTX_TABLE}")
        conn.close()
    with NsysTrace(path) as opened:
        assert opened.stage_times() == []
        assert opened.decode_steps() is None
        assert opened.top_kernels(3, stage="decode") == []
        assert [k.name for k in opened.top_kernels(1)] == ["copy"]
    with NsysTrace(tiny_sqlite, domain="no_such_domain") as opened:
        assert opened.stage_times() == []


def test_sqlite_that_is_not_an_nsys_export(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
    conn.close()
    with pytest.raises(UserError, match=KERNEL_TABLE) as caught:
        NsysTrace(path)
    assert "nsys export --type sqlite" in caught.value.fix


def test_file_that_is_not_sqlite_or_is_missing(tmp_path: Path) -> None:
    report = tmp_path / "trace.nsys-rep"
    report.write_bytes(b"not a database, an nsys-rep perhaps" * 100)
    with pytest.raises(UserError, match="not an SQLite database"):
        NsysTrace(report)
    with pytest.raises(UserError, match="does not exist"):
        NsysTrace(tmp_path / "missing.sqlite")


def test_timed_pass_kernels_leave_out_the_build_and_warm_up(trace: NsysTrace, stages: dict[str, StageGpuTime]) -> None:
    """The report's overall kernel table sums the top-level ranges only: build and warm-up kernels run outside them."""
    from llm_perf_opt.nsight.stage2_analysis import Stage2Analysis
    from llm_perf_opt.records.stage2 import Capture

    timed = Stage2Analysis(Path("/nonexistent"), trace, Capture(run_id="x", mode="light")).timed_pass_kernels()
    in_ranges_ms = sum(stages[s].kernel_ms for s in ("preprocess", "prefill", "decode") if s in stages)
    whole_trace_ms = sum(k.total_ms for k in trace.top_kernels(1_000_000))
    assert sum(k.total_ms for k in timed) == pytest.approx(in_ranges_ms, rel=1e-9)
    assert in_ranges_ms < whole_trace_ms  # the capture also holds the model build and the warm-up pass
    assert sum(k.share for k in timed) == pytest.approx(1.0)
    assert [k.total_ms for k in timed] == sorted((k.total_ms for k in timed), reverse=True)


def test_a_gzipped_export_is_read_as_it_is(stages: dict[str, StageGpuTime], tmp_path: Path) -> None:
    """The .sqlite.gz answers as the unpacked export does; its temporary copy goes on close; a bad one fails clean."""
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("h100_tiny.sqlite.*.sqlite"))
    with NsysTrace(FIXTURES / "h100_tiny.sqlite.gz") as packed:
        assert {s.stage: s for s in packed.stage_times()} == stages
        unpacked = packed._unpacked
        assert unpacked is not None and unpacked.is_file()
    assert not unpacked.exists()
    assert set(Path(tempfile.gettempdir()).glob("h100_tiny.sqlite.*.sqlite")) == before
    damaged = tmp_path / "report.sqlite.gz"
    damaged.write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="not a readable gzip file"):
        NsysTrace(damaged)

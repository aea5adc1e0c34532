"""Parse `ncu --import <rep> --csv --page raw` into per-kernel roofline figures.

The raw page has a header row, a units row (`us`, `Kbyte`, `Gbyte/s`, `%`, ...; ncu scales units per column), then
one row per profiled launch. Values are converted to base units (seconds, bytes, bytes/s, FLOPs) and launches are
averaged per kernel: per bare function name (the one name form nsys and ncu spell alike) and NVTX range.

FLOPs follow the SpeedOfLight roofline convention (an FMA is 2 FLOPs): `sm__sass_thread_inst_executed_op_{h,f,d}
{add,mul,fma}_pred_on.sum`, else the section's per-cycle rates times elapsed cycles, plus tensor-core work from
`sm__ops_path_tensor_src_<fp*|bf16|tf32>*.sum` (ncu counts those ops as FLOPs). The `derived__sm__..._x2` columns
are PEAK rates (2 x `.peak_sustained`) and are never used as work. Without tensor metrics, FLOPs cover CUDA-core
work only.

Bound labels (`classify_bound`) come from Nsight Compute's speed-of-light breakdown: the SM throughput
(`sm__throughput`, the busiest SM pipeline, the tensor pipe for a GEMM) and the memory throughput
(`gpu__compute_memory_throughput`, the busiest of DRAM, L2 and L1), each in % of its peak:

- the higher of the two >= `BOUND_PCT` (60%, the level below which ncu's own SOL rule speaks of latency):
  that unit, "compute" or "memory" (ties: compute);
- both < `LATENCY_PCT` (40%): "latency": neither unit is busy even 40% of the time, so launch overhead,
  dependencies or too few warps set the time, not a throughput limit;
- in between: the busier unit with a qualifier, "compute-leaning" or "memory-leaning": that unit does most of
  the work but is not saturated (a GEMM at 57% of tensor peak is compute-leaning, not latency-bound; ncu would
  add a latency hint, which still applies);
- one figure missing: that unit when it is >= 60%, else "unknown" (a low figure says nothing of the other unit).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage2 import NcuKernel
from llm_perf_opt.records.vocabulary import NVTX_DOMAIN

BOUND_PCT = 60.0
LATENCY_PCT = 40.0
COMPUTE = "compute"
MEMORY = "memory"
COMPUTE_LEANING = "compute-leaning"
MEMORY_LEANING = "memory-leaning"
LATENCY = "latency"
UNKNOWN = "unknown"

DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
DRAM_TOTAL = "dram__bytes.sum"
DRAM_RATE = "dram__bytes.sum.per_second"
SM_THROUGHPUT = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
MEMORY_THROUGHPUT = (
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
)
_KERNEL_NAME_COLUMNS = ("Kernel Name", "Function Name", "Demangled Name")
_FLOP_OPS = tuple((p, op, 2.0 if op == "fma" else 1.0) for p in "hfd" for op in ("add", "mul", "fma"))
_TENSOR_RE = re.compile(
    r"^sm__ops_path_tensor_src_(?P<src>(?:fp|bf|tf)[a-z0-9_]*?)(?P<sparsity>_sparsity_o(?:n|ff))?"
    r"\.sum(?P<rate>\.per_cycle_elapsed)?$"
)
_ANON_NAMESPACE_RE = re.compile(r"\(anonymous namespace\)::|`anonymous namespace'::|<?unnamed>::")

_SI = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
_TIME |= {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
_BASE_UNITS = {"byte", "inst", "cycle", "hz", "warp", "thread", "block", "sector", "request", "wavefront", "pass"}
_BASE_UNITS |= {"op", "flop", "register", "transaction", "sm"}


# ---- names -------------------------------------------------------------------------------------------------


def kernel_base_name(name: str) -> str:
    """The qualified function name: `void at::native::foo<int, 4>(int, T3)` -> `at::native::foo`, without
    anonymous-namespace markers (`<unnamed>::`, `(anonymous namespace)::`, ncu's truncated `unnamed>::`)."""
    text = _ANON_NAMESPACE_RE.sub("", name.strip())
    out: list[str] = []
    angle = paren = 0
    for char in text:
        if char == "<":
            angle += 1
        elif char == ">":
            angle = max(0, angle - 1)
        elif char == "(":
            if angle == 0 and paren == 0 and "".join(out).strip():
                break  # the parameter list
            paren += 1
        elif char == ")":
            paren = max(0, paren - 1)
        elif angle == 0 and paren == 0:
            out.append(char)
    tokens = "".join(out).split()
    return tokens[-1] if tokens else name.strip()


def function_name(name: str) -> str:
    """The bare function name (ncu's default `--kernel-name-base function`): `void at::native::foo<4>(int)` -> `foo`."""
    return kernel_base_name(name).rsplit("::", 1)[-1] or name.strip()


def _nvtx_entries(cell: str, lead_fields: int) -> list[tuple[str | None, str]]:
    """(domain, range) of each range of ncu's NVTX cell, outermost first. The cell reads
    `tid  "domain:range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"  ...` for push/pop ranges (`lead_fields` 1: the
    domain) and `"id:domain:range:..."` for start/stop ranges (`lead_fields` 2)."""
    out: list[tuple[str | None, str]] = []
    for entry in re.findall(r'"([^"]*)"', cell):
        parts = entry.split(":")
        if len(parts) < lead_fields + 7:
            if entry:
                out.append((None, entry))
            continue
        colons = (len(parts) - lead_fields - 7) // 2  # the range and its message carry the same colons
        name = ":".join(parts[lead_fields : lead_fields + 1 + colons])
        if name:
            out.append((parts[lead_fields - 1], name))
    return out


def _nvtx_lead(column: str) -> int:
    """The `lead_fields` of an NVTX column (1: push/pop ranges, 2: start/stop ranges), 0 for any other column."""
    return 1 if "Push/Pop_Range" in column else 2 if "Start/Stop_Range" in column else 0


def nvtx_stack(table: Table, row: Sequence[str], domain: str) -> tuple[str, ...]:
    """The NVTX ranges of `domain` open around a launch, outermost first (push/pop ranges, then start/stop)."""
    stack: list[str] = []
    for column in table.header:
        if lead := _nvtx_lead(column):
            stack.extend(name for dom, name in _nvtx_entries(row[table.index[column]], lead) if dom == domain)
    return tuple(stack)


# ---- units and numbers -----------------------------------------------------------------------------------


def _unit_factor(token: str) -> float:
    token = token.strip()
    if token in _TIME:
        return _TIME[token]
    if token.lower() in _BASE_UNITS:
        return 1.0
    if token[:2] in _BINARY and token[2:].lower() in _BASE_UNITS:
        return _BINARY[token[:2]]
    if token[:1] in _SI and token[1:].lower() in _BASE_UNITS:
        return _SI[token[:1]]
    return 1.0


def unit_scale(unit: str) -> float:
    """Factor to base units: `Kbyte` -> 1e3, `us` -> 1e-6, `Gbyte/s` -> 1e9, `cycle/nsecond` -> 1e9, `%` -> 1."""
    numerator, _, denominator = unit.strip().partition("/")
    scale = _unit_factor(numerator) if numerator else 1.0
    return scale / _unit_factor(denominator) if denominator else scale


def parse_number(text: str) -> float | None:
    """`1,234.5` -> 1234.5; empty, `n/a` or non-numeric -> None."""
    cleaned = text.strip().replace(",", "")
    if not cleaned:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# ---- the table -------------------------------------------------------------------------------------------


@attrs.define
class Table:
    """The header of an ncu raw-page CSV with each column's factor to base units."""

    header: list[str]
    scales: list[float]
    index: dict[str, int]

    def value(self, row: Sequence[str], column: str) -> float | None:
        at = self.index.get(column)
        if at is None:
            return None
        number = parse_number(row[at])
        return None if number is None else number * self.scales[at]

    def first(self, row: Sequence[str], columns: Sequence[str]) -> float | None:
        return next((v for column in columns if (v := self.value(row, column)) is not None), None)


@attrs.define
class _Launch:
    name: str
    full_name: str
    nvtx_range: str | None
    duration_s: float
    dram_bytes: float
    flops: float | None
    sm_pct: float | None
    mem_pct: float | None
    ranges: tuple[str, ...] = ()  # the toolkit's NVTX ranges open around the launch, outermost first


def _csv_rows(text: str, source: str) -> list[list[str]]:
    """The CSV rows of ncu's output, without `==PROF==`-style console lines and anything before the header."""
    lines = text.splitlines()
    errors = [line for line in lines if line.startswith("==ERROR==")]
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line or line.startswith('"ID"')), None)
    if start is None:
        if any(line.strip() and not line.startswith("==") for line in lines):
            raise UserError(
                f"{source} is not an ncu raw-page CSV (no header with an ID / Kernel Name column)",
                "Export it with `ncu --import <report>.ncu-rep --csv --page raw`",
            )
        if errors:
            raise UserError(
                f"ncu wrote no metrics to {source}: " + " ".join(errors[-3:]),
                "Read the ncu log next to it; rerun the Stage 2 capture once the error is fixed",
            )
        return []
    kept = [line for line in lines[start:] if line.strip() and not line.startswith("==")]
    return list(csv.reader(kept))


def _make_table(header: list[str], units: list[str], source: str) -> Table:
    name_at = next((header.index(c) for c in _KERNEL_NAME_COLUMNS if c in header), None)
    if name_at is None:
        raise UserError(f"{source} has no Kernel Name column", "Export it with `ncu --import <rep> --csv --page raw`")
    looks_like_units = (
        len(units) == len(header)
        and units[name_at].strip() == ""
        and ("ID" not in header or units[header.index("ID")].strip() == "")
        and all(parse_number(u) is None for u in units if u.strip())
    )
    if not looks_like_units:
        raise UserError(
            f"{source} has no units row after its header (unexpected ncu CSV format)",
            "Export it with `ncu --import <rep> --csv --page raw` (without --print-units or "
            "--print-metric-name options that change the layout)",
        )
    return Table(header=header, scales=[unit_scale(u) for u in units], index={h: i for i, h in enumerate(header)})


def read_table(text: str, source: str) -> tuple[Table, list[list[str]]]:
    """The table of an ncu raw-page CSV's text and its launch rows (a table without rows when nothing was
    profiled)."""
    rows = _csv_rows(text, source)
    if len(rows) < 2:
        return Table(header=[], scales=[], index={}), []
    return _make_table(rows[0], rows[1], source), rows[2:]


def launch_name(table: Table, row: Sequence[str]) -> str:
    """ncu's full name of the launch in `row`."""
    return next(row[table.index[c]] for c in _KERNEL_NAME_COLUMNS if c in table.index).strip()


def check_width(table: Table, row: Sequence[str], number: int, source: str) -> None:
    """A UserError when launch row `number` does not have the header's number of fields."""
    if len(row) != len(table.header):
        raise UserError(
            f"{source}: launch row {number} has {len(row)} fields, the header {len(table.header)}",
            "The export is truncated or not an ncu raw-page CSV; export it again with "
            "`ncu --import <rep> --csv --page raw`",
        )


def _elapsed_cycles(table: Table, row: Sequence[str], unit: str, duration_s: float) -> float | None:
    if (cycles := table.value(row, f"{unit}__cycles_elapsed.avg")) is not None:
        return cycles
    hz = table.first(row, [f"{prefix}__cycles_elapsed.avg.per_second" for prefix in (unit, "smsp", "sm", "gpc")])
    return None if hz is None else hz * duration_s


def _tensor_flops(table: Table, row: Sequence[str], duration_s: float) -> float | None:
    """Tensor-core FLOPs from `sm__ops_path_tensor_src_*` (counts, else per-cycle rates x elapsed cycles)."""
    by_src: dict[str, dict[tuple[bool, bool], list[str]]] = {}
    for column in table.header:
        if match := _TENSOR_RE.match(column):
            kinds = by_src.setdefault(match["src"], {})
            kinds.setdefault((bool(match["rate"]), bool(match["sparsity"])), []).append(column)
    total, found = 0.0, False
    for kinds in by_src.values():
        for key in ((False, False), (False, True), (True, False), (True, True)):
            values = [v for c in kinds.get(key, []) if (v := table.value(row, c)) is not None]
            if not values:
                continue
            amount = sum(values)
            if key[0]:
                cycles = _elapsed_cycles(table, row, "sm", duration_s)
                if cycles is None:
                    continue
                amount *= cycles
            total, found = total + amount, True
            break
    return total if found else None


def _launch_flops(table: Table, row: Sequence[str], duration_s: float) -> float | None:
    total, found = 0.0, False
    for precision, op, weight in _FLOP_OPS:
        stem = f"sass_thread_inst_executed_op_{precision}{op}_pred_on"
        count = table.first(row, (f"sm__{stem}.sum", f"smsp__{stem}.sum"))
        if count is None:
            rate = table.value(row, f"smsp__{stem}.sum.per_cycle_elapsed")
            if rate is None and op == "fma":
                doubled = table.value(row, f"derived__smsp__{stem}_x2")  # achieved rate x 2 (the peak is derived__sm__)
                rate = None if doubled is None else doubled / 2
            cycles = None if rate is None else _elapsed_cycles(table, row, "smsp", duration_s)
            count = None if rate is None or cycles is None else rate * cycles
        if count is not None:
            total, found = total + weight * count, True
    tensor = _tensor_flops(table, row, duration_s)
    if tensor is not None:
        total, found = total + tensor, True
    return total if found else None


def _launch(table: Table, row: list[str], number: int, source: str) -> _Launch:
    check_width(table, row, number, source)
    full = launch_name(table, row)
    duration = table.value(row, DURATION)
    if duration is None:
        raise UserError(
            f"{source}: launch {number} ({function_name(full)}) has no {DURATION}",
            f"Collect it: add {DURATION} to pipeline.ncu.metrics or profile with --section SpeedOfLight",
        )
    read, write = table.value(row, DRAM_READ), table.value(row, DRAM_WRITE)
    if read is not None and write is not None:
        dram: float | None = read + write
    else:
        dram = table.value(row, DRAM_TOTAL)
        if dram is None:
            rate = table.value(row, DRAM_RATE)
            dram = None if rate is None else rate * duration
    if dram is None:
        raise UserError(
            f"{source}: launch {number} ({function_name(full)}) has no DRAM byte counts",
            f"Collect them: add {DRAM_READ} and {DRAM_WRITE} to pipeline.ncu.metrics",
        )
    # the innermost range of the first NVTX column that has one, push/pop columns before start/stop ones
    columns = sorted((lead, at) for at, column in enumerate(table.header) if (lead := _nvtx_lead(column)))
    innermost = (_nvtx_entries(row[at], lead) for lead, at in columns)
    nvtx = next((entries[-1][1] for entries in innermost if entries), None)
    return _Launch(
        name=function_name(full),
        full_name=full,
        nvtx_range=nvtx,
        duration_s=duration,
        dram_bytes=dram,
        flops=_launch_flops(table, row, duration),
        sm_pct=table.first(row, SM_THROUGHPUT),
        mem_pct=table.first(row, MEMORY_THROUGHPUT),
        ranges=nvtx_stack(table, row, NVTX_DOMAIN),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _time_weighted(launches: Sequence[_Launch], pct: str) -> float | None:
    """A throughput (% of peak) over launches, each weighted by its duration: the share of the kernel's time the
    unit was busy, when launches of several shapes (launch configurations) differ in length."""
    present = [(getattr(x, pct), x.duration_s) for x in launches if getattr(x, pct) is not None]
    total = sum(d for _, d in present)
    if not present:
        return None
    if total <= 0:
        return _mean([v for v, _ in present])
    return sum(v * d for v, d in present) / total


def classify_bound(sm_pct: float | None, mem_pct: float | None) -> str:
    """The bound label of SpeedOfLight SM and memory throughputs (% of peak); the rule is in the module docstring."""
    if sm_pct is None or mem_pct is None:
        known = sm_pct if mem_pct is None else mem_pct
        if known is None or known < BOUND_PCT:
            return UNKNOWN
        return COMPUTE if mem_pct is None else MEMORY
    busiest = max(sm_pct, mem_pct)
    compute_side = sm_pct >= mem_pct
    if busiest >= BOUND_PCT:
        return COMPUTE if compute_side else MEMORY
    if busiest < LATENCY_PCT:
        return LATENCY
    return COMPUTE_LEANING if compute_side else MEMORY_LEANING


def _kernel(launches: list[_Launch]) -> NcuKernel:
    n = len(launches)
    duration = sum(x.duration_s for x in launches) / n
    dram = sum(x.dram_bytes for x in launches) / n
    flops = _mean([x.flops for x in launches])
    sm_pct, mem_pct = _time_weighted(launches, "sm_pct"), _time_weighted(launches, "mem_pct")
    longest = max(launches, key=lambda x: x.duration_s)
    return NcuKernel(
        name=longest.name,
        full_name=longest.full_name,
        launches=n,
        duration_s=duration,
        dram_bytes=dram,
        flops=flops,
        achieved_tflops=None if flops is None or duration <= 0 else flops / duration / 1e12,
        dram_gbps=dram / duration / 1e9 if duration > 0 else 0.0,
        arithmetic_intensity=None if flops is None or dram <= 0 else flops / dram,
        sm_throughput_pct=sm_pct,
        dram_throughput_pct=mem_pct,
        bound=classify_bound(sm_pct, mem_pct),
        nvtx_range=longest.nvtx_range,
        variants=len({x.full_name for x in launches}),
    )


def parse_ncu_raw_csv(text: str, source: str = "ncu raw CSV", *, within: str | None = None) -> list[NcuKernel]:
    """Kernels from the text of an ncu raw-page CSV, by total time (duration x launches) descending; `within`: only
    launches inside that NVTX range of the toolkit's domain (one stage of an export that holds several). No profiled
    launch (an empty export, or a header without rows) gives []."""
    table, rows = read_table(text, source)
    groups: dict[tuple[str, str | None], list[_Launch]] = {}
    for number, row in enumerate(rows, start=1):
        launch = _launch(table, row, number, source)
        if within is not None and within not in launch.ranges:
            continue
        groups.setdefault((launch.name, launch.nvtx_range), []).append(launch)
    kernels = [_kernel(launches) for launches in groups.values()]
    return sorted(kernels, key=lambda k: (-k.duration_s * k.launches, k.name))


def read_ncu_raw_csv(path: Path, *, within: str | None = None) -> list[NcuKernel]:
    """Kernels from `ncu --import <rep> --csv --page raw` output saved at `path` (see :func:`parse_ncu_raw_csv`)."""
    path = Path(path)
    return parse_ncu_raw_csv(path.read_text(encoding="utf-8", errors="replace"), source=str(path), within=within)

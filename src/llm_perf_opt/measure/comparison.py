"""The figures of `perf-compare`: loaded run folders of one kind, set against the first one (the baseline).

Per-stage p50 ratios with noise verdicts, MFU/MBU per stage, the operators or kernels that moved most and the
configuration fields that differ, computed into a `Comparison` record (`records.comparison`); `report.comparison`
renders it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple, TypeVar

import attrs

from llm_perf_opt.kernel_names import kernel_label, short_kernel_name
from llm_perf_opt.measure import host_difference
from llm_perf_opt.measure.noise import noise_verdict
from llm_perf_opt.measure.thresholds import (
    ENERGY_TOLERANCE,
    FIRST_PASS_TOLERANCE,
    MEMORY_TOLERANCE,
    first_pass_floor_ms,
    same_setup_cost,
)
from llm_perf_opt.measure.throughput import run_pages
from llm_perf_opt.measure.variation import BOTH_SIDES, GPU_SIDE
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.comparison import (
    STAGE1,
    STAGE2,
    BusyChange,
    BusyRow,
    ComparedRun,
    Comparison,
    EfficiencyRow,
    FieldDifference,
    Mover,
    MoverTable,
    RateChange,
    RateRow,
    ResourceRow,
    RunTotals,
    Skipped,
    Stage1Comparison,
    Stage2Comparison,
    StageChange,
    StageTimeRow,
)
from llm_perf_opt.records.folders import Stage1Folder, Stage2Folder, env_gpu
from llm_perf_opt.records.stage1 import ModelInfo, RunSettings, RuntimeRecord, Stage1Metrics

TOP_MOVERS = 10
NA = "n/a"
DEFAULT_OPERATOR_KEY = "self_device_ms"
KERNEL_KEY = "total_ms"

T = TypeVar("T")
F = TypeVar("F", Stage1Folder, Stage2Folder)
R = TypeVar("R")
Labelled = tuple[str, F]  # a run's label and its folder
Field = tuple[str, Callable[[T], object]]  # a configuration field's name and how to read it from a folder


@attrs.frozen
class Run:
    """One usable run folder and its label in the tables."""

    path: Path
    label: str
    folder: Stage1Folder | Stage2Folder

    @property
    def kind(self) -> str:
        return str(self.folder.kind)


# --------------------------------------------------------------------------------------------- shared


def ratio(value: float | None, base: float | None) -> float | None:
    """`value / base`, or None when either is unknown or the base is 0."""
    return None if value is None or not base else value / base


def union(keys_per_run: Iterable[Iterable[str]]) -> list[str]:
    """Keys in first-seen order: the baseline's order, then what only later runs have."""
    return list(dict.fromkeys(key for keys in keys_per_run for key in keys))


def _shown(value: object) -> str:
    """A configuration value as the differences table shows it (mappings and lists as sorted JSON)."""
    if value is None:
        return NA
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value if not isinstance(value, Mapping) else dict(value), sort_keys=True)
    return str(value)


def differences(runs: Sequence[Labelled[F]], fields: Sequence[Field[F]]) -> tuple[FieldDifference, ...]:
    """The fields whose shown value is not the same in every run."""
    shown = ((name, tuple(_shown(pick(folder)) for _, folder in runs)) for name, pick in fields)
    return tuple(FieldDifference(name, values) for name, values in shown if len(set(values)) > 1)


# The runtime settings a run records (`RuntimeRecord`), each compared as `runtime.<name>`; run.batch_size is its
# own row and the label only words them.
RUNTIME_SETTINGS = tuple(f.name for f in attrs.fields(RuntimeRecord) if f.name not in ("batch_size", "label"))
ABSENT = "(absent)"


# Each recorded run setting a comparison lists under its config key, and how to read it from `RunSettings`.
RUN_SETTINGS: tuple[tuple[str, Callable[[RunSettings], object]], ...] = (
    ("run.fill_batches", attrgetter("fill_batches")),
    *((f"runtime.{name}", attrgetter(f"runtime.{name}")) for name in RUNTIME_SETTINGS),
)


def run_setting_fields(settings: Callable[[R], RunSettings | None]) -> list[Field[R]]:
    """The counts (repeats, warmup, ...), then the fields of `RUN_SETTINGS`, read from a run's (or its workload's)
    `RunSettings` (None when it has none)."""

    def field(read: Callable[[RunSettings], object]) -> Callable[[R], object]:
        return lambda f: None if (s := settings(f)) is None else read(s)

    counts = ("repeats", "warmup", "max_new_tokens", "max_images", "batch_size")
    return [(key, field(attrgetter(key))) for key in counts] + [(key, field(read)) for key, read in RUN_SETTINGS]


def flat_config(config: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """A nested configuration as dotted keys and leaf values (`{"run": {"warmup": 2}}` -> `{"run.warmup": 2}`)."""
    leaves: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(flat_config(value, name + "."))
        else:
            leaves[name] = value
    return leaves


# Config keys that change nothing a run measures: never listed as a difference (where a run kept its saved model).
UNCOMPARED_CONFIG_KEYS = frozenset({"model.cache_dir"})


def config_differences(configs: Sequence[Mapping[str, object]], shown: Iterable[str]) -> tuple[FieldDifference, ...]:
    """Every key of the runs' `config.yaml` whose value differs, except the keys `shown` among the settings rows
    (a key one run lacks reads "(absent)"); none unless every run has its `config.yaml`."""
    if len(configs) < 2 or not all(configs):
        return ()
    skip = set(shown) | UNCOMPARED_CONFIG_KEYS
    flat = [flat_config(c) for c in configs]
    rows = []
    for key in union(flat):
        values = tuple(("null" if f[key] is None else _shown(f[key])) if key in f else ABSENT for f in flat)
        if key not in skip and len(set(values)) > 1:
            rows.append(FieldDifference(key, values))
    return tuple(rows)


class Entry(NamedTuple):
    """An operator or kernel of one run, as `movers` weighs it."""

    name: str  # as the table shows it
    calls: int
    ms: float | None


def movers(base: Mapping[str, Entry], other: Mapping[str, Entry]) -> tuple[Mover, ...]:
    """The entries (by key) whose time moved most by absolute difference, largest first (top TOP_MOVERS); an entry
    missing from one run counts as 0 there."""
    either = {**other, **base}  # the baseline's entry where it has one
    moved = []
    for key in union([base, other]):
        a, b = base.get(key), other.get(key)
        ms_a = None if a is None else a.ms
        ms_b = None if b is None else b.ms
        if (ms_b or 0.0) != (ms_a or 0.0):
            moved.append(
                Mover(
                    name=either[key].name,
                    base_calls=None if a is None else a.calls,
                    other_calls=None if b is None else b.calls,
                    base_ms=ms_a,
                    other_ms=ms_b,
                    delta_ms=(ms_b or 0.0) - (ms_a or 0.0),
                )
            )
    moved.sort(key=lambda m: abs(m.delta_ms), reverse=True)
    return tuple(moved[:TOP_MOVERS])


def _short_digest(value: str | None) -> str | None:
    """`sha256:f0cbc3e2…` -> its first 12 hex digits (enough to tell two digests apart)."""
    return value.split(":", 1)[-1][:12] if value else None


# --------------------------------------------------------------------------------------------- Stage 1


STAGE1_FIELDS: list[Field[Stage1Folder]] = [
    ("model", lambda f: f.metrics.model.name),
    ("parameters", lambda f: f.metrics.model.parameters),
    ("weights", lambda f: f.metrics.model.weights),
    ("dtype", lambda f: f.metrics.model.dtype),
    ("attn implementation", lambda f: f.metrics.model.attn_implementation),
    ("experts implementation", lambda f: f.metrics.model.experts_implementation),
    ("preprocess", lambda f: f.metrics.model.preprocess),
    ("device type", lambda f: f.metrics.device.type),
    ("device", lambda f: f.metrics.device.name),
    ("timing method", lambda f: f.metrics.device.timing_method),
    ("torch", lambda f: f.env.get("torch")),
    ("transformers", lambda f: f.env.get("transformers")),
    ("python", lambda f: f.env.get("python")),
    ("CUDA runtime", lambda f: f.env.get("cuda_runtime")),
    ("GPU driver", lambda f: env_gpu(f.env).get("driver")),
    ("torch threads", lambda f: f.env.get("torch_threads")),
    ("TF32 matmul", lambda f: f.env.get("tf32_matmul")),
    *run_setting_fields(attrgetter("metrics.settings")),
    ("partial run", lambda f: f.metrics.settings.partial),
    ("operator sort key", lambda f: f.metrics.operator_sort_key),
    ("config digest", lambda f: _short_digest(f.metrics.config_digest)),
]

# The config.yaml keys the rows above already show (as the run's effective values): not listed again.
SETTINGS_CONFIG_KEYS = frozenset(
    {
        "model.name",
        "model.dtype",
        "model.attn_implementation",
        "model.experts_implementation",
        "device",
        "run.repeats",
        "run.warmup",
        "infer.max_new_tokens",
        "dataset.max_images",
        "run.batch_size",
        *(key for key, _ in RUN_SETTINGS),
    }
)


def operator_key(folder: Stage1Folder) -> str:
    """The operator column a Stage 1 run ranked by: device time on a GPU, CPU time on a CPU."""
    return folder.metrics.operator_sort_key or DEFAULT_OPERATOR_KEY


def _operators(folder: Stage1Folder, key: str) -> dict[str, Entry]:
    """The profiled pass's operators by name, each timed by the column `key` (an OperatorRow field named by the
    run's `operator_sort_key`)."""
    entries = {}
    for row in folder.metrics.top_operators:
        value = getattr(row, key, None)
        ms = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        entries[row.name] = Entry(row.name, row.calls, ms)
    return entries


def stage_times(runs: Sequence[Labelled[Stage1Folder]]) -> tuple[StageTimeRow, ...]:
    """p50 of every stage per run, its ratio to the baseline's, whether it moved beyond the recorded noise, and
    whether the hosts differed under a stage not known to be GPU-paced."""
    (_, base), others = runs[0], runs[1:]
    hosts = [host_difference.host_figures(f.metrics.host_usage) for _, f in runs]
    hosts_differ = [bool(host_difference.differing(hosts[0], other)) for other in hosts[1:]]
    nested = {s.stage: s.nested_in for _, f in runs for s in f.metrics.stages}  # the last run that has it decides
    rows = []
    for stage, nested_in in nested.items():
        stats = [f.metrics.stage_stat(stage) for _, f in runs]
        summaries = [None if s is None else s.summary for s in stats]
        p50s = [None if s is None else s.p50 for s in summaries]
        changes = []
        for (_, folder), summary, p50, host_differs in zip(others, summaries[1:], p50s[1:], hosts_differ, strict=True):
            side = verdict_side(base.metrics, folder.metrics, stage)
            changes.append(
                StageChange(
                    p50_ms=p50,
                    ratio=ratio(p50, p50s[0]),
                    beyond_noise=noise_verdict(summary, summaries[0]),
                    noise_side=side,
                    host_differed=host_differs and side != GPU_SIDE,
                )
            )
        rows.append(StageTimeRow(stage=stage, nested_in=nested_in, base_p50_ms=p50s[0], others=tuple(changes)))
    return tuple(rows)


def throughput(runs: Sequence[Labelled[Stage1Folder]]) -> tuple[RateRow, ...]:
    """Pages/s of every run (`Stage1Metrics.pages`: each timed forward at the run's batch, end to end), p50 with its
    ratio to the baseline's (above 1: more pages per second) and the noise verdict; empty when no run has it."""
    pages = [run_pages(f.metrics) for _, f in runs]
    if all(p is None for p in pages):
        return ()
    rates = [None if p is None else p.pages_per_s for p in pages]
    p50s = [None if r is None else r.p50 for r in rates]
    sizes = [None if p is None else p.batch_size for p in pages]
    changes = tuple(
        RateChange(p50=p50, ratio=ratio(p50, p50s[0]), beyond_noise=noise_verdict(rate, rates[0]), batch_size=size)
        for rate, p50, size in zip(rates[1:], p50s[1:], sizes[1:], strict=True)
    )
    return (RateRow(figure="pages/s", base_p50=p50s[0], others=changes, base_batch_size=sizes[0]),)


def verdict_side(base: Stage1Metrics, other: Stage1Metrics, stage: str) -> str | None:
    """The side of the noise a stage's verdict rests on: the runs' own (StageVariation.noise_side), "host and GPU"
    where they differ, None where neither run can tell."""
    sides = {v.noise_side for m in (base, other) for v in m.variation if v.stage == stage and v.noise_side is not None}
    if not sides:
        return None
    return sides.pop() if len(sides) == 1 else BOTH_SIDES


def efficiency(runs: Sequence[Labelled[Stage1Folder]]) -> tuple[EfficiencyRow, ...]:
    """MFU (from the MFU records, else the efficiency rows), achieved TFLOP/s and MBU of every costed stage."""
    metrics = [f.metrics for _, f in runs]
    stages = union([*(r.stage for r in m.mfu), *(e.stage for e in m.efficiency)] for m in metrics)
    rows = []
    for stage in stages:
        mfu = [m.mfu_of(stage) for m in metrics]
        eff = [m.efficiency_of(stage) for m in metrics]
        rows.append(
            EfficiencyRow(
                stage=stage,
                mfu=tuple(
                    r.mfu if r is not None and r.mfu is not None else (None if e is None else e.mfu)
                    for r, e in zip(mfu, eff, strict=True)
                ),
                achieved_tflops=tuple(None if r is None else r.achieved_tflops for r in mfu),
                mbu=tuple(None if e is None else e.mbu for e in eff),
            )
        )
    return tuple(rows)


def operator_movers(base: Labelled[Stage1Folder], other: Labelled[Stage1Folder]) -> MoverTable:
    """The operators of the profiled pass whose time moved most, each run ranked by its own device's time."""
    base_key, other_key = operator_key(base[1]), operator_key(other[1])
    moved = movers(_operators(base[1], base_key), _operators(other[1], other_key))
    return MoverTable(other=other[0], base_key=base_key, other_key=other_key, movers=moved)


_GIB = float(1 << 30)


def _peak(metrics: Stage1Metrics, part: str) -> float | None:
    """The whole pass's peak allocated or reserved memory (GiB)."""
    measured = None if metrics.memory is None else metrics.memory.measured
    whole = None if measured is None else next((p for p in measured.peaks if p.stage == vocab.E2E), None)
    if whole is None:
        return None
    return (whole.peak_allocated_bytes if part == "allocated" else whole.peak_reserved_bytes) / _GIB


@attrs.frozen
class ResourceFigure:
    """A figure with one value per run: its name, how a run's value is read, and the relative tolerance within which
    it counts as the same; a setup cost (`floor`) also within `floor(baseline)` in `unit`, its change said in `unit`
    (its percent of a near-nil baseline means little)."""

    name: str
    read: Callable[[Stage1Metrics], float | None]
    tolerance: float
    floor: Callable[[Stage1Metrics], float] | None = None
    unit: str = ""


RESOURCE_FIGURES: tuple[ResourceFigure, ...] = (
    ResourceFigure("peak allocated (GiB)", lambda m: _peak(m, "allocated"), MEMORY_TOLERANCE),
    ResourceFigure("peak reserved (GiB)", lambda m: _peak(m, "reserved"), MEMORY_TOLERANCE),
    ResourceFigure(
        "first-pass extra, largest input (ms)",
        lambda m: m.first_pass_extra_ms,
        FIRST_PASS_TOLERANCE,
        floor=first_pass_floor_ms,  # a single pass's noise, where the extra is near 0
        unit="ms",
    ),
    ResourceFigure("J per page", lambda m: None if m.energy is None else m.energy.joules_per_page, ENERGY_TOLERANCE),
    ResourceFigure(
        "J per decode token",
        lambda m: None if m.energy is None else m.energy.joules_per_decode_token,
        ENERGY_TOLERANCE,
    ),
    ResourceFigure(
        "J per decode token above idle",
        lambda m: None if m.energy is None else m.energy.joules_per_decode_token_above_idle,
        ENERGY_TOLERANCE,
    ),
)


def resource_change(value: float | None, base: float | None, tolerance: float) -> str:
    """ "higher" / "lower" / "same within N%" against the baseline's single value, or "n/a"."""
    if value is None or base is None or base <= 0:
        return "n/a"
    change = value / base - 1.0
    if abs(change) <= tolerance:
        return f"same within {tolerance:.0%}"
    return f"higher ({change:+.1%})" if change > 0 else f"lower ({change:+.1%})"


def setup_cost_change(value: float | None, base: float | None, tolerance: float, floor: float, unit: str) -> str:
    """A setup cost (at least 0) against the baseline's: "same within 25% or 93.9 ms", "higher (+7,000.0 ms)",
    "lower (−1,900.0 ms)", or "n/a"."""
    if value is None or base is None:
        return "n/a"
    if same_setup_cost(base, value, tolerance, floor):
        return f"same within {tolerance:.0%} or {floor:,.1f} {unit}"
    delta = value - base
    return f"{'higher' if delta > 0 else 'lower'} ({'+' if delta > 0 else '−'}{abs(delta):,.1f} {unit})"


def resources(runs: Sequence[Labelled[Stage1Folder]]) -> tuple[ResourceRow, ...]:
    """Peak memory, the first-pass extra and energy of every run beside the baseline's (empty when no run measured
    them)."""
    rows = []
    base = runs[0][1].metrics
    for figure in RESOURCE_FIGURES:
        values = tuple(figure.read(f.metrics) for _, f in runs)
        if all(v is None for v in values):
            continue
        if figure.floor is None:
            changes = tuple(resource_change(v, values[0], figure.tolerance) for v in values[1:])
        else:
            floor = figure.floor(base)
            changes = tuple(setup_cost_change(v, values[0], figure.tolerance, floor, figure.unit) for v in values[1:])
        rows.append(ResourceRow(figure=figure.name, values=values, changes=changes, tolerance=figure.tolerance))
    return tuple(rows)


def host_rows(runs: Sequence[Labelled[Stage1Folder]]) -> tuple[FieldDifference, ...]:
    """The host figures (`measure.host_difference`) in which some run differs from the baseline, per run."""
    figures = [host_difference.host_figures(f.metrics.host_usage) for _, f in runs]
    names = union(host_difference.differing(figures[0], other) for other in figures[1:])
    ordered = [n for n in host_difference.FIGURE_NAMES if n in names]
    return tuple(
        FieldDifference(name, tuple(host_difference.shown(f, name) or NA for f in figures)) for name in ordered
    )


def stage1_comparison(runs: Sequence[Labelled[Stage1Folder]]) -> Stage1Comparison:
    return Stage1Comparison(
        resources=resources(runs),
        stage_times=stage_times(runs),
        throughput=throughput(runs),
        efficiency=efficiency(runs),
        operators=tuple(operator_movers(runs[0], other) for other in runs[1:]),
        differences=differences(runs, STAGE1_FIELDS) + host_rows(runs),
        config_differences=config_differences([f.config for _, f in runs], SETTINGS_CONFIG_KEYS),
        host_differences=host_difference.run_differences([(label, f.metrics.host_usage) for label, f in runs]),
    )


# --------------------------------------------------------------------------------------------- Stage 2


def _model(pick: Callable[[ModelInfo], object]) -> Callable[[Stage2Folder], object]:
    """A field of the Stage 2 workload's model (None when the run recorded no model)."""
    return lambda f: None if f.metrics.model is None else pick(f.metrics.model)


def _tool_version(name: str) -> Callable[[Stage2Folder], object]:
    return lambda f: None if (tool := f.metrics.tools.get(name)) is None else tool.version


STAGE2_FIELDS: list[Field[Stage2Folder]] = [
    ("mode", lambda f: f.metrics.mode),
    ("model", _model(lambda m: m.name)),
    ("weights", _model(lambda m: m.weights)),
    ("dtype", _model(lambda m: m.dtype)),
    ("attn implementation", _model(lambda m: m.attn_implementation)),
    ("experts implementation", _model(lambda m: m.experts_implementation)),
    ("device", lambda f: f.metrics.device.name),
    ("GPU driver", lambda f: f.metrics.device.driver),
    ("torch", lambda f: f.env.get("torch")),
    ("transformers", lambda f: f.env.get("transformers")),
    ("CUDA runtime", lambda f: f.env.get("cuda_runtime")),
    ("nsys", _tool_version("nsys")),
    ("ncu", _tool_version("ncu")),
    ("ncu clock control", lambda f: f.metrics.ncu_clock_control),
    *run_setting_fields(attrgetter("metrics.workload_settings")),
    ("forwarded overrides", lambda f: f.metrics.forwarded_overrides),
]
STAGE2_CONFIG_KEYS = SETTINGS_CONFIG_KEYS | {"stage2.mode", "stage2.workload.repeats", "stage2.workload.warmup"}


def gpu_busy(runs: Sequence[Labelled[Stage2Folder]]) -> tuple[BusyRow, ...]:
    """GPU busy ms of every stage per run with its ratio to the baseline's, busy fraction and kernel launches."""
    metrics = [f.metrics for _, f in runs]
    rows = []
    for stage in union([s.stage for s in m.stages] for m in metrics):
        per_run = [m.stage_row(stage) for m in metrics]
        busy = [None if s is None else s.gpu_busy_ms for s in per_run]
        rows.append(
            BusyRow(
                stage=stage,
                base_busy_ms=busy[0],
                others=tuple(BusyChange(busy_ms=v, ratio=ratio(v, busy[0])) for v in busy[1:]),
                busy_fraction=tuple(None if s is None else s.busy_fraction for s in per_run),
                kernels=tuple(None if s is None else s.kernels for s in per_run),
            )
        )
    return tuple(rows)


def run_totals(folder: Stage2Folder) -> RunTotals:
    steps = folder.metrics.decode_steps
    return RunTotals(
        kernel_launches=folder.metrics.kernel_count,
        decode_step_wall_ms=None if steps is None else steps.step_wall_ms,
        kernels_per_decode_step=None if steps is None else steps.kernels_per_step,
        decode_gpu_busy=None if steps is None else steps.gpu_busy_fraction,
    )


def _kernels(folder: Stage2Folder) -> dict[str, Entry]:
    """The timed passes' kernels by demangled name, each named as the table shows it."""
    entries = {}
    for kernel in folder.metrics.top_kernels:
        demangled = kernel.demangled or kernel.name
        name = kernel_label(kernel.name or short_kernel_name(demangled), demangled)
        entries[demangled] = Entry(name, kernel.calls, kernel.total_ms)
    return entries


def kernel_movers(base: Labelled[Stage2Folder], other: Labelled[Stage2Folder]) -> MoverTable:
    """The kernels of the timed passes whose total time moved most."""
    moved = movers(_kernels(base[1]), _kernels(other[1]))
    return MoverTable(other=other[0], base_key=KERNEL_KEY, other_key=KERNEL_KEY, movers=moved)


def stage2_comparison(runs: Sequence[Labelled[Stage2Folder]]) -> Stage2Comparison:
    return Stage2Comparison(
        busy=gpu_busy(runs),
        totals=tuple(run_totals(f) for _, f in runs),
        kernels=tuple(kernel_movers(runs[0], other) for other in runs[1:]),
        differences=differences(runs, STAGE2_FIELDS),
        config_differences=config_differences([f.config for _, f in runs], STAGE2_CONFIG_KEYS),
    )


# --------------------------------------------------------------------------------------------- the whole


def compared_run(run: Run) -> ComparedRun:
    """What the run list says about one run."""
    m = run.folder.metrics
    shown = ComparedRun(
        path=run.path, label=run.label, kind=STAGE1, model=None, device=m.device.name, created=m.created
    )
    if isinstance(m, Stage1Metrics):
        return attrs.evolve(shown, model=m.model.name, repeats=m.settings.repeats)
    return attrs.evolve(shown, kind=STAGE2, model=None if m.model is None else m.model.name, mode=m.mode)


def build_comparison(runs: Sequence[Run], skipped: Sequence[Skipped]) -> Comparison:
    """The comparison of usable `runs` (in the order given): a section per kind with at least two runs."""
    stage1 = [(r.label, r.folder) for r in runs if isinstance(r.folder, Stage1Folder)]
    stage2 = [(r.label, r.folder) for r in runs if isinstance(r.folder, Stage2Folder)]
    return Comparison(
        schema_version=SCHEMA_VERSION,
        runs=tuple(compared_run(r) for r in runs),
        skipped=tuple(skipped),
        stage1=stage1_comparison(stage1) if len(stage1) >= 2 else None,
        stage2=stage2_comparison(stage2) if len(stage2) >= 2 else None,
        top_movers=TOP_MOVERS,
    )

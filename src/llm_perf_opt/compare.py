"""Compare run folders of `stage1-run` and `stage2-profile` side by side, against the first one as baseline.

Only `metrics.json`, `run_status.json` and `env.json` are read, so this needs neither a GPU nor torch. Folders
that cannot be compared (missing, unfinished, another schema) are skipped with the reason; runs are compared
only with runs of the same kind (Stage 1 with Stage 1, Stage 2 with Stage 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.kernel_names import kernel_label, short_kernel_name
from llm_perf_opt.records.common import SCHEMA_MAJOR
from llm_perf_opt.report.markdown import Doc, ms, pct

KINDS = {"stage1": "Stage 1", "stage2": "Stage 2"}
TOP_MOVERS = 10
NA = "n/a"

Row = list[str]


@attrs.frozen
class Run:
    """One usable run folder."""

    path: Path
    label: str
    kind: str  # "stage1" | "stage2"
    metrics: Mapping[str, Any]
    env: Mapping[str, Any]


@attrs.frozen
class Skipped:
    """A folder left out, and why."""

    path: Path
    reason: str


@attrs.frozen
class Comparison:
    """The Markdown and what went into it."""

    markdown: str
    runs: tuple[Run, ...]
    skipped: tuple[Skipped, ...]


# --------------------------------------------------------------------------------------------- loading


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_run(path: Path) -> Run | Skipped:
    """The run in `path`, or why it cannot be compared."""
    if not path.exists():
        return Skipped(path, "the folder does not exist")
    if not path.is_dir():
        return Skipped(path, "not a folder")
    metrics_file = path / "metrics.json"
    if not metrics_file.is_file():
        return Skipped(path, "no metrics.json (not a finished stage1-run or stage2-profile folder)")
    try:
        metrics = _read_json(metrics_file)
    except (OSError, ValueError) as exc:
        return Skipped(path, f"metrics.json cannot be read ({exc})")
    if not isinstance(metrics, dict):
        return Skipped(path, "metrics.json does not hold a JSON object")
    version = str(metrics.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_MAJOR:
        return Skipped(
            path, f"metrics.json has schema_version {version or 'missing'}; this tool reads {SCHEMA_MAJOR}.x"
        )
    kind = metrics.get("stage")
    if kind not in KINDS:
        return Skipped(path, f"metrics.json is for stage {kind!r}, not stage1 or stage2")
    try:
        status = _read_json(path / "run_status.json")
    except FileNotFoundError:
        return Skipped(path, "no run_status.json, so the run is not marked complete")
    except (OSError, ValueError) as exc:
        return Skipped(path, f"run_status.json cannot be read ({exc})")
    state = status.get("state") if isinstance(status, dict) else None
    if state != "complete":
        message = status.get("message") if isinstance(status, dict) else None
        detail = f": {message}" if message else ""
        return Skipped(path, f"the run is marked {state or 'with no state'}, not complete{detail}")
    try:
        env = _read_json(path / "env.json")
    except (OSError, ValueError):
        env = {}
    return Run(path, path.resolve().name or str(path), str(kind), metrics, env if isinstance(env, dict) else {})


def load_runs(paths: Sequence[Path]) -> tuple[list[Run], list[Skipped]]:
    """Usable runs (labels made unique) and skipped folders, in the order given."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    for path in paths:
        loaded = load_run(Path(path))
        if isinstance(loaded, Skipped):
            skipped.append(loaded)
            continue
        taken = {r.label for r in runs}
        label, n = loaded.label, 2
        while label in taken:
            label, n = f"{loaded.label}#{n}", n + 1
        runs.append(attrs.evolve(loaded, label=label))
    return runs, skipped


# --------------------------------------------------------------------------------------------- helpers


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _by_stage(items: Any) -> dict[str, Mapping[str, Any]]:
    return {str(i["stage"]): i for i in items or () if isinstance(i, Mapping) and "stage" in i}


def _union(keys_per_run: Sequence[Sequence[str]]) -> list[str]:
    """Keys in first-seen order: the baseline's order, then what only later runs have."""
    seen: dict[str, None] = {}
    for keys in keys_per_run:
        for key in keys:
            seen.setdefault(key, None)
    return list(seen)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def ratio(value: float | None, base: float | None) -> str:
    """`value / base` as `1.23×`, or n/a."""
    if value is None or base is None or base == 0:
        return NA
    return f"{value / base:.2f}×"


def beyond_noise(summary: Mapping[str, Any] | None, base: Mapping[str, Any] | None) -> str:
    """`yes` when the 95% CIs of the two means do not overlap, `within noise` when they do."""
    if summary is None or base is None:
        return NA
    bounds = [_num(s.get(k)) for s in (summary, base) for k in ("ci95_low", "ci95_high")]
    if min(_num(summary.get("n")) or 0, _num(base.get("n")) or 0) < 2:
        return "n/a (needs ≥ 2 passes each)"
    known = [b for b in bounds if b is not None]
    if len(known) < 4:
        return NA
    lo, hi, base_lo, base_hi = known
    return "yes" if hi < base_lo or base_hi < lo else "within noise"


def _count(value: Any) -> str:
    number = _num(value)
    return NA if number is None else f"{number:,.0f}"


def _delta(value: float | None) -> str:
    return NA if value is None else f"{value:+,.2f}"


def _short_digest(value: Any) -> str:
    """`sha256:f0cbc3e2…` -> its first 12 hex digits (enough to tell two digests apart)."""
    return str(value).split(":", 1)[-1][:12] if value else NA


def _fmt(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True)
    return str(value)


Field = tuple[str, Callable[[Run], Any]]


def _differences(doc: Doc, runs: Sequence[Run], fields: Sequence[Field]) -> None:
    rows = []
    for name, pick in fields:
        values = [_fmt(pick(r)) for r in runs]
        if len(set(values)) > 1:
            rows.append([name, *values])
    if rows:
        _lead(doc, "Only the fields that differ between the runs; any of them can explain a change in time.")
        doc.table(["Field", *(r.label for r in runs)], rows)
    else:
        doc.para("None: same model, device, software versions and settings.")


def _movers(
    base: Sequence[Mapping[str, Any]],
    other: Sequence[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], str],
    value: str,
    other_value: str | None = None,
) -> list[tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None, float]]:
    """Items whose `value` (`other_value` in `other`) moved most by absolute difference, largest first.

    An item missing from one list counts as 0 there.
    """
    a = {key(i): i for i in base}
    b = {key(i): i for i in other}
    moved = []
    for name in _union([list(a), list(b)]):
        va = _num(_get(a.get(name), value)) or 0.0
        vb = _num(_get(b.get(name), other_value or value)) or 0.0
        if vb != va:
            moved.append((name, a.get(name), b.get(name), vb - va))
    moved.sort(key=lambda m: abs(m[3]), reverse=True)
    return moved[:TOP_MOVERS]


def _lead(doc: Doc, text: str) -> None:
    """A paragraph that introduces a table (a blank line between them)."""
    doc.para(text)
    doc.raw("\n")


def _sort_key(run: Run) -> str:
    """The operator column a Stage 1 run ranked by: device time on a GPU, CPU time on a CPU."""
    return str(run.metrics.get("operator_sort_key") or "self_device_ms")


def _runs_list(doc: Doc, runs: Sequence[Run], describe: Callable[[Run], str]) -> None:
    items = [f"**{r.label}**{' (baseline)' if i == 0 else ''}: `{r.path}`; {describe(r)}" for i, r in enumerate(runs)]
    doc.bullets(items)


# --------------------------------------------------------------------------------------------- Stage 1

STAGE1_FIELDS: list[Field] = [
    ("model", lambda r: _get(r.metrics, "model", "name")),
    ("parameters", lambda r: _get(r.metrics, "model", "parameters")),
    ("weights", lambda r: _get(r.metrics, "model", "weights")),
    ("dtype", lambda r: _get(r.metrics, "model", "dtype")),
    ("attn implementation", lambda r: _get(r.metrics, "model", "attn_implementation")),
    ("experts implementation", lambda r: _get(r.metrics, "model", "experts_implementation")),
    ("preprocess", lambda r: _get(r.metrics, "model", "preprocess")),
    ("device type", lambda r: _get(r.metrics, "device", "type")),
    ("device", lambda r: _get(r.metrics, "device", "name")),
    ("timing method", lambda r: _get(r.metrics, "device", "timing_method")),
    ("torch", lambda r: _get(r.env, "torch")),
    ("transformers", lambda r: _get(r.env, "transformers")),
    ("python", lambda r: _get(r.env, "python")),
    ("CUDA runtime", lambda r: _get(r.env, "cuda_runtime")),
    ("GPU driver", lambda r: _get(r.env, "gpu", "driver")),
    ("torch threads", lambda r: _get(r.env, "torch_threads")),
    ("TF32 matmul", lambda r: _get(r.env, "tf32_matmul")),
    ("repeats", lambda r: _get(r.metrics, "settings", "repeats")),
    ("warmup", lambda r: _get(r.metrics, "settings", "warmup")),
    ("max_new_tokens", lambda r: _get(r.metrics, "settings", "max_new_tokens")),
    ("max_images", lambda r: _get(r.metrics, "settings", "max_images")),
    ("batch_size", lambda r: _get(r.metrics, "settings", "batch_size")),
    ("partial run", lambda r: _get(r.metrics, "settings", "partial")),
    ("operator sort key", lambda r: r.metrics.get("operator_sort_key")),
    ("config digest", lambda r: _short_digest(r.metrics.get("config_digest"))),
]


def _stage1(doc: Doc, runs: Sequence[Run]) -> None:
    base, others = runs[0], runs[1:]
    doc.h2("Stage 1: " + " vs ".join(r.label for r in runs))
    _runs_list(
        doc,
        runs,
        lambda r: (
            f"{_get(r.metrics, 'model', 'name')} on {_get(r.metrics, 'device', 'name')}, "
            f"{_get(r.metrics, 'settings', 'repeats')} repeats, created {r.metrics.get('created', NA)}"
        ),
    )

    doc.h3("Stage times (p50, ms)")
    stats = [{k: v.get("summary") for k, v in _by_stage(r.metrics.get("stages")).items()} for r in runs]
    nested = {k: v.get("nested_in") for r in runs for k, v in _by_stage(r.metrics.get("stages")).items()}
    header = [f"{base.label} p50"]
    for r in others:
        header += [f"{r.label} p50", f"{r.label} ratio", f"{r.label} beyond noise"]
    rows: list[Row] = []
    for stage in _union([list(s) for s in stats]):
        b = stats[0].get(stage)
        row = [f"{stage} (in {nested[stage]})" if nested.get(stage) else stage, ms(_num(_get(b, "p50")), 2)]
        for s in stats[1:]:
            o = s.get(stage)
            row += [ms(_num(_get(o, "p50")), 2), ratio(_num(_get(o, "p50")), _num(_get(b, "p50"))), beyond_noise(o, b)]
        rows.append(row)
    doc.table(["Stage", *header], rows)
    doc.para(
        f'Ratio: run p50 / baseline p50 ({base.label}); above 1 is slower. Beyond noise: "yes" when the 95% '
        "confidence intervals of the two means do not overlap (recorded run-to-run dispersion), otherwise "
        '"within noise". n/a: the stage was not measured in that run.'
    )

    doc.h3("MFU and MBU per stage")
    mfu = [_by_stage(r.metrics.get("mfu")) for r in runs]
    eff = [_by_stage(r.metrics.get("efficiency")) for r in runs]
    rows = []
    for stage in _union([[*m, *e] for m, e in zip(mfu, eff, strict=True)]):
        mfus = [_num(_get(m.get(stage), "mfu")) for m in mfu]
        mfus = [v if v is not None else _num(_get(e.get(stage), "mfu")) for v, e in zip(mfus, eff, strict=True)]
        tflops = [_num(_get(m.get(stage), "achieved_tflops")) for m in mfu]
        mbus = [_num(_get(e.get(stage), "mbu")) for e in eff]
        rows.append([stage, *(pct(v, 2) for v in mfus), *(ms(v, 1) for v in tflops), *(pct(v, 2) for v in mbus)])
    doc.table(
        [
            "Stage",
            *(f"{r.label} MFU" for r in runs),
            *(f"{r.label} TFLOP/s" for r in runs),
            *(f"{r.label} MBU" for r in runs),
        ],
        rows,
    )
    doc.para("n/a: not computed in that run (no FLOP count, no known peak, or an older run without MBU).")

    doc.h3("Top operators that moved most")
    base_key = _sort_key(base)
    for other in others:
        key = _sort_key(other)
        if key == base_key:
            _lead(doc, f"**{other.label}** vs **{base.label}**, by `{key}` (absolute difference, top {TOP_MOVERS}).")
        else:
            _lead(
                doc,
                f"**{other.label}** (by `{key}`) vs **{base.label}** (by `{base_key}`): each run's operators are "
                f"ranked by the time on its own device (absolute difference, top {TOP_MOVERS}).",
            )
        moved = _movers(
            base.metrics.get("top_operators") or [],
            other.metrics.get("top_operators") or [],
            lambda i: str(i["name"]),
            base_key,
            key,
        )
        doc.table(
            [
                "Operator",
                f"{base.label} calls",
                f"{other.label} calls",
                f"{base.label} ms",
                f"{other.label} ms",
                "Δ ms",
            ],
            [
                [
                    name,
                    _count(_get(a, "calls")),
                    _count(_get(b, "calls")),
                    ms(_num(_get(a, base_key)), 2),
                    ms(_num(_get(b, key)), 2),
                    _delta(d),
                ]
                for name, a, b, d in moved
            ],
        )
    doc.para("n/a: not among that run's recorded top operators (counted as 0 for the ranking).")

    doc.h3("Configuration and environment differences")
    _differences(doc, runs, STAGE1_FIELDS)


# --------------------------------------------------------------------------------------------- Stage 2

STAGE2_FIELDS: list[Field] = [
    ("mode", lambda r: r.metrics.get("mode")),
    ("model", lambda r: _get(r.metrics, "model", "name")),
    ("weights", lambda r: _get(r.metrics, "model", "weights")),
    ("dtype", lambda r: _get(r.metrics, "model", "dtype")),
    ("attn implementation", lambda r: _get(r.metrics, "model", "attn_implementation")),
    ("experts implementation", lambda r: _get(r.metrics, "model", "experts_implementation")),
    ("device", lambda r: _get(r.metrics, "device", "name")),
    ("GPU driver", lambda r: _get(r.metrics, "device", "driver")),
    ("torch", lambda r: _get(r.env, "torch")),
    ("transformers", lambda r: _get(r.env, "transformers")),
    ("CUDA runtime", lambda r: _get(r.env, "cuda_runtime")),
    ("nsys", lambda r: _get(r.metrics, "tools", "nsys", "version")),
    ("ncu", lambda r: _get(r.metrics, "tools", "ncu", "version")),
    ("ncu clock control", lambda r: r.metrics.get("ncu_clock_control")),
    ("repeats", lambda r: _get(r.metrics, "workload_settings", "repeats")),
    ("warmup", lambda r: _get(r.metrics, "workload_settings", "warmup")),
    ("max_new_tokens", lambda r: _get(r.metrics, "workload_settings", "max_new_tokens")),
    ("max_images", lambda r: _get(r.metrics, "workload_settings", "max_images")),
    ("forwarded overrides", lambda r: r.metrics.get("forwarded_overrides")),
]


def _kernel_key(item: Mapping[str, Any]) -> str:
    return str(item.get("demangled") or item.get("name"))


def _kernel_name(item: Mapping[str, Any] | None) -> str:
    if item is None:
        return NA
    demangled = str(item.get("demangled") or item.get("name") or "")
    return kernel_label(str(item.get("name") or short_kernel_name(demangled)), demangled)


def _stage2(doc: Doc, runs: Sequence[Run]) -> None:
    base, others = runs[0], runs[1:]
    doc.h2("Stage 2: " + " vs ".join(r.label for r in runs))
    _runs_list(
        doc,
        runs,
        lambda r: (
            f"{r.metrics.get('mode', NA)} mode, {_get(r.metrics, 'model', 'name')} on "
            f"{_get(r.metrics, 'device', 'name')}, created {r.metrics.get('created', NA)}"
        ),
    )

    doc.h3("GPU busy time per stage (Nsight Systems)")
    stages = [_by_stage(r.metrics.get("stages")) for r in runs]
    header = [f"{base.label} busy ms"]
    for r in others:
        header += [f"{r.label} busy ms", f"{r.label} ratio"]
    header += [f"{r.label} busy fraction" for r in runs] + [f"{r.label} kernels" for r in runs]
    rows: list[Row] = []
    for stage in _union([list(s) for s in stages]):
        b = stages[0].get(stage)
        row = [stage, ms(_num(_get(b, "gpu_busy_ms")), 2)]
        for s in stages[1:]:
            o = s.get(stage)
            row += [
                ms(_num(_get(o, "gpu_busy_ms")), 2),
                ratio(_num(_get(o, "gpu_busy_ms")), _num(_get(b, "gpu_busy_ms"))),
            ]
        row += [pct(_num(_get(s.get(stage), "busy_fraction"))) for s in stages]
        row += [_count(_get(s.get(stage), "kernels")) for s in stages]
        rows.append(row)
    doc.table(["Stage", *header], rows)
    _lead(
        doc,
        "Busy ms: time at least one kernel ran inside the stage's NVTX ranges; busy fraction: busy ms / wall time; "
        "kernels: launches. Ratio: run / baseline; n/a: the stage was not captured in that run. One capture per "
        "run, so there is no run-to-run dispersion to test against.",
    )
    doc.table(
        ["Whole run", *(r.label for r in runs)],
        [
            ["kernel launches", *(_count(r.metrics.get("kernel_count")) for r in runs)],
            ["decode step wall ms", *(ms(_num(_get(r.metrics, "decode_steps", "step_wall_ms")), 2) for r in runs)],
            ["kernels per decode step", *(ms(_num(_get(r.metrics, "decode_steps", "kernels_per_step"))) for r in runs)],
            ["decode GPU busy", *(pct(_num(_get(r.metrics, "decode_steps", "gpu_busy_fraction"))) for r in runs)],
        ],
    )

    doc.h3("Kernels that moved most")
    for other in others:
        _lead(doc, f"**{other.label}** vs **{base.label}**, by total ms (absolute difference, top {TOP_MOVERS}).")
        moved = _movers(
            base.metrics.get("top_kernels") or [], other.metrics.get("top_kernels") or [], _kernel_key, "total_ms"
        )
        doc.table(
            ["Kernel", f"{base.label} calls", f"{other.label} calls", f"{base.label} ms", f"{other.label} ms", "Δ ms"],
            [
                [
                    _kernel_name(a or b),
                    _count(_get(a, "calls")),
                    _count(_get(b, "calls")),
                    ms(_num(_get(a, "total_ms")), 2),
                    ms(_num(_get(b, "total_ms")), 2),
                    _delta(d),
                ]
                for _, a, b, d in moved
            ],
        )
    doc.para("n/a: not among that run's recorded top kernels (counted as 0 for the ranking).")

    doc.h3("Configuration and environment differences")
    _differences(doc, runs, STAGE2_FIELDS)


# --------------------------------------------------------------------------------------------- entry


def _scope(groups: Mapping[str, list[Run]]) -> list[str]:
    lines = []
    for kind, runs in groups.items():
        name = KINDS[kind]
        if len(runs) >= 2:
            rest = ", ".join(r.label for r in runs[1:])
            lines.append(f"{name}: **{runs[0].label}** (baseline) compared with {rest}.")
        elif runs:
            lines.append(f"{name}: {runs[0].label} not compared: no other {name} run was given.")
    return lines


def compare(paths: Sequence[Path]) -> Comparison:
    """The comparison of the run folders in `paths` (the first usable one of each kind is the baseline).

    Raises UserError when no kind has two usable runs.
    """
    runs, skipped = load_runs(paths)
    groups = {kind: [r for r in runs if r.kind == kind] for kind in KINDS}
    if all(len(g) < 2 for g in groups.values()):
        found = "; ".join(f"{r.path} ({KINDS[r.kind]})" for r in runs) or "none"
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        problem = f"fewer than two usable run folders of one kind to compare (usable: {found}"
        problem += f"; skipped: {reasons})" if reasons else ")"
        raise UserError(
            problem,
            "pass at least two completed folders written by stage1-run, or two by stage2-profile "
            "(e.g. `perf-compare runs/a runs/b`); rerun failed or interrupted runs first",
        )
    doc = Doc("Run comparison")
    doc.para("The first usable folder of each kind is the baseline; every other run of that kind is compared with it.")
    doc.bullets(_scope(groups))
    if skipped:
        doc.h2("Skipped folders")
        doc.bullets([f"`{s.path}`: {s.reason}" for s in skipped])
    if len(groups["stage1"]) >= 2:
        _stage1(doc, groups["stage1"])
    if len(groups["stage2"]) >= 2:
        _stage2(doc, groups["stage2"])
    return Comparison(doc.text(), tuple(runs), tuple(skipped))


def write_comparison(paths: Sequence[Path], out: Path) -> Comparison:
    """Compare `paths` and write the Markdown to `out` (parent folders created)."""
    result = compare(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.markdown, encoding="utf-8")
    return result

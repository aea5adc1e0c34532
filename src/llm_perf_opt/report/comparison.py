"""`compare.md`: a `Comparison` record (`records.comparison`) rendered as Markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llm_perf_opt.measure.host_difference import DIFFERS_RATIO, MIN_SWITCHES_PER_S
from llm_perf_opt.measure.thresholds import ENERGY_TOLERANCE, FIRST_PASS_FLOOR, FIRST_PASS_TOLERANCE, MEMORY_TOLERANCE
from llm_perf_opt.measure.variation import GPU_PACED_FROM, HOST_PACED_BELOW
from llm_perf_opt.records.comparison import (
    GATE_EXIT_CODES,
    IMPROVED,
    INCONCLUSIVE,
    KINDS,
    NOT_JUDGED,
    PASS,
    STAGE1,
    STAGE2,
    ComparedRun,
    Comparison,
    FieldDifference,
    Gate,
    GateCheck,
    MoverTable,
    RateRow,
    Stage1Comparison,
    Stage2Comparison,
    WhatIfComparison,
)
from llm_perf_opt.report.markdown import NA, Doc, ms, num_bytes, number, pct, ratio_text

Row = list[str]


def _delta(value: float | None) -> str:
    return NA if value is None else f"{value:+,.2f}"


def _lead(doc: Doc, text: str) -> None:
    """A paragraph that introduces a table (a blank line between them)."""
    doc.para(text)
    doc.raw("\n")


def _runs_list(doc: Doc, runs: Sequence[ComparedRun], describe: Callable[[ComparedRun], str]) -> None:
    items = [f"**{r.label}**{' (baseline)' if i == 0 else ''}: `{r.path}`; {describe(r)}" for i, r in enumerate(runs)]
    doc.bullets(items)


def _p50_header(runs: Sequence[ComparedRun]) -> Row:
    """The baseline's p50, then each other run's p50, ratio and noise verdict."""
    header = [f"{runs[0].label} p50"]
    for r in runs[1:]:
        header += [f"{r.label} p50", f"{r.label} ratio", f"{r.label} beyond noise"]
    return header


def _differences(
    doc: Doc, runs: Sequence[ComparedRun], rows: Sequence[FieldDifference], config: Sequence[FieldDifference] = ()
) -> None:
    doc.h3("Configuration and environment differences")
    if rows:
        _lead(doc, "Only the fields that differ between the runs; any of them can explain a change in time.")
        doc.table(["Field", *(r.label for r in runs)], [[d.field, *d.values] for d in rows])
    elif not config:
        doc.para("None: same model, device, software versions and settings.")
    if config:
        _lead(
            doc,
            "Every other key of the runs' resolved configuration (config.yaml) that differs; (absent): a key the "
            "run's configuration does not have (an older release, or another model's settings).",
        )
        doc.table(["config.yaml key", *(r.label for r in runs)], [[d.field, *d.values] for d in config])


def _movers_table(doc: Doc, base: str, table: MoverTable, first: str) -> None:
    doc.table(
        [first, f"{base} calls", f"{table.other} calls", f"{base} ms", f"{table.other} ms", "Δ ms"],
        [
            [
                m.name,
                number(m.base_calls, 0),
                number(m.other_calls, 0),
                ms(m.base_ms, 2),
                ms(m.other_ms, 2),
                _delta(m.delta_ms),
            ]
            for m in table.movers
        ],
    )


# --------------------------------------------------------------------------------------------- Stage 1


def _stage1(doc: Doc, runs: Sequence[ComparedRun], section: Stage1Comparison, top: int) -> None:
    base, others = runs[0], runs[1:]
    doc.h2("Stage 1: " + " vs ".join(r.label for r in runs))
    _runs_list(
        doc,
        runs,
        lambda r: f"{r.model or 'model not recorded'} on {r.device}, {r.repeats} repeats, created {r.created}",
    )

    doc.h3("Stage times (p50, ms)")
    rows: list[Row] = []
    for s in section.stage_times:
        row = [f"{s.stage} (in {s.nested_in})" if s.nested_in else s.stage, ms(s.base_p50_ms, 2)]
        for c in s.others:
            notes = [n for n in (c.noise_side, HOSTS_DIFFERED if c.host_differed else None) if n]
            row += [ms(c.p50_ms, 2), ratio_text(c.ratio), c.beyond_noise + (f" ({'; '.join(notes)})" if notes else "")]
        rows.append(row)
    doc.table(["Stage", *_p50_header(runs)], rows)
    doc.para(
        f'Ratio: run p50 / baseline p50 ({base.label}); above 1 is slower. Beyond noise: "yes" when the 95% '
        "confidence intervals of the two means do not overlap (recorded run-to-run dispersion), otherwise "
        '"within noise". n/a: the stage was not measured in that run. In brackets, the side the runs\' noise is on '
        f"(host-side: the GPU was busy under {HOST_PACED_BELOW:.0%} of the stage in the profiled pass, so the host's "
        f"pace sets the spread; GPU-side: from {GPU_PACED_FROM:.0%})."
    )
    if any(section.host_differences):  # a run's host usage differed from the baseline's
        doc.para(host_note(section.host_differences, [r.label for r in others]))
    _throughput(doc, runs, section.throughput)

    doc.h3("MFU and MBU per stage")
    doc.table(
        [
            "Stage",
            *(f"{r.label} MFU" for r in runs),
            *(f"{r.label} TFLOP/s" for r in runs),
            *(f"{r.label} MBU" for r in runs),
        ],
        [
            [e.stage, *(pct(v, 2) for v in e.mfu), *(ms(v, 1) for v in e.achieved_tflops), *(pct(v, 2) for v in e.mbu)]
            for e in section.efficiency
        ],
    )
    doc.para("n/a: not computed in that run (no FLOP count, no known peak, or an older run without MBU).")
    if section.resources:
        doc.h3("Memory, energy and first-pass extra")
        doc.table(
            ["Figure", *(r.label for r in runs), *(f"{r.label} vs {base.label}" for r in runs[1:])],
            [[row.figure, *(number(v, 3) for v in row.values), *row.changes] for row in section.resources],
        )
        doc.para(
            "From each run's memory and energy passes and its inputs' first passes (the first-pass extra: the most an "
            "input's first warm-up pass took beyond its timed median, what an input of shapes not met before waits "
            "for): one value per run, so a change is judged against a stated tolerance (peak memory "
            f"{MEMORY_TOLERANCE:.0%}, energy {ENERGY_TOLERANCE:.0%}, the first-pass extra {FIRST_PASS_TOLERANCE:.0%} "
            f"or {FIRST_PASS_FLOOR:.0%} of the baseline's timed pass), not an interval. n/a: not measured in that run."
        )

    doc.h3("Top operators that moved most")
    for table in section.operators:
        if table.other_key == table.base_key:
            ranked = f"**{table.other}** vs **{base.label}**, by `{table.other_key}`"
        else:
            ranked = (
                f"**{table.other}** (by `{table.other_key}`) vs **{base.label}** (by `{table.base_key}`): each run's "
                "operators are ranked by the time on its own device"
            )
        _lead(doc, f"{ranked} (absolute difference, top {top}).")
        _movers_table(doc, base.label, table, "Operator")
    doc.para("n/a: not among that run's recorded top operators (counted as 0 for the ranking).")
    _differences(doc, runs, section.differences, section.config_differences)


def _rate(value: float | None, batch: int | None, shown: bool) -> str:
    """A rate's p50, with its batch where the runs' batches differ: `4.66 (batch 16)`."""
    text = number(value, 3)
    return f"{text} (batch {batch})" if shown and value is not None and batch is not None else text


def _throughput(doc: Doc, runs: Sequence[ComparedRun], rows: Sequence[RateRow]) -> None:
    """Pages/s per run beside the baseline's (higher is better)."""
    if not rows:
        return
    doc.h3("Throughput (p50)")
    table = []
    for row in rows:
        differ = any(c.batch_size not in (None, row.base_batch_size) for c in row.others)
        cells = [row.figure, _rate(row.base_p50, row.base_batch_size, differ)]
        for c in row.others:
            cells += [_rate(c.p50, c.batch_size, differ), ratio_text(c.ratio), c.beyond_noise]
        table.append(cells)
    doc.table(["Figure", *_p50_header(runs)], table)
    doc.para(
        "Pages/s: the inputs each timed forward finishes (one page, or a batch) over its time from the first byte of "
        "preprocessing to the last token, p50 over the forwards at the run's batch (a short last batch left out). "
        "Ratio: run / baseline; above 1 is more pages per second (better)."
    )


HOSTS_DIFFERED = "hosts differed"
PIN_THREADS = (
    "On a shared CPU, pin the threads (`OMP_NUM_THREADS=1`, or `run.cpu_affinity=auto`), keep the host quiet, and "
    "rerun both runs before blaming a setting."
)
HOST_RULE = (
    f"a host figure differs when one run's is {DIFFERS_RATIO}× the other's or more: CPU per pass, CPU against wall "
    f"(cores kept busy), or involuntary context switches per second (at least {MIN_SWITCHES_PER_S:.0f}/s)"
)


def host_note(differences: Sequence[Sequence[str]], labels: Sequence[str]) -> str:
    """Why verdicts say "hosts differed": which run's host usage differed from the baseline's, and what to do."""
    runs = "; ".join(f"**{label}**: {', '.join(d)}" for label, d in zip(labels, differences, strict=True) if d)
    return (
        "The hosts differed: the runs' own host lines (CPU time and context switches over the timed passes) do not "
        f'match ({HOST_RULE}) — {runs}. A stage marked "{HOSTS_DIFFERED}" is not known to be GPU-paced, so its '
        f"change may be the host's load rather than a setting's. {PIN_THREADS}"
    )


# --------------------------------------------------------------------------------------------- Stage 2


def _stage2(doc: Doc, runs: Sequence[ComparedRun], section: Stage2Comparison, top: int) -> None:
    base, others = runs[0], runs[1:]
    doc.h2("Stage 2: " + " vs ".join(r.label for r in runs))
    _runs_list(
        doc, runs, lambda r: f"{r.mode} mode, {r.model or 'model not recorded'} on {r.device}, created {r.created}"
    )

    doc.h3("GPU busy time per stage (Nsight Systems)")
    header = [f"{base.label} busy ms"]
    for r in others:
        header += [f"{r.label} busy ms", f"{r.label} ratio"]
    header += [f"{r.label} busy fraction" for r in runs] + [f"{r.label} kernels" for r in runs]
    rows: list[Row] = []
    for s in section.busy:
        row = [s.stage, ms(s.base_busy_ms, 2)]
        for c in s.others:
            row += [ms(c.busy_ms, 2), ratio_text(c.ratio)]
        row += [pct(v) for v in s.busy_fraction]
        row += [number(v, 0) for v in s.kernels]
        rows.append(row)
    doc.table(["Stage", *header], rows)
    _lead(
        doc,
        "Busy ms: time at least one kernel ran inside the stage's NVTX ranges; busy fraction: busy ms / wall time; "
        "kernels: launches. Ratio: run / baseline; n/a: the stage was not captured in that run. One capture per "
        "run, so there is no run-to-run dispersion to test against.",
    )
    totals = section.totals
    doc.table(
        ["Whole run", *(r.label for r in runs)],
        [
            ["kernel launches", *(number(t.kernel_launches, 0) for t in totals)],
            ["decode step wall ms", *(ms(t.decode_step_wall_ms, 2) for t in totals)],
            ["kernels per decode step", *(ms(t.kernels_per_decode_step) for t in totals)],
            ["decode GPU busy", *(pct(t.decode_gpu_busy) for t in totals)],
        ],
    )

    doc.h3("Kernels that moved most")
    for table in section.kernels:
        _lead(doc, f"**{table.other}** vs **{base.label}**, by total ms (absolute difference, top {top}).")
        _movers_table(doc, base.label, table, "Kernel")
    doc.para("n/a: not among that run's recorded top kernels (counted as 0 for the ranking).")
    _differences(doc, runs, section.differences, section.config_differences)


# --------------------------------------------------------------------------------------------- the gate


def _amount(value: float | None, unit: str, signed: bool = False) -> str:
    """A value in a gate figure's unit (ms or bytes), signed for changes."""
    if value is None:
        return NA
    shown = abs(value) if signed else value
    text = num_bytes(shown) if unit == "B" else f"{shown:,.2f} {unit}"
    return (("−" if value < 0 else "+") + text) if signed else text


def _change(c: GateCheck) -> str:
    tail = "" if c.change_pct is None else f" ({c.change_pct:+.1f}%)".replace("-", "−")
    return NA if c.change is None else _amount(c.change, c.unit, signed=True) + tail


def _interval(c: GateCheck) -> str:
    if c.noise_low is None or c.noise_high is None:
        return NA
    low, high = _amount(c.noise_low, c.unit, signed=True), _amount(c.noise_high, c.unit, signed=True)
    return f"{low} to {high}, {c.noise_basis}"


def _gate(doc: Doc, gate: Gate, heading: Callable[[str], None] | None = None) -> None:
    """`## Gate` (or the `heading` given): the result, then one row per rule and compared run."""
    (heading or doc.h2)("Gate")
    failing = [c for c in gate.checks if c.verdict not in (PASS, IMPROVED)]
    counts = ", ".join(
        f"{sum(c.verdict == v for c in gate.checks)} {v}" for v in dict.fromkeys(c.verdict for c in gate.checks)
    )
    doc.para(
        f"**{gate.result.upper()}**{_exit_text(gate.result)} ({counts or 'no checks'}); rules: "
        + ", ".join(f"`{r.text}`" for r in gate.rules)
        + "."
    )
    if gate.problems:
        doc.para("Not usable, so the gate cannot pass: " + "; ".join(gate.problems) + ".")
    if gate.differences:
        doc.para("Judged although the runs differ (--allow-different): " + "; ".join(gate.differences) + ".")
    if gate.host_differences:
        doc.para(
            "The hosts differed (" + HOST_RULE + "): " + "; ".join(gate.host_differences) + ". A host-paced figure "
            "(a CPU run, an eager decode step, preprocessing) may have moved with the host's load. " + PIN_THREADS
        )
    doc.raw("\n")
    doc.table(
        ["Rule", "Run", "Baseline", "New", "Change", "Allowed", "95% interval of the change", "Verdict"],
        [
            [
                c.rule,
                c.run,
                _amount(c.base_value, c.unit),
                _amount(c.new_value, c.unit),
                _change(c),
                _amount(c.threshold, c.unit, signed=True),
                _interval(c),
                c.verdict,
            ]
            for c in gate.checks
        ],
    )
    doc.bullets([f"`{c.rule}` on **{c.run}**: {c.reason}" for c in failing])
    if gate.hint:
        doc.para(f"To let the gate judge the rules it could not: {gate.hint}.")
    undecided = "fail the gate (--fail-on-unjudged)" if gate.fail_on_unjudged else "make the gate inconclusive"
    doc.para(
        "Values are means over the timed passes; the 95% interval of the change is Welch t over the passes (per "
        "input when both runs timed the same inputs). A rule *regresses* when the change exceeds the allowed "
        "increase and the interval lies above 0; it *passes* only when the whole interval is at or below the "
        f"allowed increase. {INCONCLUSIVE.capitalize()}: the noise leaves open whether the allowed increase was "
        "exceeded (a change beyond it whose interval reaches 0, a change within it whose interval reaches beyond it, "
        f"or no interval: fewer than 3 passes on a side, or a Stage 2 capture); {NOT_JUDGED}: a figure a run did not "
        f"measure. Such rules {undecided}."
    )
    doc.raw("\n")


def _exit_text(result: str) -> str:
    code = GATE_EXIT_CODES.get(result)
    return f" (exit {code})" if code else ""


# --------------------------------------------------------------------------------------------- entry


def _scope(comparison: Comparison) -> list[str]:
    lines = []
    for kind, name in KINDS.items():
        runs = comparison.runs_of(kind)
        if len(runs) >= 2:
            rest = ", ".join(r.label for r in runs[1:])
            lines.append(f"{name}: **{runs[0].label}** (baseline) compared with {rest}.")
        elif runs:
            lines.append(f"{name}: {runs[0].label} not compared: no other {name} run was given.")
    return lines


def comparison_markdown(comparison: Comparison) -> str:
    """`compare.md`: the gate (with --fail-on), the scope, the skipped folders, then a section per kind with two
    runs or more."""
    doc = Doc("Run comparison")
    if comparison.gate is not None:
        _gate(doc, comparison.gate)
        doc.h2("Runs")
    _body(doc, comparison)
    return doc.text()


def _body(doc: Doc, comparison: Comparison) -> None:
    doc.para("The first usable folder of each kind is the baseline; every other run of that kind is compared with it.")
    doc.bullets(_scope(comparison))
    if comparison.skipped:
        doc.h2("Skipped folders")
        doc.bullets([f"`{s.path}`: {s.reason}" for s in comparison.skipped])
    if comparison.stage1 is not None:
        _stage1(doc, comparison.runs_of(STAGE1), comparison.stage1, comparison.top_movers)
    if comparison.stage2 is not None:
        _stage2(doc, comparison.runs_of(STAGE2), comparison.stage2, comparison.top_movers)


def whatif_comparison_markdown(result: WhatIfComparison) -> str:
    """`compare.md` of two what-if folders: every rung pair's gate and stage times, then each pair's comparison."""
    doc = Doc("What-if comparison, rung by rung")
    doc.para(f"Baseline: `{result.base}`; compared: `{result.new}`. Rungs are paired by name.")
    if result.gate_result is not None:
        doc.para(f"Gate over every rung: **{result.gate_result.upper()}**{_exit_text(result.gate_result)}.")
        if result.gate_problems:
            doc.para("Not usable, so the gate cannot pass: " + "; ".join(result.gate_problems) + ".")
        if result.gate_hint:
            doc.para(f"To let the gate judge the rules it could not: {result.gate_hint}.")
    doc.raw("\n")
    doc.table(
        ["Rung", "Gate", "Compared"],
        [
            [
                p.rung,
                NA if p.comparison is None or p.comparison.gate is None else p.comparison.gate.result,
                "yes" if p.comparison is not None else f"no: {p.reason}",
            ]
            for p in result.pairs
        ],
    )
    for pair in result.pairs:
        if pair.comparison is None:
            continue
        doc.h2(f"Rung {pair.rung}")
        doc.para(f"`{pair.base_folder}` vs `{pair.new_folder}`.")
        if pair.comparison.gate is not None:
            _gate(doc, pair.comparison.gate, doc.h3)
        _body(doc, pair.comparison)
    return doc.text()

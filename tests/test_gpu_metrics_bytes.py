"""DRAM bytes from Nsight Systems' sampled GPU metrics (nsight/gpu_metrics.py): the integral of a piecewise-constant
rate over kernels' busy intervals, the trace's samples, and the Stage 2 rows and report section built from them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from helpers import stage2_run
from llm_perf_opt.nsight import commands
from llm_perf_opt.nsight.gpu_metrics import GAP_PERIODS, READ_METRIC, WRITE_METRIC, SampledRate, merge_intervals
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.pipeline.stage2 import render
from test_stage2_pipeline import _stage2_folder, compose_stage2, stage2_metrics

PEAK = 3.35e12  # the H100's DRAM peak in gpus.yaml: 100% of a sample


def test_the_integral_is_exact_for_a_piecewise_constant_rate() -> None:
    # samples every 10 ns: 50% over (0, 10], 100% over (10, 20], 0% over (20, 30]
    rate = SampledRate.from_samples([0, 10, 20, 30], [7.0, 50.0, 100.0, 0.0])
    assert rate.period_ns == 10
    assert rate.integral([(0, 30)]) == pytest.approx((5 + 10) * 1e-9)
    assert rate.integral([(5, 15)]) == pytest.approx((2.5 + 5) * 1e-9)  # half of each sample
    # overlapping kernels count their union once; gaps between them count nothing
    assert rate.integral([(0, 10), (5, 10), (20, 30)]) == pytest.approx(5e-9)
    assert rate.integral([(40, 50)]) == 0.0 and rate.integral([]) == 0.0
    assert SampledRate.from_samples([], []).integral([(0, 10)]) == 0.0


def test_an_interval_over_dropped_samples_is_not_covered() -> None:
    # every 10 ns up to 30, then nothing until 100 (samples dropped), then every 10 ns again
    rate = SampledRate.from_samples([0, 10, 20, 30, 100, 110, 120], [0.0] + [50.0] * 6)
    assert rate.period_ns == 10 and rate.dropped_ns == 70 and rate.span_ns == 120
    assert rate.covers([(1, 30)]) and rate.covers([(101, 120)]) and rate.covers([(5, 8), (102, 108)])
    assert not rate.covers([(25, 35)])  # runs into the gap
    assert not rate.covers([(5, 8), (40, 50)])  # one of its kernels lies in the gap
    assert not rate.covers([(115, 130)]) and not rate.covers([(-5, 5)])  # outside the sampled span
    assert not SampledRate.from_samples([0], [1.0]).covers([(0, 0)])
    assert SampledRate.from_samples([0, 10, 20], [1.0, 1.0, 1.0]).dropped_ns == 0


def test_merge_intervals_gives_the_union() -> None:
    assert merge_intervals([(5, 8), (0, 3), (2, 4), (8, 9), (10, 10)]) == [(0, 4), (5, 9)]


def _with_samples(
    sqlite: Path, read_pct: float, write_pct: float, period_ns: int = 10_000, drop: tuple[int, int] | None = None
) -> None:
    """Add nsys's GPU-metrics tables to an export: constant read and write throughput over the whole trace, with
    no sample inside `drop` ([start, end) in ns), where nsys lost them."""
    with sqlite3.connect(sqlite) as conn:
        start, end = conn.execute('SELECT MIN(start), MAX("end") FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
        conn.execute(
            "CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, "
            "metricId INTEGER, metricName TEXT)"
        )
        conn.execute(
            "CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, "
            "metricId INTEGER, value INTEGER)"
        )
        names = [(1, 0, "GH100", 18, READ_METRIC), (1, 0, "GH100", 19, WRITE_METRIC), (1, 0, "GH100", 3, "SMs Active")]
        conn.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, ?, ?, ?)", names)
        times = [
            t
            for t in range(start - period_ns, end + 2 * period_ns, period_ns)
            if not drop or not drop[0] <= t < drop[1]
        ]
        rows = [(t, t, 1, metric, value) for t in times for metric, value in ((18, read_pct), (19, write_pct))]
        conn.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", rows)


def test_stage2_reports_the_sampled_bytes_of_each_stage_instance(tmp_path: Path) -> None:
    folder = _stage2_folder(tmp_path)
    sqlite = folder / "nsys" / "report.sqlite"
    assert stage2_metrics(render(folder)).sampled_dram is None  # a trace without samples: no section
    assert "sampled GPU metrics" not in (folder / "report.md").read_text()
    _with_samples(sqlite, read_pct=10, write_pct=4)
    with NsysTrace(sqlite) as trace:
        busy = {
            stage: [sum(e - s for s, e in merge_intervals(i)) for i in trace.instance_intervals(stage)]
            for stage in ("prefill", "decode/step")
        }
    metrics = stage2_metrics(render(folder))
    sampled = metrics.sampled_dram
    assert sampled is not None and sampled.period_us == pytest.approx(10.0) and sampled.scale.value == PEAK
    rows = {r.stage: r for r in sampled.rows}
    assert "decode" not in rows  # its steps stand for it
    for stage, per_instance in busy.items():
        row = rows[stage]
        mean_s = sum(per_instance) / len(per_instance) * 1e-9
        assert row.instances == len(per_instance) and row.busy_ms == pytest.approx(mean_s * 1e3)
        assert row.dram_read_bytes == pytest.approx(0.10 * mean_s * PEAK, rel=1e-6)
        assert row.dram_write_bytes == pytest.approx(0.04 * mean_s * PEAK, rel=1e-6)
    assert set(rows) >= {"prefill", "vision/sam", "decode/step"}
    report = (folder / "report.md").read_text()
    assert "## DRAM bytes per stage instance from sampled GPU metrics (Nsight Systems)" in report
    assert "every 10.0 µs" in report and "3,350 GB/s" in report


def test_gpu_metrics_sampling_on_the_nsys_command_line() -> None:
    argv = commands.nsys_profile_argv(Path("nsys"), Path("out"), ["w"], gpu_metrics_hz=100_000)
    assert "--gpu-metrics-devices=all" in argv and "--gpu-metrics-frequency=100000" in argv
    assert not any(a.startswith("--gpu-metrics") for a in commands.nsys_profile_argv(Path("nsys"), Path("o"), ["w"]))
    with pytest.raises(ValueError, match="gpu_metrics_hz"):
        commands.nsys_profile_argv(Path("nsys"), Path("out"), ["w"], gpu_metrics_hz=5)


@pytest.mark.parametrize("value", ["5", "true", "'fast'", "300000"])
def test_a_bad_sampling_rate_is_refused_before_nsys(value: str, tmp_path: Path) -> None:
    """Typed (config_schema.NsysSchema): refused on the command line, in one paragraph, before anything composes."""
    from llm_perf_opt.errors import UserError
    from llm_perf_opt.override_keys import check_override_keys

    with pytest.raises(UserError, match=r"pipeline\.nsys\.gpu_metrics_hz"):
        check_override_keys("stage2", [f"pipeline.nsys.gpu_metrics_hz={value}"], command="stage2-profile")
    run = stage2_run(compose_stage2("pipeline.nsys.gpu_metrics_hz=100000"), tmp_path, "x", [])
    assert run.settings.nsys.gpu_metrics_hz == 100_000


def test_instances_under_dropped_samples_are_left_out(tmp_path: Path) -> None:
    folder = _stage2_folder(tmp_path)
    sqlite = folder / "nsys" / "report.sqlite"
    with NsysTrace(sqlite) as trace:
        steps = trace.instance_intervals("decode/step")
        prefills = trace.instance_intervals("prefill")
    first_step = merge_intervals(steps[0])
    _with_samples(sqlite, read_pct=10, write_pct=4, drop=(first_step[0][0] - 5_000, first_step[-1][1] + 5_000))
    metrics = stage2_metrics(render(folder))
    assert metrics.sampled_dram is not None
    rows = {r.stage: r for r in metrics.sampled_dram.rows}
    assert rows["decode/step"].left_out == 1 and rows["decode/step"].instances == len(steps) - 1
    assert rows["prefill"].left_out == 0 and rows["prefill"].instances == len(prefills)
    assert metrics.sampled_dram.dropped_s is not None and metrics.sampled_dram.dropped_s > 0
    report = (folder / "report.md").read_text()
    assert f"|decode/step|{len(steps) - 1} of {len(steps)}|" in report
    assert "an instance whose kernels touch a gap is left out" in report
    # the gap threshold the analysis used, from the record (reports do not import nsight)
    assert metrics.sampled_dram.gap_periods == GAP_PERIODS
    assert f"(gaps longer than {GAP_PERIODS:g} sample periods)" in report

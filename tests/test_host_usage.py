"""The host's side of the timed passes (CPU time, page faults, context switches from getrusage): added up over the
timed passes only, kept in metrics.json and shown in report.md."""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.instruments.host_usage import HostUsageMeter, added
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.records.stage1 import HostUsage
from llm_perf_opt.report.stage1_reports import host_usage_line


def test_the_meter_adds_up_the_passes_run_inside_it() -> None:
    meter = HostUsageMeter()
    assert meter.total is None
    for _ in range(2):
        with meter.timed_pass():
            sum(i * i for i in range(200_000))  # CPU work the usage must show
            Path(__file__).read_bytes()
    total = meter.total
    assert total is not None and total.passes == 2
    assert total.wall_s > 0 and total.user_cpu_s + total.system_cpu_s > 0
    assert total.pass_thread_cpu_s is not None and total.pass_thread_cpu_s > 0
    assert min(total.minor_faults, total.major_faults, total.voluntary_switches, total.involuntary_switches) >= 0
    one = HostUsage(1, 2.0, 1.0, 0.5, 100, 0, 10, 4, pass_thread_cpu_s=1.25)
    assert added(None, one) == one
    assert added(one, one) == HostUsage(2, 4.0, 2.0, 1.0, 200, 0, 20, 8, pass_thread_cpu_s=2.5)
    assert one.per_pass(one.wall_s) == 2.0 and HostUsage(0, 0, 0, 0, 0, 0, 0, 0).per_pass(1.0) == 0.0
    assert host_usage_line(added(one, one)) == (
        "Host over the 2 timed passes, per pass: 1.50 s of CPU (user 1.00, system 0.50 s, 1.25 s of it the passes' "
        "thread) in 2.00 s of wall time, 100 minor and 0 major page faults, 4 involuntary and 10 voluntary context "
        "switches (getrusage: this process and its threads, time.thread_time; more involuntary switches or system "
        "time at the same kernels means a busier host, more CPU in the passes' thread for the same work a slower CPU)"
    )
    older = attrs.evolve(one, pass_thread_cpu_s=None)  # a run recorded before the thread's time was
    assert added(older, one).pass_thread_cpu_s is None
    assert "the passes' thread)" not in host_usage_line(older)


def test_a_run_records_the_host_usage_of_its_timed_passes_only(tmp_path: Path) -> None:
    cfg = compose_config(
        "stage1",
        "model=deepseek_ocr2_tiny",
        "device=cpu",
        "run.repeats=3",
        "run.warmup=1",
        "infer.max_new_tokens=2",
        "pipeline.torch_profiler.enable=false",
        "pipeline.memory.enable=false",
        "pipeline.energy.enable=false",
    )
    Stage1Run(command_config(cfg), tmp_path / "run", run_id="host").execute()
    metrics = load_stage1(tmp_path / "run").metrics
    usage = metrics.host_usage
    assert usage is not None and usage.passes == len(metrics.records) == 3  # warm-up and FLOP count left out
    assert usage.wall_s > 0 and usage.user_cpu_s > 0
    process_cpu_s = usage.user_cpu_s + usage.system_cpu_s
    assert usage.pass_thread_cpu_s is not None and 0 < usage.pass_thread_cpu_s <= process_cpu_s * 1.01 + 0.01
    timed_s = sum(r.e2e_ms for r in metrics.records) / 1000
    assert usage.wall_s >= timed_s * 0.99  # it spans the passes it counts
    assert "Host over the 3 timed passes, per pass:" in (tmp_path / "run" / "report.md").read_text()

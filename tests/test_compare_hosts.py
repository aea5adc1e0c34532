"""`perf-compare` says when two runs' hosts behaved differently (each run's own host usage over its timed passes),
lists it among the environment differences, marks the host-paced verdicts, and suggests pinning the threads,
instead of leaving a setting to take the blame."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from llm_perf_opt.measure import host_difference
from llm_perf_opt.pipeline import compare as cmp
from llm_perf_opt.pipeline.gate_rules import parse_rules
from llm_perf_opt.records.stage1 import HostUsage
from llm_perf_opt.report.comparison import comparison_markdown

CPU_TINY = Path(__file__).parent / "fixtures" / "compare" / "cpu_tiny"


def usage(cpu_per_pass: float, wall_per_pass: float, involuntary_per_pass: int = 20, passes: int = 2) -> HostUsage:
    return HostUsage(
        passes=passes,
        wall_s=wall_per_pass * passes,
        user_cpu_s=0.9 * cpu_per_pass * passes,
        system_cpu_s=0.1 * cpu_per_pass * passes,
        minor_faults=1000,
        major_faults=0,
        voluntary_switches=50,
        involuntary_switches=involuntary_per_pass * passes,
    )


def figures(*args: Any) -> host_difference.HostFigures | None:
    return host_difference.host_figures(usage(*args))


def test_a_host_figure_differs_from_one_and_a_half_times() -> None:
    base = figures(0.50, 0.52)
    assert host_difference.differing(base, figures(0.70, 0.72)) == ()  # 1.4×: alike
    assert host_difference.differing(base, figures(0.75, 0.78, 30)) == ("host CPU per pass",)  # 1.5×
    # the same CPU in twice the wall time: the process kept half as many cores busy
    assert host_difference.differing(base, figures(0.50, 1.04, 40)) == ("host CPU against wall",)
    # involuntary switches count from 10 per second in the busier run
    assert host_difference.differing(figures(0.5, 1.0, 2), figures(0.5, 1.0, 8)) == ()
    assert host_difference.differing(figures(0.5, 1.0, 2), figures(0.5, 1.0, 30)) == ("host involuntary switches",)
    assert host_difference.differing(base, None) == () and host_difference.host_figures(None) is None


def _run(tmp_path: Path, name: str, host: HostUsage | None, kv_cache: str = "dynamic") -> Path:
    """The CPU tiny run as a run of its own, with its host usage and KV cache as given."""
    folder = shutil.copytree(CPU_TINY, tmp_path / name)
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics.update(run_id=name)
    metrics["settings"]["runtime"] = {"kv_cache": kv_cache}
    if host is not None:
        metrics["host_usage"] = {
            "passes": host.passes,
            "wall_s": host.wall_s,
            "user_cpu_s": host.user_cpu_s,
            "system_cpu_s": host.system_cpu_s,
            "minor_faults": host.minor_faults,
            "major_faults": host.major_faults,
            "voluntary_switches": host.voluntary_switches,
            "involuntary_switches": host.involuntary_switches,
        }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def _section(markdown: str, title: str) -> str:
    rest = markdown[markdown.index(title) + len(title) :]
    return rest[: rest.find("\n### ")] if "\n### " in rest else rest


def test_a_busier_host_is_said_beside_the_setting(tmp_path: Path) -> None:
    """The issue's pair: a static-cache run on a shared machine, 2.66 s of CPU per pass against 0.50 s."""
    base = _run(tmp_path, "dynamic", usage(0.50, 0.52))
    static = _run(tmp_path, "static", usage(2.66, 4.84, involuntary_per_pass=400), kv_cache="static")
    result = cmp.compare([base, static])
    assert result.stage1 is not None
    assert result.stage1.host_differences == (
        (
            "host CPU per pass: 0.50 s (dynamic) vs 2.66 s (static)",
            "host CPU against wall: 0.50 s in 0.52 s (0.96 cores) (dynamic) vs 2.66 s in 4.84 s (0.55 cores) (static)",
            "host involuntary switches: 38/s (20 per pass) (dynamic) vs 83/s (400 per pass) (static)",
        ),
    )
    md = comparison_markdown(result)
    differences = _section(md, "### Configuration and environment differences")
    assert "|runtime.kv_cache|dynamic|static|" in differences  # the setting, and beside it the hosts
    assert "|host CPU per pass|0.50 s|2.66 s|" in differences
    assert "|host CPU against wall|0.50 s in 0.52 s (0.96 cores)|2.66 s in 4.84 s (0.55 cores)|" in differences
    stages = _section(md, "### Stage times (p50, ms)")
    # a CPU run: no stage is known to be GPU-paced, so every verdict says the hosts differed
    verdicts = [line.split("|")[5] for line in stages.splitlines() if line.startswith("|") and "ratio" not in line]
    verdicts = [v for v in verdicts if v and ":---" not in v]
    assert verdicts and all(v.endswith("(hosts differed)") for v in verdicts)
    assert "The hosts differed" in stages and "OMP_NUM_THREADS=1" in stages and "run.cpu_affinity=auto" in stages


def test_alike_or_unrecorded_hosts_add_nothing(tmp_path: Path) -> None:
    for name, (a, b) in {"alike": (usage(0.50, 0.52), usage(0.55, 0.56)), "older": (None, None)}.items():
        folder = tmp_path / name
        md = comparison_markdown(cmp.compare([_run(folder, "a", a), _run(folder, "b", b)]))
        assert "hosts differed" not in md and "host CPU" not in md and "OMP_NUM_THREADS" not in md


def test_the_gate_says_the_hosts_differed(tmp_path: Path) -> None:
    base = _run(tmp_path, "dynamic", usage(0.50, 0.52))
    static = _run(tmp_path, "static", usage(2.66, 4.84), kv_cache="static")
    gate = cmp.compare([base, static], cmp.GateOptions(parse_rules(["e2e_ms:+5%"]))).gate
    assert gate is not None and gate.host_differences[0] == "host CPU per pass: 0.50 s (dynamic) vs 2.66 s (static)"
    md = comparison_markdown(cmp.compare([base, static], cmp.GateOptions(parse_rules(["e2e_ms:+5%"]))))
    gate_section = md[md.index("## Gate") : md.index("## Runs")]
    assert "The hosts differed" in gate_section and "OMP_NUM_THREADS=1" in gate_section


def test_gpu_paced_stages_are_not_marked(tmp_path: Path) -> None:
    """A stage the runs record as GPU-paced keeps its verdict unmarked, whatever the host did."""
    base = _run(tmp_path, "a", usage(0.50, 0.52))
    other = _run(tmp_path, "b", usage(2.66, 4.84))
    for folder in (base, other):
        metrics = json.loads((folder / "metrics.json").read_text())
        spread = {"within_image_cv_median": None, "within_image_cv_max": None, "worst_image": None}
        metrics["variation"] = [
            {"stage": "prefill", "per_image": [], "images_judged": 0, **spread, "image_mix_cv": None},
        ]
        metrics["variation"][0]["noise_side"] = "GPU-side"
        (folder / "metrics.json").write_text(json.dumps(metrics))
    result = cmp.compare([base, other])
    assert result.stage1 is not None
    marks = {row.stage: row.others[0].host_differed for row in result.stage1.stage_times}
    assert marks["prefill"] is False and marks["decode"] is True

"""Report details a reader trips over: object addresses in operator names, tiny utilisations printed as 0.00%,
all-zero device columns on a CPU run, and an interrupted run's header."""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.measure.torch_profiler import operator_name
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.report.markdown import pct
from llm_perf_opt.report.stage1_reports import operators_md, report_md

RUN = Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1"


def test_operator_names_lose_object_addresses() -> None:
    name = "<built-in method to of Tensor object at 0x7f3a2c1b9e40>"
    assert operator_name(name) == "<built-in method to of Tensor>"
    assert operator_name("aten::mm") == "aten::mm"


def test_tiny_fractions_keep_significant_digits() -> None:
    assert pct(0.0000123, 2) == "0.0012%"
    assert pct(0.0123, 2) == "1.23%" and pct(0.0, 2) == "0.00%" and pct(None) == "n/a"


def test_cpu_operator_tables_have_no_device_columns() -> None:
    folder = load_stage1(RUN)
    assert folder.operators is not None and folder.operators.sort_key == "self_cpu_ms"
    text = operators_md(folder.metrics, folder.operators, 5)
    assert "device ms" not in text and "self CPU ms" in text


def test_an_interrupted_run_says_how_many_passes_it_measured() -> None:
    m = load_stage1(RUN).metrics
    stopped = attrs.evolve(m, settings=attrs.evolve(m.settings, partial=True, measured_passes=2, asked_passes=3))
    assert "1 image(s), 2 of 3 timed passes measured (stopped early)" in report_md(stopped, None, [])
    assert "1 image(s) × 3 timed pass(es)" in report_md(m, None, [])

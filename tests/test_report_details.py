"""Report details a reader trips over: object addresses in operator names, tiny utilisations printed as 0.00%,
all-zero device columns on a CPU run, and an interrupted run's header."""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.instruments.torch_profiler import operator_name
from llm_perf_opt.records.folders import load_stage1, load_stage1_metrics
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report.markdown import pct
from llm_perf_opt.report.stage1_reports import assumptions_md, operators_md, report_md, stakeholder_md

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


def _one_input_at_batch_2() -> Stage1Metrics:
    """The batch-2 fixture cut to one input: run.batch_size=2 with a single page, so each batch ran as a batch of 1."""
    m = load_stage1_metrics(RUN.parents[1] / "metrics" / "cpu_tiny_batch2_stage1.json")
    page = m.images[0]
    return attrs.evolve(
        m,
        records=tuple(r for r in m.records if r.image == page),
        per_image={page: m.per_image[page]},
        batches=tuple(attrs.evolve(b, images=(page,)) for b in m.batches),
    )


def test_a_batch_that_ran_smaller_than_run_batch_size_is_named_as_it_ran() -> None:
    m = _one_input_at_batch_2()
    assert m.settings.batch_size == 2
    text = report_md(m, None, [])
    header = text.split("\n## ", 1)[0]
    assert "batch 1 (run.batch_size=2, 1 input)" in header and "batch 2" not in header
    assert "batch-2" not in text and "batches of 2" not in text
    assert "Batch size 1 (run.batch_size=2, 1 input)" in stakeholder_md(m)
    folder = load_stage1(RUN)
    assert folder.inputs is not None
    assert "Batch size: 1 (run.batch_size=2, 1 input)" in assumptions_md(m, folder.inputs)


def test_a_full_batch_is_named_with_its_size() -> None:
    m = load_stage1_metrics(RUN.parents[1] / "metrics" / "cpu_tiny_batch2_stage1.json")  # 2 inputs, batch 2
    assert "dynamic KV cache, eager, batch 2 ·" in report_md(m, None, [])

"""Stage 1's outputs: the run's records (metrics.json, the operators, the kept logits, the predictions) and its
reports, and the rows of its closing summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from llm_perf_opt.analytic.workload import RunWorkload
from llm_perf_opt.measure.advice import advise
from llm_perf_opt.measure.outputs import save_prefill_logits, save_top_two
from llm_perf_opt.measure.stage1_analysis import Stage1Analysis
from llm_perf_opt.pipeline.analytic import write_analytic_report_for_run
from llm_perf_opt.pipeline.stage1_records import analysis_setup, inputs_manifest, run_predictions
from llm_perf_opt.pipeline.stage1_settings import run_settings
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import METRICS_FILE, OPERATORS_FILE, PREFILL_LOGITS_FILE, TOP2_LOGITS_FILE
from llm_perf_opt.records.io import dumps_lines
from llm_perf_opt.records.stage1 import ProfilerSettings, Stage1Metrics
from llm_perf_opt.report import stage1_reports
from llm_perf_opt.report.markdown import pct

if TYPE_CHECKING:
    from llm_perf_opt.artifacts import ArtifactsManager
    from llm_perf_opt.config_data import CommandConfig
    from llm_perf_opt.data.dataset import DatasetSelection
    from llm_perf_opt.data.inputs import InputChoice
    from llm_perf_opt.measure.stage1_analysis import Stage1Measurements
    from llm_perf_opt.pipeline.shard import ShardSync
    from llm_perf_opt.pipeline.stage1_settings import ResolvedSettings
    from llm_perf_opt.progress import Feedback
    from llm_perf_opt.records.whatif import WhatIfRecord
    from llm_perf_opt.session.cpu_affinity import CpuPin
    from llm_perf_opt.session.runtime import RuntimeSettings
    from llm_perf_opt.session.session import InferenceSession


class FinishedRun(Protocol):
    """What the outputs read of a Stage 1 run once its passes ended (`pipeline.stage1.Stage1Run`)."""

    command: CommandConfig
    run_id: str
    art: ArtifactsManager
    feedback: Feedback
    state: Stage1Measurements
    session: InferenceSession | None
    selection: DatasetSelection | None
    inputs: InputChoice | None
    settings: ResolvedSettings | None
    runtime: RuntimeSettings
    profiler: ProfilerSettings
    whatif: WhatIfRecord | None
    cpu_pin: CpuPin | None
    render_reports: bool
    sync: ShardSync | None
    share: tuple[str, int, bool] | None


def write_outputs(run: FinishedRun, partial: bool) -> Stage1Metrics:
    """`run`'s records, then its reports (`report.render`); metrics.json again with the time budget, which
    report.md shows. `partial`: the run stopped before its last pass."""
    assert run.session is not None and run.selection is not None and run.settings is not None
    recorded = run_settings(
        run.command,
        run.settings,
        run.runtime,
        run.inputs,
        profiler=run.profiler,
        measured_passes=len(run.state.records),
        partial=partial,
        cpu_affinity=run.cpu_pin.describe() if run.cpu_pin is not None else None,
    )
    setup = analysis_setup(run.command, run.session, run.run_id, recorded, run.inputs)
    if run.sync is not None and run.share is not None:
        run.state.shard = run.sync.info(*run.share)
    metrics = Stage1Analysis(run.state, setup).metrics()
    run.art.write_json(METRICS_FILE, metrics)
    if run.session.adapter.has_analytic_model and metrics.records:  # priced as measured: tiles, tokens, dtype
        priced = RunWorkload.from_records(metrics.records, metrics.model.dtype)
        write_analytic_report_for_run(run.art, run.command, priced)
    if run.state.operators is not None:
        run.art.write_json(OPERATORS_FILE, run.state.operators)
    if run.state.prefill_logits:
        save_prefill_logits(run.art.path(PREFILL_LOGITS_FILE), run.state.prefill_logits)
        run.art.record(PREFILL_LOGITS_FILE)
    if run.state.top2:
        save_top_two(run.art.path(TOP2_LOGITS_FILE), run.state.top2)
        run.art.record(TOP2_LOGITS_FILE)
    outputs = metrics.settings.outputs
    predictions = run_predictions(
        run.session, run.selection, run.state.predictions, outputs.extra.deepseek_ocr.strip_special_tokens
    )
    if outputs.prediction.enable:
        target = run.art.resolve_save_dir(outputs.prediction.save_dir) / "predictions.jsonl"
        run.art.write_anywhere(target, dumps_lines(predictions))
    inputs = inputs_manifest(run.inputs)
    plots: dict[str, str] = {}
    advice = advise(metrics, run.whatif) if run.render_reports else ()
    if run.render_reports:
        plots = stage1_reports.write_details(
            run.art,
            metrics,
            inputs=inputs,
            operators=run.state.operators,
            predictions=predictions,
            advice=advice,
            whatif=run.whatif,
        )
    metrics = attrs.evolve(metrics, time_budget=run.feedback.budget())
    run.art.write_json(METRICS_FILE, metrics)
    if run.render_reports:
        stage1_reports.write_report(
            run.art,
            metrics,
            plots,
            inputs=inputs,
            operators=run.state.operators,
            advice=advice,
            whatif=run.whatif,
        )
    return metrics


def summary_rows(m: Stage1Metrics) -> list[tuple[str, str]]:
    """The closing summary's rows: the model, the device, the passes and the median stage times."""
    p50 = {s.stage: s.summary.p50 for s in m.stages}
    mfu = {r.stage: r.mfu for r in m.mfu}
    eff = {e.stage: e for e in m.efficiency}
    decode = eff.get(vocab.DECODE)
    return [
        ("model", f"{m.model.name} ({m.model.weights}, {m.model.dtype})"),
        ("device", m.device.name),
        ("images x passes", f"{len(m.images)} x {m.settings.repeats}"),
        ("end to end (p50)", f"{p50.get('e2e', 0):,.1f} ms"),
        ("prefill (p50)", f"{p50.get(vocab.PREFILL, 0):,.1f} ms, MFU {pct(mfu.get(vocab.PREFILL))}"),
        (
            "decode per token (p50)",
            f"{p50.get(vocab.DECODE_STEP, 0):,.2f} ms, MBU {pct(decode.mbu if decode else None)}",
        ),
    ]

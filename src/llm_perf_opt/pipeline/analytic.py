"""`analytic-report` and Stage 1's `static_analysis/` step: compose the workload, price it into an
:class:`AnalyticReport`, write `static_analysis/analytic_model/report.json` and `report.md` under the run folder.

A config report prices the page the config describes (`analytic.*`); a run report prices the inputs a Stage 1 run
measured (:class:`RunWorkload`: each input's tiles or crop grid, tokens, and the run's dtype).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from llm_perf_opt.analytic.model import CONVENTIONS, StageCost, stage_costs, summed_stages
from llm_perf_opt.analytic.pricing import category_table, module_table, stage_bounds, stage_row, view_sweep, what_if
from llm_perf_opt.analytic.settings import AnalyticSettings, PricedModel
from llm_perf_opt.analytic.spec import ModelSpec, Workload
from llm_perf_opt.analytic.workload import RunWorkload, configured_workload, run_workloads, workload_row
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import CommandConfig
from llm_perf_opt.errors import UserError
from llm_perf_opt.hardware.table import GpuSpec, load_gpu_table
from llm_perf_opt.records.analytic import ANALYTIC_DIR, AnalyticReport, InputCost, ModeSweep, RunInputs, TileSweep
from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.io import dumps
from llm_perf_opt.records.vocabulary import DECODE, PREFILL
from llm_perf_opt.report.analytic_report import analytic_report_md

CONFIG_WEIGHTS = "none: priced from the config alone"
RUN_WEIGHTS = "none: priced from the config and the inputs the run measured"


def check_workload_model(command: CommandConfig) -> None:
    """Refuse a named workload with a model it is not written for, in one paragraph, before anything runs."""
    if command.workload_profile is not None:
        command.workload_profile.check_model(command.model.name)


def analytic_settings(command: CommandConfig) -> AnalyticSettings:
    """The analytic settings of a command's settings (`analytic`, `workload_profile`, the model), checked once."""
    model = PricedModel.from_settings(command.model)
    return AnalyticSettings.from_config(command.analytic, model, command.workload_profile)


def report_gpus(settings: AnalyticSettings) -> tuple[list[GpuSpec], GpuSpec]:
    """The GPUs of `analytic.gpus` and the one the view sweep is priced on (`analytic.reference_gpu`, else the
    first), or a UserError naming the keys missing from the hardware table."""
    table = {g.key: g for g in load_gpu_table()}
    unknown = [k for k in settings.gpus if k not in table]
    if unknown:
        raise UserError(
            f"analytic.gpus names GPUs missing from the hardware table: {', '.join(unknown)}",
            f"Use keys from hardware/gpus.yaml: {', '.join(table)}",
        )
    gpus = [table[k] for k in settings.gpus]
    return gpus, table.get(settings.reference_gpu, gpus[0])


def _assemble(
    settings: AnalyticSettings,
    spec: ModelSpec,
    page: Workload,
    costs: Mapping[str, StageCost],
    dtype: str,
    gpus: Sequence[GpuSpec],
    reference: GpuSpec,
    weights: str,
    run: RunInputs | None = None,
) -> AnalyticReport:
    """The report of `costs` (one page, or a run's inputs summed) on `gpus`, with `page` as the starting point of
    the view sweep on `reference`."""
    sweep = view_sweep(settings, spec, page, reference, dtype)
    return AnalyticReport(
        schema_version=SCHEMA_VERSION,
        model=settings.model.name,
        weights=weights,
        workload_profile=settings.profile.as_dict() if settings.profile else None,
        conventions=CONVENTIONS,
        workload=workload_row(spec, page, settings.model.mode_name, dtype),
        stages={stage: stage_row(cost) for stage, cost in costs.items()},
        categories={stage: category_table(cost) for stage, cost in costs.items()},
        modules={stage: module_table(costs[stage]) for stage in (PREFILL, DECODE)},
        what_if=what_if(costs, gpus, dtype),
        tile_sweep=sweep if isinstance(sweep, TileSweep) else None,
        mode_sweep=sweep if isinstance(sweep, ModeSweep) else None,
        run=run,
    )


def build_report(command: CommandConfig) -> AnalyticReport:
    """The analytic report of the page the config describes."""
    settings = analytic_settings(command)
    spec = ModelSpec.from_architecture(settings.model.architecture)
    workload = configured_workload(settings)
    gpus, reference = report_gpus(settings)
    costs = stage_costs(spec, workload)
    return _assemble(settings, spec, workload, costs, settings.dtype, gpus, reference, CONFIG_WEIGHTS)


def build_run_report(command: CommandConfig, priced: RunWorkload) -> AnalyticReport:
    """The analytic report of the inputs a Stage 1 run measured: each input priced as it ran, the tables summed."""
    settings = analytic_settings(command)
    gpus, reference = report_gpus(settings)
    spec = ModelSpec.from_architecture(settings.model.architecture)
    inputs = run_workloads(settings.model, spec, priced)
    per_input = [stage_costs(spec, workload) for _, workload in inputs]
    mode = settings.model.mode_name
    run = RunInputs(
        gpu=reference.display_name,
        inputs=tuple(
            InputCost(
                image=image,
                workload=workload_row(spec, workload, mode, priced.dtype),
                stages={stage: stage_row(cost) for stage, cost in costs.items()},
                bounds=stage_bounds(costs, reference, priced.dtype),
            )
            for (image, workload), costs in zip(inputs, per_input, strict=True)
        ),
    )
    costs = summed_stages(per_input)
    return _assemble(settings, spec, inputs[0][1], costs, priced.dtype, gpus, reference, RUN_WEIGHTS, run)


def _write(art: ArtifactsManager, report: AnalyticReport) -> Path:
    art.write_text(f"{ANALYTIC_DIR}/report.json", dumps(report))
    return art.write_text(f"{ANALYTIC_DIR}/report.md", analytic_report_md(report))


def write_analytic_report(art: ArtifactsManager, command: CommandConfig) -> Path:
    """Write report.json and report.md of the configured page under `static_analysis/analytic_model/`."""
    return _write(art, build_report(command))


def write_analytic_report_for_run(art: ArtifactsManager, command: CommandConfig, priced: RunWorkload) -> Path:
    """Write report.json and report.md of the inputs a Stage 1 run measured under `static_analysis/analytic_model/`."""
    return _write(art, build_run_report(command, priced))

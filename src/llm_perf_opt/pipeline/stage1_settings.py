"""Stage 1's settings, parsed from the config once at the edge: the effective run settings after device defaults
(and where each came from), the warm-up a compiled runtime needs, the profiler settings, the settings recorded in
`metrics.json` and the config's digest."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import attrs
import torch
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.config_data import CommandConfig
from llm_perf_opt.config_schema import Stage1Nodes, TorchProfilerSchema
from llm_perf_opt.data.inputs import InputChoice
from llm_perf_opt.errors import require_bool, require_whole
from llm_perf_opt.instruments.measured_peaks import check_peaks_setting
from llm_perf_opt.output_settings import output_settings
from llm_perf_opt.records.stage1 import ProfilerSettings, RunSettings
from llm_perf_opt.session.runtime import RuntimeSettings


@attrs.frozen
class ResolvedSettings:
    """The effective run settings after device defaults (and where each came from)."""

    repeats: int
    warmup: int
    max_new_tokens: int
    max_images: int | None
    sampling: str
    sources: Mapping[str, str]  # key -> "override/config" or "device default (cpu)"
    #: Seconds the timed passes of an input may take when run.repeats is the device default (at least
    #: `MIN_TIMED_PASSES`): `with_timed_budget` fixes the count from the first timed pass. None: `repeats`.
    timed_seconds: float | None = None


@attrs.frozen
class RunOptions:
    """Stage 1's switches (`run.*`, `report.*`, `hardware.peaks`), read once from the typed nodes (their defaults:
    `config_schema`'s)."""

    cpu_affinity: str
    profiler_window: bool
    save_prefill_logits: bool
    save_top2_logits: bool
    check_batch_fit: bool
    fill_batches: bool
    render: bool  # report.render: Markdown and plots beside the records
    whatif_dir: str | None  # report.whatif_dir: the what-if run the reports cite
    peaks: str  # hardware.peaks

    @classmethod
    def from_nodes(cls, nodes: Stage1Nodes) -> RunOptions:
        """From the typed nodes; a bad value is a UserError naming it."""
        run, report = nodes.run, nodes.report
        return cls(
            cpu_affinity=run.cpu_affinity,
            profiler_window=require_bool("run.profiler_window", run.profiler_window),
            save_prefill_logits=require_bool("run.save_prefill_logits", run.save_prefill_logits),
            save_top2_logits=require_bool("run.save_top2_logits", run.save_top2_logits),
            check_batch_fit=require_bool("run.check_batch_fit", run.check_batch_fit),
            fill_batches=require_bool("run.fill_batches", run.fill_batches),
            render=require_bool("report.render", report.render),
            whatif_dir=report.whatif_dir,
            peaks=check_peaks_setting(nodes.hardware.peaks),
        )


ALL = "all"  # dataset.max_images=all: every image, on every device


def resolve_settings(command: CommandConfig, device: torch.device) -> ResolvedSettings:
    """Explicit values win; unset (null) keys take the device default. Bad values raise UserError."""
    nodes, dataset = command.nodes, command.dataset
    counts = nodes.run.device_defaults.cuda if device.type == "cuda" else nodes.run.device_defaults.cpu
    defaults = dataclasses.asdict(counts)
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in (
        ("run.repeats", nodes.run.repeats),
        ("run.warmup", nodes.run.warmup),
        ("infer.max_new_tokens", nodes.infer.max_new_tokens),
        ("dataset.max_images", dataset.max_images),
        ("dataset.sampling", dataset.sampling),
    ):
        short = key.split(".")[1]
        chosen[short] = defaults[short] if value is None else value
        sources[key] = f"device default ({device.type})" if value is None else "config/override"
    return ResolvedSettings(
        repeats=require_whole("run.repeats", chosen["repeats"], 1),
        warmup=require_whole("run.warmup", chosen["warmup"], 0),
        max_new_tokens=require_whole("infer.max_new_tokens", chosen["max_new_tokens"], 1),
        max_images=None  # "all" (or a device default of null): every image
        if chosen["max_images"] in (None, ALL)
        else require_whole("dataset.max_images", chosen["max_images"], 1),
        sampling=str(chosen["sampling"]),
        sources=sources,
        timed_seconds=None if nodes.run.repeats is not None else counts.timed_seconds,
    )


MIN_TIMED_PASSES = 3  # the fewest timed passes an interval is given from


def with_timed_budget(settings: ResolvedSettings, first_pass_s: float) -> ResolvedSettings:
    """`settings` with the timed passes per input that fit `timed_seconds`, given the first timed pass took
    `first_pass_s` (at least `MIN_TIMED_PASSES`, at most `repeats`); unchanged without a budget."""
    budget = settings.timed_seconds
    if budget is None or settings.repeats <= MIN_TIMED_PASSES:
        return settings
    fits = max(MIN_TIMED_PASSES, math.ceil(budget / max(first_pass_s, 1e-9)))
    if fits >= settings.repeats:
        return settings
    why = (
        f"{settings.sources['run.repeats']}: {settings.repeats}, cut to {fits} by its timed_seconds={budget:g} "
        f"(the first timed pass took {first_pass_s:.1f} s; set run.repeats for a fixed count)"
    )
    return attrs.evolve(settings, repeats=fits, timed_seconds=None, sources={**settings.sources, "run.repeats": why})


def with_runtime_warmup(settings: ResolvedSettings, runtime: RuntimeSettings) -> ResolvedSettings:
    """`settings` with at least the warm-up passes `runtime` needs (a compiled step compiles in the first pass of
    each shape): fewer are raised, and the source of run.warmup says from what and why."""
    needed = runtime.warmup_needed
    if settings.warmup >= needed:
        return settings
    compiled = " and ".join(part.text for part in runtime.compiled_parts)
    why = (
        f"raised from {settings.warmup} ({settings.sources['run.warmup']}): {compiled} needs "
        f"{needed} warm-up pass(es) per input, or the timed passes would include compilation"
    )
    return attrs.evolve(settings, warmup=needed, sources={**settings.sources, "run.warmup": why})


def config_digest(cfg: DictConfig) -> str:
    """sha256 of the resolved config (hydra section excluded; `model.cache_dir` too: where a run keeps its saved
    model changes nothing it measures)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    if isinstance(data.get("model"), dict):
        data["model"].pop("cache_dir", None)
    text = OmegaConf.to_yaml(OmegaConf.create(data), sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def profiler_settings(prof: TorchProfilerSchema) -> ProfilerSettings:
    """`pipeline.torch_profiler` as the run records it: each `ProfilerSettings` field by name (its `output` apart)."""
    return ProfilerSettings(**{field.name: getattr(prof, field.name) for field in attrs.fields(ProfilerSettings)})


def run_settings(
    command: CommandConfig,
    settings: ResolvedSettings,
    runtime: RuntimeSettings,
    inputs: InputChoice | None,
    *,
    profiler: ProfilerSettings,
    measured_passes: int,
    partial: bool,
    cpu_affinity: str | None = None,
) -> RunSettings:
    """The run's effective settings as recorded in `metrics.json` (`profiler`: the profiled pass's, as the run read
    them; `measured_passes`: timed passes measured)."""
    return RunSettings(
        repeats=settings.repeats,
        warmup=settings.warmup,
        max_new_tokens=settings.max_new_tokens,
        max_images=settings.max_images,
        sources=dict(settings.sources),
        workload_profile=command.workload_profile.as_dict() if command.workload_profile else None,
        partial=partial,
        input_kind=inputs.kind if inputs else "image",
        inputs_note=inputs.note if inputs else None,
        profiler=profiler,
        measured_passes=measured_passes,
        asked_passes=len(inputs.selection.images) * settings.repeats if inputs else None,
        outputs=output_settings(command.composed, command.nodes.outputs),
        runtime=runtime.record(),
        fill_batches=command.nodes.run.fill_batches,
        cpu_affinity=cpu_affinity,
    )

"""Stage 2's settings, read from the composed config once at the pipeline's entry (:meth:`Stage2Settings.from_config`)
into frozen records; the defaults are the YAML's (`conf/stage2.yaml`, `conf/pipeline/nsys`, `conf/pipeline/ncu`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.config_data import plain
from llm_perf_opt.config_schema import Stage1Nodes, Stage2ReportSchema
from llm_perf_opt.errors import UserError, require_bool, require_whole
from llm_perf_opt.session.runtime import RuntimeSettings


def _names(values: Iterable[object] | None) -> tuple[str, ...]:
    return tuple(str(v) for v in values or ())


def _text(value: object) -> str | None:
    return None if value is None else str(value)


@attrs.frozen
class Stage2Mode:
    """One of `stage2.modes` (light, deep): which kernels Nsight Compute targets, with which sections."""

    name: str
    top_kernels: int
    sections: tuple[str, ...]
    stages: tuple[str, ...]
    launches_per_kernel: int
    bytes_pass: bool


@attrs.frozen
class NsysSettings:
    """`pipeline.nsys`: how Nsight Systems profiles the workload."""

    enable: bool
    binary: str | None
    trace: tuple[str, ...]
    sample: str
    cpuctxsw: str
    cuda_graph_trace: str | None
    capture_range: str | None
    gpu_metrics_hz: int | None  # None: no GPU metrics sampled
    gpu_metrics_devices: str
    reports: tuple[str, ...]
    timeout_s: float


@attrs.frozen
class NcuSettings:
    """`pipeline.ncu`: how Nsight Compute profiles the targeted kernels, and whether its bytes pass runs."""

    enable: bool
    binary: str | None
    clock_control: str
    target_processes: str
    metrics: tuple[str, ...]
    timeout_s: float
    bytes_pass: bool  # `pipeline.ncu.bytes_pass`, or when null the mode's
    bytes_cache_control: str


@attrs.frozen
class WorkloadCounts:
    """`stage2.workload`: the nsys workload's passes (None: Stage 1's device default; the user's values win)."""

    repeats: int | None
    warmup: int | None


@attrs.frozen
class NcuWorkload:
    """`stage2.ncu_workload`: the ncu workloads' single forward (these win over the user's values)."""

    max_images: int
    max_new_tokens: int
    repeats: int | None


@attrs.frozen
class Stage2Settings:
    """Everything `stage2-profile` reads from its config, checked once."""

    config_text: str  # the composed config, resolved, as config.yaml keeps it
    mode: Stage2Mode
    nsys: NsysSettings
    ncu: NcuSettings
    workload: WorkloadCounts
    ncu_workload: NcuWorkload
    runtime: RuntimeSettings  # the workload's `runtime.*` and `run.batch_size`
    reuse_model: bool  # `stage2.reuse_model`
    own_model: bool  # the model has checkpoint weights or a `model.cache_dir` of the user's
    whatif_dir: str | None  # `report.whatif_dir`
    stage1_dir: str | None  # `report.stage1_dir`

    @classmethod
    def from_config(cls, cfg: DictConfig, nodes: Stage1Nodes) -> Stage2Settings:
        """From the composed `stage2` config and its typed nodes (`nodes`); a bad value is a UserError naming its
        key."""
        stage2 = plain(cfg.stage2)
        nsys, ncu = plain(cfg.pipeline.nsys), plain(cfg.pipeline.ncu)
        report = nodes.report
        model: Mapping[str, Any] = plain(cfg.model) if "model" in cfg else {}
        mode = _mode(stage2)
        bytes_pass = ncu.get("bytes_pass")
        nsys_settings = NsysSettings(
            enable=bool(nsys["enable"]),
            binary=_text(nsys.get("binary")),
            trace=_names(nsys["trace"]),
            sample=str(nsys["sample"]),
            cpuctxsw=str(nsys["cpuctxsw"]),
            cuda_graph_trace=_text(nsys["cuda_graph_trace"]),
            capture_range=_text(nsys["capture_range"]),
            gpu_metrics_hz=_sampling_rate(nsys.get("gpu_metrics_hz")),
            gpu_metrics_devices=str(nsys.get("gpu_metrics_devices") or "all"),
            reports=_names(nsys["reports"]),
            timeout_s=float(require_whole("pipeline.nsys.timeout_s", nsys["timeout_s"], 1)),
        )
        ncu_settings = NcuSettings(
            enable=bool(ncu["enable"]),
            binary=_text(ncu.get("binary")),
            clock_control=str(ncu["clock_control"]),
            target_processes=str(ncu["target_processes"]),
            metrics=_names(ncu["metrics"]),
            timeout_s=float(require_whole("pipeline.ncu.timeout_s", ncu["timeout_s"], 1)),
            bytes_pass=mode.bytes_pass
            if bytes_pass is None
            else require_bool(
                "pipeline.ncu.bytes_pass",
                bytes_pass,
                "Set pipeline.ncu.bytes_pass=true (measure every kernel's DRAM bytes), false, or null (the mode's "
                "choice: deep measures them, light does not)",
            ),
            bytes_cache_control=str(ncu.get("bytes_cache_control") or "none"),
        )
        workload, ncu_workload = stage2["workload"], stage2["ncu_workload"]
        return cls(
            config_text=OmegaConf.to_yaml(cfg, resolve=True),
            mode=mode,
            nsys=nsys_settings,
            ncu=ncu_settings,
            workload=WorkloadCounts(repeats=workload["repeats"], warmup=workload["warmup"]),
            ncu_workload=NcuWorkload(
                int(ncu_workload["max_images"]), int(ncu_workload["max_new_tokens"]), ncu_workload.get("repeats")
            ),
            # bad runtime.* values fail before nsys, not in its child
            runtime=RuntimeSettings.from_nodes(nodes),
            reuse_model=require_bool("stage2.reuse_model", stage2["reuse_model"]),
            own_model=bool(model.get("cache_dir") or model.get("path") or model.get("name_or_path")),
            whatif_dir=report.whatif_dir,
            stage1_dir=report.stage1_dir if isinstance(report, Stage2ReportSchema) else None,
        )


def _mode(stage2: Mapping[str, Any]) -> Stage2Mode:
    """`stage2.mode`, one of `stage2.modes`."""
    name, modes = str(stage2["mode"]), stage2["modes"]
    if name not in modes:
        raise UserError(
            f"stage2.mode={name} is not a Stage 2 mode", f"Use stage2.mode={' or stage2.mode='.join(modes)}"
        )
    mode = modes[name]
    return Stage2Mode(
        name=name,
        top_kernels=int(mode["top_kernels"]),
        sections=_names(mode["sections"]),
        stages=_names(mode["stages"]),
        launches_per_kernel=int(mode["launches_per_kernel"]),
        bytes_pass=require_bool(f"stage2.modes.{name}.bytes_pass", mode.get("bytes_pass", False)),
    )


def _sampling_rate(hz: object) -> int | None:
    """`pipeline.nsys.gpu_metrics_hz`: how often nsys samples the GPU's metrics (DRAM bytes per stage), or None."""
    if hz is None:
        return None
    if isinstance(hz, bool) or not isinstance(hz, int) or not 10 <= hz <= 200_000:
        raise UserError(
            f"pipeline.nsys.gpu_metrics_hz={hz} is not a sampling rate nsys takes",
            "Set a whole number of Hz from 10 to 200000 (e.g. 100000: a sample every 10 µs), or null for none",
        )
    return hz

"""Stage 2's settings, read once by the command (:meth:`Stage2Settings.from_config`): the typed nodes `stage2`,
`pipeline.nsys` and `pipeline.ncu` (their types and defaults in `config_schema`), with the mode picked and the bytes
pass decided, beside the settings every command reads (`config_data.CommandConfig`)."""

from __future__ import annotations

import dataclasses

import attrs
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llm_perf_opt.config_data import CommandConfig, as_schema, group_node
from llm_perf_opt.config_schema import (
    NcuSchema,
    NcuWorkloadSchema,
    NsysSchema,
    Stage2ModeSchema,
    Stage2ReportSchema,
    Stage2Schema,
    Stage2WorkloadSchema,
)
from llm_perf_opt.errors import UserError
from llm_perf_opt.session.runtime import RuntimeSettings


@attrs.frozen
class Stage2Settings:
    """Everything `stage2-profile` reads from its config, checked once."""

    config_text: str  # the composed config, resolved, as config.yaml keeps it
    mode_name: str  # `stage2.mode`
    mode: Stage2ModeSchema  # `stage2.modes[stage2.mode]`
    nsys: NsysSchema
    ncu: NcuSchema  # its `bytes_pass` decided: the mode's where `pipeline.ncu.bytes_pass` is null
    workload: Stage2WorkloadSchema  # the nsys workload's passes (None: Stage 1's device default)
    ncu_workload: NcuWorkloadSchema  # the ncu workloads' single forward
    runtime: RuntimeSettings  # the workload's `runtime.*` and `run.batch_size`
    reuse_model: bool  # `stage2.reuse_model`
    own_model: bool  # the model has checkpoint weights or a `model.cache_dir` of the user's
    whatif_dir: str | None  # `report.whatif_dir`
    stage1_dir: str | None  # `report.stage1_dir`

    @classmethod
    def from_config(cls, command: CommandConfig) -> Stage2Settings:
        """From the command's settings and its composed config's `stage2`, `pipeline.nsys` and `pipeline.ncu` nodes,
        typed; a bad value is a UserError naming its key."""
        cfg, nodes = command.composed, command.nodes
        stage2 = group_node(cfg, "stage2", Stage2Schema)
        ncu = group_node(cfg, "pipeline.ncu", NcuSchema)
        mode = _mode(stage2)
        report = nodes.report
        return cls(
            config_text=OmegaConf.to_yaml(cfg, resolve=True),
            mode_name=stage2.mode,
            mode=mode,
            nsys=group_node(cfg, "pipeline.nsys", NsysSchema),
            ncu=dataclasses.replace(ncu, bytes_pass=mode.bytes_pass if ncu.bytes_pass is None else ncu.bytes_pass),
            workload=stage2.workload,
            ncu_workload=stage2.ncu_workload,
            # bad runtime.* values fail before nsys, not in its child
            runtime=RuntimeSettings.from_nodes(nodes),
            reuse_model=stage2.reuse_model,
            own_model=command.model.own_weights,
            whatif_dir=report.whatif_dir,
            stage1_dir=report.stage1_dir if isinstance(report, Stage2ReportSchema) else None,
        )


def _mode(stage2: Stage2Schema) -> Stage2ModeSchema:
    """`stage2.mode`, one of `stage2.modes`."""
    if stage2.mode not in stage2.modes:
        raise UserError(
            f"stage2.mode={stage2.mode} is not a Stage 2 mode",
            f"Use stage2.mode={' or stage2.mode='.join(stage2.modes)}",
        )
    mode = stage2.modes[stage2.mode]
    if isinstance(mode, Stage2ModeSchema):
        return mode
    try:  # a mode of one's own (`+stage2.modes.<name>={...}`), typed here
        return as_schema(Stage2ModeSchema, mode)
    except OmegaConfBaseException as exc:
        raise UserError(
            f"stage2.modes.{stage2.mode} is not a Stage 2 mode: {str(exc).splitlines()[0]}",
            "Give it some of top_kernels (a whole number), sections and stages (lists of names), launches_per_kernel "
            "and bytes_pass (true or false), e.g. +stage2.modes.mine={top_kernels: 10}",
        ) from exc

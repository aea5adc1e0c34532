"""Hydra/OmegaConf config nodes as plain Python data, and a command's settings typed once (:class:`CommandConfig`)."""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.config_compose import register_resolvers
from llm_perf_opt.config_schema import (
    AnalyticSchema,
    DatasetSchema,
    EnergySchema,
    MemorySchema,
    Stage1Nodes,
    TorchProfilerSchema,
    WhatIfNodes,
    WorkloadProfile,
    node_types,
)
from llm_perf_opt.session.model_settings import ModelSettings

Nodes = TypeVar("Nodes", Stage1Nodes, WhatIfNodes)
Group = TypeVar("Group")


def plain(cfg: Any) -> dict[str, Any]:
    """A Hydra mapping (DictConfig, resolved) or any mapping as a plain dict."""
    if isinstance(cfg, DictConfig):
        container = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(container, dict)
        return {str(k): v for k, v in container.items()}
    return dict(cfg)


def stage1_nodes(cfg: Any) -> Stage1Nodes:
    """`cfg`'s typed stage1 nodes (`config_schema.Stage1Nodes`: run, infer, outputs, runtime, report, hardware)."""
    return typed_nodes(cfg, Stage1Nodes)


def whatif_nodes(cfg: Any) -> WhatIfNodes:
    """`cfg`'s typed perf-whatif nodes (`config_schema.WhatIfNodes`: whatif, whatif_run)."""
    return typed_nodes(cfg, WhatIfNodes)


def typed_nodes(cfg: Any, kind: type[Nodes]) -> Nodes:
    """`cfg`'s typed nodes of `kind`, resolved against `cfg`; `cfg` is a composed config or a plain mapping (a saved
    config.yaml), and a node or key it lacks takes the schema's default (one place for them). A node composed onto a
    subclass of its schema (stage2-profile's `report`) keeps it. A value of the wrong type raises omegaconf's
    ValidationError (a composed config was checked before: `settings_schema`)."""
    given: dict[str, Any] = {}
    for name, schema in node_types(kind).items():
        node = cfg.get(name)
        if node is None:
            continue
        composed = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        typed = composed if isinstance(composed, type) and issubclass(composed, schema) else schema
        given[name] = OmegaConf.merge(OmegaConf.structured(typed), plain(node))
    nodes = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), given))
    assert isinstance(nodes, kind)
    return nodes


def group_node(cfg: Any, key: str, schema: type[Group]) -> Group:
    """The typed node at `key` (a config group's, e.g. `pipeline.memory` as `config_schema.MemorySchema`, or a
    command's own, `stage2`), resolved against `cfg` (a composed config or a plain mapping: a saved config.yaml); a
    node or key it lacks takes the schema's default."""
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if node is not None else None
    return as_schema(schema, node)


def as_schema(schema: type[Group], node: Any) -> Group:
    """`node` (a mapping, a config node or None) as an instance of the dataclass `schema`, its defaults where the
    node has no value; a key it lacks or a value of the wrong type raises omegaconf's error."""
    typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), plain(node) if node is not None else {}))
    assert isinstance(typed, schema)
    return typed


@attrs.frozen
class CommandConfig:
    """What `stage1-run`, `stage2-profile`, `perf-whatif` and `analytic-report` read of their composed config, typed
    and read once in cli/ (:func:`command_config`) and handed down; the pipelines read their settings here, never
    from `composed`, which they keep only to save it (config.yaml), hash it, compose from it and hand it on."""

    composed: DictConfig
    nodes: Stage1Nodes  # run, infer, outputs, runtime, report, hardware
    model: ModelSettings
    dataset: DatasetSchema
    profiler: TorchProfilerSchema  # pipeline.torch_profiler (its output settings included)
    memory: MemorySchema  # pipeline.memory
    energy: EnergySchema  # pipeline.energy
    analytic: AnalyticSchema
    device: str  # cpu | cuda | cuda:N (whether it exists is the session's check)
    workload_profile: WorkloadProfile | None  # the named workload (workload=...); None without one


def command_config(cfg: Any) -> CommandConfig:
    """`cfg` (a composed config, or a saved config.yaml loaded as one) as a :class:`CommandConfig`; a node or key it
    lacks takes the schema's default."""
    register_resolvers()  # a saved config read outside a command may still name the project's resolvers
    composed = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    return CommandConfig(
        composed=composed,
        nodes=stage1_nodes(composed),
        model=ModelSettings.from_config(plain(composed.get("model") or {})),
        dataset=group_node(composed, "dataset", DatasetSchema),
        profiler=group_node(composed, "pipeline.torch_profiler", TorchProfilerSchema),
        memory=group_node(composed, "pipeline.memory", MemorySchema),
        energy=group_node(composed, "pipeline.energy", EnergySchema),
        analytic=group_node(composed, "analytic", AnalyticSchema),
        device=str(composed.get("device") or "auto"),
        workload_profile=WorkloadProfile.from_config(composed.get("workload_profile")),
    )

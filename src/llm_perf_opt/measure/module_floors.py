"""Each module's measured kernel time beside its floor, folded by type across layers. A module's floor is the sum over
its priced ops of max(FLOPs / dense peak, bytes / peak bandwidth): the speed of light of its work on this GPU.

Each analytic op ("global/sam.layers.3.attn.rel_pos_bias") is placed on the innermost real module that runs it: the
adapter maps analytic prefixes to module paths (`ModuleTimes.analytic_roots`: "sam" -> "model.sam_model"), and the
rest of the name is matched under that root, longest match first, walking up to the parent module where an op is
not a module of its own (a residual add is the decoder layer's, `experts.gate_up_proj` is `experts`')."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import attrs

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.modules import (
    ModuleAttribution,
    ModuleFloorRow,
    ModuleTime,
    ModuleTimes,
    StageModules,
    StageModuleTimes,
)

_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dotted component made of digits
_VIEW = re.compile(r"^(global|tiles)/")


def fold(path: str) -> str:
    """`model.layers.3.mlp.experts` -> `model.layers.*.mlp.experts` (every numeric component)."""
    return _INDEX.sub("*", path)


def display_name(path: str) -> str:
    """The root module ("") shown as "(model)"."""
    return path if path else "(model)"


@attrs.frozen
class Priced:
    """One priced op of a stage, per forward of the stage."""

    name: str
    flops: float
    bytes: float


class ModuleResolver:
    """Places analytic op names on the model's module paths (see the module docstring)."""

    def __init__(self, modules: Iterable[str], roots: Mapping[str, str]) -> None:
        self._modules = frozenset(modules)
        self._roots = sorted(roots.items(), key=lambda kv: -len(kv[0]))  # longest analytic prefix first
        self.resolve = lru_cache(maxsize=None)(self._resolve)

    def _under(self, root: str) -> list[str]:
        prefix = root + "." if root else ""
        return [m for m in self._modules if m.startswith(prefix)]

    def _resolve(self, name: str) -> str | None:
        bare = _VIEW.sub("", name)
        for key, root in self._roots:
            if not key or bare == key or bare.startswith(key + "."):  # "" is the prefix of every name
                return self._within(root, bare[len(key) :].lstrip("."))
        return None

    def _within(self, root: str, rest: str) -> str | None:
        parts = rest.split(".") if rest else []
        under = None
        for k in range(len(parts), 0, -1):
            tail = ".".join(parts[:k])
            direct = f"{root}.{tail}" if root else tail
            if direct in self._modules:
                return direct
            under = under if under is not None else self._under(root)
            matches = [m for m in under if m.endswith("." + tail)]
            if len(matches) == 1:
                return matches[0]
        return root if root in self._modules else None


def priced_ops(stage: str, costs: Mapping[str, Any], decode_steps: int) -> list[Priced] | None:
    """The analytic ops of one innermost stage, per forward: a vision sub-stage's own; prefill's without its vision
    modules (their kernels are the vision sub-stages'); a decode step's as the mean step of the measured decode."""
    if stage == vocab.DECODE_STEP:
        cost, divisor = costs.get(vocab.DECODE), max(decode_steps, 1)
    else:
        cost, divisor = costs.get(stage), 1
    if cost is None:
        return None
    ops = [m for m in cost.modules if not (stage == vocab.PREFILL and "/" in m.name)]
    return [Priced(m.name, m.flops / divisor, m.bytes / divisor) for m in ops]


def floor_ms(op: Priced, peak_flops: float | None, bandwidth: float | None) -> float | None:
    """max(FLOPs / peak, bytes / bandwidth) in ms; None without both peaks."""
    if not peak_flops or not bandwidth:
        return None
    return max(op.flops / peak_flops, op.bytes / bandwidth) * 1e3


@attrs.define
class _Group:
    paths: set[str] = attrs.Factory(set)
    types: set[str] = attrs.Factory(set)
    calls: int = 0
    kernels: int = 0
    ms: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    floor: float = 0.0
    priced: bool = False
    top: dict[str, float] = attrs.Factory(dict)

    def add_time(self, row: ModuleTime, module_type: str) -> None:
        self.paths.add(row.module)
        self.types.add(module_type)
        self.calls += row.calls
        self.kernels += row.kernels
        self.ms += row.ms
        for k in row.top:
            label = f"{k.kernel} ({k.operator})" if k.operator and k.operator != k.kernel else k.kernel
            self.top[label] = self.top.get(label, 0.0) + k.ms

    def add_price(self, op: Priced, floor: float | None) -> None:
        self.priced = True
        self.flops += op.flops
        self.bytes += op.bytes
        self.floor += floor or 0.0


def _rows(
    table: StageModuleTimes,
    ops: Sequence[Priced] | None,
    resolver: ModuleResolver,
    types: Mapping[str, str],
    peaks: tuple[float | None, float | None],
) -> tuple[list[ModuleFloorRow], float | None]:
    per = max(table.forwards, 1)
    groups: dict[str, _Group] = {}
    for row in table.rows:
        groups.setdefault(fold(row.module), _Group()).add_time(row, types.get(row.module, "?"))
    stage_floor = 0.0 if ops is not None and peaks[0] and peaks[1] else None
    for op in ops or ():
        floor = floor_ms(op, *peaks)
        if stage_floor is not None and floor is not None:
            stage_floor += floor
        path = resolver.resolve(op.name)
        if path is not None:
            group = groups.setdefault(fold(path), _Group())
            group.types.add(types.get(path, "?"))
            group.add_price(op, floor)
    total = table.total_ms / per
    rows = [
        ModuleFloorRow(
            module=display_name(name),
            module_type=next(iter(g.types)) if len(g.types) == 1 else "mixed",
            members=len(g.paths),
            calls=g.calls // per,
            kernels=round(g.kernels / per),
            ms=g.ms / per,
            share=(g.ms / per) / total if total > 0 else 0.0,
            flops=g.flops if g.priced else None,
            bytes=g.bytes if g.priced else None,
            floor_ms=g.floor if g.priced and stage_floor is not None else None,
            top_kernel=max(g.top, key=g.top.__getitem__) if g.top else None,
        )
        for name, g in groups.items()
    ]
    rows.sort(key=lambda r: -(r.above_floor_ms if r.above_floor_ms is not None else r.ms))
    return rows, stage_floor


def module_attribution(
    times: ModuleTimes,
    costs: Mapping[str, Any] | None,
    *,
    decode_steps: int,
    peak_flops: float | None,
    bandwidth: float | None,
    peaks_note: str | None,
) -> ModuleAttribution:
    """`times` beside the analytic floors of `costs` (the profiled input's stage costs; None without an analytic
    model): per stage, per forward, folded across layers, sorted by time above the floor."""
    resolver = ModuleResolver(times.module_types, times.analytic_roots)
    stages = []
    for table in times.stages:
        ops = priced_ops(table.stage, costs, decode_steps) if costs else None
        rows, stage_floor = _rows(table, ops, resolver, times.module_types, (peak_flops, bandwidth))
        per = max(table.forwards, 1)
        stages.append(
            StageModules(
                stage=table.stage,
                forwards=table.forwards,
                total_ms=table.total_ms / per,
                floor_ms=stage_floor,
                rows=tuple(rows),
                unattributed_ms=table.unattributed_ms / per,
                unattributed_reason=table.unattributed_reason,
                methods=table.methods,
            )
        )
    floors = peaks_note if costs and peak_flops and bandwidth else None
    return ModuleAttribution(
        time_kind=times.time_kind, stages=tuple(stages), floors=floors, method_notes=times.method_notes
    )

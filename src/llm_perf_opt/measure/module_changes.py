"""Which modules a change moved: two runs' module attribution (a baseline and a what-if rung) compared per stage, on
the folded rows of `ModuleAttribution`; a module on one side only counts 0 ms on the other. The listed moves and
the rest add up to the stage's change exactly, so a waterfall from the baseline's total to the rung's closes."""

from __future__ import annotations

import attrs

from llm_perf_opt.records.modules import ModuleAttribution, ModuleChange, StageModuleChanges, StageModules

TOP_MOVES = 8  # modules listed per stage; the rest summed
HELD_ROWS = 5  # modules kept per stage in `held_by`


def _times(stage: StageModules) -> dict[str, float]:
    return {row.module: row.ms for row in stage.rows}


def stage_changes(base: StageModules, other: StageModules, top: int = TOP_MOVES) -> StageModuleChanges:
    """One stage's change by module, the `top` largest moves first."""
    before, after = _times(base), _times(other)
    moves = [
        ModuleChange(
            module=m,
            base_ms=before.get(m, 0.0),
            other_ms=after.get(m, 0.0),
            delta_ms=after.get(m, 0.0) - before.get(m, 0.0),
        )
        for m in dict.fromkeys([*before, *after])
    ]
    moves.sort(key=lambda c: -abs(c.delta_ms))
    listed = tuple(moves[:top])
    total = other.total_ms - base.total_ms
    return StageModuleChanges(
        stage=base.stage,
        base_ms=base.total_ms,
        other_ms=other.total_ms,
        changes=listed,
        rest_delta_ms=total - sum(c.delta_ms for c in listed),
    )


def module_changes(
    base: ModuleAttribution, other: ModuleAttribution, top: int = TOP_MOVES
) -> tuple[StageModuleChanges, ...]:
    """Per stage both runs attributed, the change by module (stages in the baseline's order)."""
    others = {s.stage: s for s in other.stages}
    return tuple(stage_changes(s, others[s.stage], top) for s in base.stages if s.stage in others)


def held_by(attribution: ModuleAttribution | None, rows: int = HELD_ROWS) -> ModuleAttribution | None:
    """What holds a run, stage by stage: each stage's `rows` modules furthest above their floor, every stage total,
    floor and unattributed time kept; None without module attribution."""
    if attribution is None or not attribution.stages:
        return None
    stages = tuple(attrs.evolve(s, rows=s.rows[:rows]) for s in attribution.stages)
    return attrs.evolve(attribution, stages=stages, method_notes=())

"""Module attribution figures of stage1-run folders: per stage, the share of kernel time given to a module, the
module sums against the stage total, the floor, and the profiled pass's post-processing time.

    python bench/module_attribution.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from llm_perf_opt.records.folders import load_stage1


def summary(run: Path) -> list[str]:
    folder = load_stage1(run)
    m, ops = folder.metrics, folder.operators
    lines = [f"{run}: {m.settings.runtime.label}"]
    if m.modules is None or ops is None or ops.modules is None:
        return [*lines, "  no module attribution"]
    lines.append(f"  profiled-pass post-processing: {ops.postprocess_s:.2f} s")
    for raw, stage in zip(ops.modules.stages, m.modules.stages, strict=True):
        summed = sum(r.ms for r in raw.rows) + raw.unattributed_ms
        floor = f", floor {stage.floor_ms:.3f} ms" if stage.floor_ms else ""
        lines.append(
            f"  {stage.stage}: {stage.total_ms:.3f} ms/forward{floor}, attributed {stage.attributed_share:.2%} "
            f"({', '.join(stage.methods)}), module sum / total = {summed / raw.total_ms:.4f}"
            if raw.total_ms
            else f"  {stage.stage}: no kernel time"
        )
        for row in stage.rows[:4]:
            ratio = f"{row.ratio:.1f}x floor" if row.ratio else "no floor"
            lines.append(f"      {row.module}: {row.ms:.3f} ms ({row.share:.1%}), {ratio}, {row.top_kernel}")
    return lines


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("\n".join(summary(Path(arg))))

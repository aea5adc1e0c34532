"""Per-stage roofline over all timed passes, FLOPs counted on the real modules (as for MFU) and bytes the analytic
model's bytes moved (weights read, activations, KV cache: `analytic.model.StageCost.bytes`):
- MFU = FLOPs / (time x dense peak FLOP/s); MBU = bytes / (time x peak bandwidth) (`measure.mfu.utilization`);
- arithmetic intensity = FLOPs / bytes against the ridge point = peak FLOP/s / peak B/s: above it compute-bound;
- speed of light = max(FLOPs / peak FLOP/s, bytes / peak B/s), and the gap = measured time / speed of light."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from llm_perf_opt.measure.mfu import TimedPass, stage_time_ms, utilization
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.stage1 import StageEfficiency


class HasBytes(Protocol):
    @property
    def bytes(self) -> float: ...


def speed_of_light(flops: float, moved: float, flops_per_s: float, bytes_per_s: float) -> tuple[float, str]:
    """The lower-bound time (s) of `flops` FLOPs and `moved` bytes on a device with these peaks, and the roof that
    sets it ("compute" when the FLOP term is the larger or equal); also the analytic what-ifs' (`analytic.pricing`)."""
    compute_s = flops / flops_per_s
    memory_s = moved / bytes_per_s
    return max(compute_s, memory_s), "compute" if compute_s >= memory_s else "memory"


def efficiency_by_stage(
    records: Sequence[TimedPass],
    flops_by_image: Mapping[str, Mapping[str, float]],
    bytes_by_image: Mapping[str, Mapping[str, HasBytes]],
    stage_names: Sequence[str],
    compute: PeakFigure | None,
    bandwidth: PeakFigure | None,
    flops_source: str,
) -> tuple[StageEfficiency, ...]:
    """One StageEfficiency per stage with FLOPs, bytes (both keyed by `cost_key`) and a measured time."""
    out = []
    ridge = compute.value / bandwidth.value if compute and bandwidth else None
    for stage in stage_names:
        flops = moved = time_ms = 0.0
        for rec in records:
            stage_flops = flops_by_image.get(rec.cost_key, {}).get(stage)
            cost = bytes_by_image.get(rec.cost_key, {}).get(stage)
            if stage_flops is None or cost is None:
                continue
            flops += stage_flops
            moved += cost.bytes
            time_ms += stage_time_ms(rec, stage)
        if time_ms <= 0 or moved <= 0:
            continue
        seconds = time_ms / 1e3
        _, mfu = utilization(flops, seconds, compute)
        _, mbu = utilization(moved, seconds, bandwidth)
        intensity = flops / moved
        sol_s = speed_of_light(flops, moved, compute.value, bandwidth.value)[0] if compute and bandwidth else None
        out.append(
            StageEfficiency(
                stage=stage,
                time_ms=time_ms,
                flops=flops,
                bytes=moved,
                arithmetic_intensity=intensity,
                ridge_point=ridge,
                bound=None if ridge is None else ("compute" if intensity >= ridge else "memory"),
                mfu=mfu,
                mbu=mbu,
                speed_of_light_ms=None if sol_s is None else sol_s * 1e3,
                gap=None if not sol_s else seconds / sol_s,
                flops_source=flops_source,
            )
        )
    return tuple(out)

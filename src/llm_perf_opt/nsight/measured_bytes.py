"""Measured DRAM bytes of one stage instance (Nsight Compute's bytes pass) against the analytic bytes for it.

Per stage instance (a prefill with its vision sub-stages, one decode step):

- measured bytes: `dram__bytes_read.sum + dram__bytes_write.sum` over every kernel of the instance;
- analytic bytes and counted FLOPs: Stage 1's figures of the same workload, per instance (prefill and vision
  sub-stages per timed pass, decode per step: the mean over the steps of a pass, which is its middle step's
  figure as the KV cache grows linearly); for a DeepSeek-OCR model the bytes are priced again by the current
  analytic model on the inputs the workload ran (:func:`repriced_bytes`), so a report rebuilt after a correction
  of the model shows it;
- FLOP/byte and the bound against the ridge point, for both; MBU over the summed kernel durations ncu measured,
  for both (so they differ exactly as the bytes do);
- where measured and analytic disagree by more than `AGREEMENT`, the cause the data show (:func:`gap_reason`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from llm_perf_opt.analytic.model import stage_costs
from llm_perf_opt.analytic.settings import PricedModel
from llm_perf_opt.analytic.spec import ModelSpec
from llm_perf_opt.analytic.workload import RunWorkload, run_workloads
from llm_perf_opt.kernel_names import kernel_label
from llm_perf_opt.measure.mfu import utilization
from llm_perf_opt.nsight.ncu_bytes import LaunchBytes
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.stage2 import MeasuredBytesRow, NcuBytesPass, RangeBytes

AGREEMENT = 0.10  # |measured / analytic - 1| within this: the two agree and no cause is named
MIB = 2.0**20

# Kinds of kernel whose DRAM traffic the analytic model prices loosely (as part of a fused module, or as layout
# copies), found by a word of their label (function name and functor: a CUTLASS GEMM's template arguments name
# copy atoms, so the full name would call it a copy), first match wins: (word, what they are).
_EXTRA_TRAFFIC = (
    ("softmax", "softmax kernels (the attention score matrix, materialised)"),
    ("copy", "copy kernels (layout changes, dtype casts, concatenation)"),
    ("elementwise", "unfused elementwise kernels"),
)
_SHOWN_SHARE = 0.05  # kinds under this share of the measured bytes are left out of the reason


@attrs.frozen
class InstanceCost:
    """Analytic bytes and counted FLOPs of one stage instance."""

    flops: float
    bytes: float


def instance_costs(workload: Stage1Metrics, stage_bytes: Mapping[str, float] | None = None) -> dict[str, InstanceCost]:
    """Stage name -> its cost per instance: prefill and vision sub-stages per timed forward (a batch's when the run
    batched: its vision sub-stages then hold every input's), `decode/step` per step (from Stage 1's `decode` row).
    Bytes are the efficiency rows' unless `stage_bytes` (per row stage, over the timed forwards) replaces them.
    Empty without timed forwards or analytic bytes."""
    passes, steps = len(workload.forwards), sum(len(f.decode_step_ms) for f in workload.forwards)
    moved = stage_bytes or {}
    out: dict[str, InstanceCost] = {}
    for row in workload.efficiency:
        decode = row.stage == vocab.DECODE
        count = steps if decode else passes
        if count:
            total = moved.get(row.stage, row.bytes)
            out[vocab.DECODE_STEP if decode else row.stage] = InstanceCost(row.flops / count, total / count)
    return out


#: The Stage 1 model adapters whose stages the analytic model prices from the run's config (`model.adapter`).
REPRICED_ADAPTERS = frozenset({"deepseek_ocr", "deepseek_ocr2"})


@attrs.frozen
class WorkloadModel:
    """A profiled workload's model as its folder's `config.yaml` describes it, read by the pipeline: the model the
    analytic model prices again, or why the config could not be read (`problem`)."""

    model: PricedModel | None = None
    problem: str | None = None


def reprices(workload: Stage1Metrics) -> bool:
    """Whether a run's analytic bytes can be priced again: it has timed passes and analytic bytes, and did not batch
    (a batch's bytes are priced for the batch, its weights read once: Stage 1's own figures stand)."""
    return bool(instance_costs(workload)) and not workload.batches


def repriced_bytes(workload: Stage1Metrics, model: PricedModel) -> dict[str, float]:
    """Analytic bytes per stage of Stage 1's efficiency rows, summed over the timed passes, priced again by the
    current analytic model on the inputs the run measured (the run's `model`: its architecture and mode; each timed
    pass's image with its tiles, crop grid, prompt and new tokens; the run's dtype). Raises ValueError where the
    analytic model and the run disagree on an input's views."""
    spec = ModelSpec.from_architecture(model.architecture)
    inputs = run_workloads(model, spec, RunWorkload.from_records(workload.records, workload.model.dtype))
    per_image = {image: stage_costs(spec, priced) for image, priced in inputs}
    return {
        row.stage: sum(per_image[r.image][row.stage].bytes for r in workload.records if row.stage in per_image[r.image])
        for row in workload.efficiency
    }


def _bound(intensity: float | None, ridge: float | None) -> str | None:
    """The roof a stage sits under: "compute" at or above the ridge point, else "memory" (Stage 1's rule)."""
    if intensity is None or ridge is None:
        return None
    return "compute" if intensity >= ridge else "memory"


def _extra_traffic(launches: Sequence[LaunchBytes], measured: float) -> list[str]:
    """'<share> in <kind>' for the kinds of kernel that move at least _SHOWN_SHARE of `measured` bytes."""
    moved = dict.fromkeys((word for word, _ in _EXTRA_TRAFFIC), 0.0)
    for launch in launches:
        name = kernel_label(launch.name, launch.full_name).lower()
        word = next((w for w, _ in _EXTRA_TRAFFIC if w in name), None)
        if word is not None:
            moved[word] += launch.dram_read_bytes + launch.dram_write_bytes
    return [
        f"{moved[word] / measured:.0%} in {what}"
        for word, what in _EXTRA_TRAFFIC
        if measured > 0 and moved[word] / measured >= _SHOWN_SHARE
    ]


def gap_reason(
    stage: str, measured: float, analytic: float | None, launches: Sequence[LaunchBytes], l2_cache_bytes: int | None
) -> str | None:
    """Why the `measured` DRAM bytes of an instance of `stage` differ from the `analytic` ones, from what the
    measurement shows; None where they agree within AGREEMENT or nothing is known."""
    if not analytic:
        return None
    ratio = measured / analytic
    if abs(ratio - 1) <= AGREEMENT:
        return None
    l2 = f"the {l2_cache_bytes / MIB:,.0f} MiB L2" if l2_cache_bytes else "L2"
    if ratio < 1:
        if l2_cache_bytes and analytic <= l2_cache_bytes:
            left = (
                "the weights and KV cache the previous step read are still there"
                if stage == vocab.DECODE_STEP
                else "what earlier kernels left there is read from L2"
            )
            return (
                f"DRAM counters see only L2 misses, and the instance's analytic traffic ({analytic / MIB:,.1f} MiB) "
                f"fits in {l2}: {left}"
            )
        return (
            f"DRAM counters see only L2 misses: tensors one kernel writes and the next reads while they are still in "
            f"{l2} never reach DRAM, while the analytic model counts every module's inputs and outputs"
        )
    kinds = _extra_traffic(launches, measured)
    where = f": of the measured bytes, {'; '.join(kinds)}" if kinds else ""
    return (
        "traffic the analytic model does not count (it prices each module's inputs and outputs once, attention "
        f"without its score matrix){where}; the largest consumers are listed below"
    )


def measured_rows(
    bytes_pass: NcuBytesPass,
    sums: dict[str, RangeBytes],
    launches: Sequence[LaunchBytes],
    costs: dict[str, InstanceCost],
    analytic_source: str | None,
    *,
    bandwidth: PeakFigure | None,
    ridge: float | None,
    l2_cache_bytes: int | None,
) -> list[MeasuredBytesRow]:
    """One row per stage the pass measured: its own stage (a decode pass: the decode step) and the ranges nested in
    it (a prefill pass: the vision sub-stages), in the order they first ran."""
    names = [n for n in sums if not (bytes_pass.stage == vocab.DECODE and n == vocab.DECODE)]
    rows = []
    for name in names:
        got, cost = sums[name], costs.get(name)
        measured, seconds = got.dram_bytes, got.duration_s
        analytic, flops = (cost.bytes, cost.flops) if cost else (None, None)
        measured_mbu = analytic_mbu = None
        if bandwidth is not None and seconds > 0:
            _, measured_mbu = utilization(measured, seconds, bandwidth)
            if analytic is not None:
                _, analytic_mbu = utilization(analytic, seconds, bandwidth)
        measured_intensity = flops / measured if flops is not None and measured > 0 else None
        analytic_intensity = flops / analytic if flops is not None and analytic else None
        rows.append(
            MeasuredBytesRow(
                stage=name,
                instance=bytes_pass.instance,
                kernels=got.kernels,
                kernel_ms=seconds * 1e3,
                dram_read_bytes=got.dram_read_bytes,
                dram_write_bytes=got.dram_write_bytes,
                measured_bytes=measured,
                analytic_bytes=analytic,
                ratio=measured / analytic if analytic else None,
                flops=flops,
                measured_intensity=measured_intensity,
                analytic_intensity=analytic_intensity,
                measured_bound=_bound(measured_intensity, ridge),
                analytic_bound=_bound(analytic_intensity, ridge),
                measured_mbu=measured_mbu,
                analytic_mbu=analytic_mbu,
                top_kernels=got.top_kernels,
                analytic_source=analytic_source if cost else None,
                why=gap_reason(name, measured, analytic, [x for x in launches if name in x.ranges], l2_cache_bytes),
            )
        )
    return rows


def window_warnings(bytes_pass: NcuBytesPass, launches: Sequence[LaunchBytes]) -> list[str]:
    """What says the pass's launch window did not cover exactly its instance."""
    out = []
    n = len(launches)
    what = f"The bytes pass over {bytes_pass.instance}"
    if not bytes_pass.profiler_window and bytes_pass.stage != vocab.DECODE and n >= bytes_pass.launch_count:
        out.append(f"{what} filled its window of {n} launches: the instance may have more kernels than it measured.")
    elif n < bytes_pass.expected_kernels:
        out.append(
            f"{what} profiled {n} kernels where nsys counted {bytes_pass.expected_kernels}: its figures miss some."
        )
    if bytes_pass.stage == vocab.DECODE:
        outside = sum(1 for x in launches if vocab.DECODE_STEP not in x.ranges)
        if outside:
            out.append(f"{what}: {outside} of its {n} kernels ran outside a decode step.")
    return out

"""Pages per second as a workload: throughput, per-page latency and the time per page beside its floor.

A forward (one input, or one batch pass) finishes `size` inputs in its end-to-end time (first byte of preprocessing
to last token): pages/s is `records.stage1.pages_rate` of each forward, as in the what-if's pages/s objective and
`BatchRecord.pages_per_s`. One value per timed forward (the inputs of one batch pass share its times)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import attrs

from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import (
    PAGE_DECODE,
    PAGE_LM_PREFILL,
    PAGE_PREPROCESS,
    PAGE_VISION,
    BatchRecord,
    ImageRecord,
    PagePart,
    PageThroughput,
    Stage1Metrics,
    StageEfficiency,
    Throughput,
    pages_rate,
)

Forward = ImageRecord | BatchRecord


def run_batch(forwards: Sequence[Forward]) -> tuple[int, list[Forward]]:
    """The batch a run's figures are for (the most common forward size) and the timed forwards of that size."""
    sizes = [f.size for f in forwards]
    size = max(sizes, key=sizes.count) if sizes else 1
    return size, [f for f in forwards if f.size == size]


def pages_per_s_values(forwards: Sequence[Forward]) -> list[float]:
    """Pages/s of each timed forward at the run's batch (`run_batch`): the one series behind
    `PageThroughput.pages_per_s` and the what-if's pages/s objective."""
    size, full = run_batch(forwards)
    return [pages_rate(size, f.e2e_ms) for f in full]


def _new_tokens_per_s(forward: Forward) -> float:
    """Every input's new tokens over the forward's end-to-end time."""
    return forward.new_tokens * forward.size / forward.e2e_ms * 1e3


def throughput(forwards: Sequence[Forward]) -> Throughput:
    """Median-based throughput over the timed forwards (`Stage1Metrics.forwards`)."""
    decode = [len(f.decode_step_ms) / (f.decode_ms / 1e3) for f in forwards if f.decode_step_ms and f.decode_ms > 0]
    return Throughput(
        decode_tokens_per_s=statistics.median(decode) if decode else 0.0,
        e2e_images_per_s=statistics.median(pages_rate(f.size, f.e2e_ms) for f in forwards),
        e2e_tokens_per_s=statistics.median(_new_tokens_per_s(f) for f in forwards),
    )


def _part_times(forward: Forward, floor_share: Mapping[str, float]) -> dict[str, tuple[float, float | None]]:
    """(time, floor) in ms of each part of one forward, the whole forward's (not yet per page)."""
    vision_ms = sum(forward.vision_ms.values())
    priced = [stage for stage in forward.vision_ms if stage in floor_share]
    vision_floor = (
        sum(forward.vision_ms[stage] * floor_share[stage] for stage in priced)
        if len(priced) == len(forward.vision_ms)
        else None
    )
    prefill_share = floor_share.get(vocab.PREFILL)
    prefill_floor = None if prefill_share is None else forward.prefill_ms * prefill_share
    # The prefill's floor is priced over the whole prefill (vision included); the language model's is what is left.
    lm_floor = None
    if prefill_floor is not None and vision_floor is not None and prefill_floor >= vision_floor:
        lm_floor = prefill_floor - vision_floor
    decode_share = floor_share.get(vocab.DECODE)
    return {
        PAGE_PREPROCESS: (forward.preprocess_ms, None),
        PAGE_VISION: (vision_ms, vision_floor),
        PAGE_LM_PREFILL: (max(forward.prefill_ms - vision_ms, 0.0), lm_floor),
        PAGE_DECODE: (forward.decode_ms, None if decode_share is None else forward.decode_ms * decode_share),
    }


def _median_or_none(values: list[float | None]) -> float | None:
    return None if not values or None in values else statistics.median(v for v in values if v is not None)


def part_values(metrics: Stage1Metrics, parts: Sequence[str]) -> list[float]:
    """The time per page of `parts` (PAGE_* names) summed, one value per timed forward at the run's batch: the
    series behind those parts of `PageThroughput.parts`, whose p50 each part's `ms_per_page` is."""
    size, full = run_batch(metrics.forwards)
    return [sum(times[part][0] for part in parts) / size for times in (_part_times(f, {}) for f in full)]


def run_pages(metrics: Stage1Metrics) -> PageThroughput | None:
    """A run's pages figure: its record's, or for a folder written before 1.4, worked out from its timed forwards."""
    return metrics.pages or page_throughput(metrics.forwards, metrics.efficiency)


def page_throughput(forwards: Sequence[Forward], efficiency: Sequence[StageEfficiency]) -> PageThroughput | None:
    """Pages/s, tokens/s, per-page latency and the time per page of the timed forwards; None without any."""
    if not forwards:
        return None
    size, full = run_batch(forwards)
    # per priced stage, its speed of light over its measured time (both summed over the same timed forwards)
    share = {e.stage: sol / e.time_ms for e in efficiency if (sol := e.speed_of_light_ms) is not None and e.time_ms > 0}
    per_forward = [_part_times(f, share) for f in full]
    has_vision = any(f.vision_ms for f in full)
    parts = tuple(
        PagePart(
            part=name,
            ms_per_page=statistics.median(times[name][0] / size for times in per_forward),
            floor_ms_per_page=_median_or_none(
                [None if (floor := times[name][1]) is None else floor / size for times in per_forward]
            ),
        )
        for name in (PAGE_PREPROCESS, PAGE_VISION, PAGE_LM_PREFILL, PAGE_DECODE)
        if name != PAGE_VISION or has_vision
    )
    return PageThroughput(
        batch_size=size,
        pages_per_s=summarize(pages_per_s_values(full), "pages/s"),
        tokens_per_s=summarize([_new_tokens_per_s(f) for f in full], "tokens/s"),
        ttft_ms=summarize([f.ttft_ms for f in full], "ms"),
        ttlt_ms=summarize([f.e2e_ms for f in full], "ms"),
        parts=parts,
        prefetched=sum(f.prefetched for f in full),
    )


# ---- host work around the timed passes ---------------------------------------------------------------------------

CROWDED_SHARE = 0.10  # host work outside a pass's timed stages above this share of the pass: said
CROWDED_CORES = 8.0  # the process's CPU per pass over its wall time above this: its threads may crowd the host


@attrs.frozen
class HostAround:
    """What each timed pass cost the host beyond its timed stages (p50 over the passes): the wall-clock window of its
    call (`Stage1Metrics.timed_windows`) less its end-to-end time (CUDA events), and the cores the process kept busy
    (its CPU time per pass over the pass's wall time; None: not recorded). The report's pages/s stays the per-pass
    p50 (`Throughput`); the rate over the passes' span is data parallel's (`measure.data_parallel`)."""

    outside_ms: float
    pass_ms: float
    cores_busy: float | None

    @property
    def share(self) -> float:
        return self.outside_ms / (self.outside_ms + self.pass_ms) if self.pass_ms > 0 else 0.0

    @property
    def crowded(self) -> bool:
        """The host work is notable and the process kept many cores busy: its threads may crowd each other."""
        return self.share > CROWDED_SHARE and self.cores_busy is not None and self.cores_busy > CROWDED_CORES


def host_around(m: Stage1Metrics) -> HostAround | None:
    """The host work around a run's timed passes; None where the run recorded no wall-clock window per pass (an
    older folder) or they do not pair one to one with its timed forwards."""
    windows, forwards = m.timed_windows, tuple[Forward, ...](m.forwards)
    if not windows or len(windows) != len(forwards):
        return None
    if any(w.inputs != f.size for w, f in zip(windows, forwards, strict=True)):
        return None
    outside = [max((w.ended_s - w.started_s) * 1e3 - f.e2e_ms, 0.0) for w, f in zip(windows, forwards, strict=True)]
    u = m.host_usage
    cores = (u.user_cpu_s + u.system_cpu_s) / u.wall_s if u is not None and u.passes and u.wall_s > 0 else None
    return HostAround(statistics.median(outside), statistics.median(f.e2e_ms for f in forwards), cores)

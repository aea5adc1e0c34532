"""The memory and energy passes on the CPU: breakdown and fit arithmetic, the recorder's peaks, the NVML guards,
the records' round trip, the report sections, and a CPU stage1-run saying why neither was measured."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.config_schema import EnergySchema
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.instruments import energy as energy_mod
from llm_perf_opt.instruments.energy import (
    EnergyMeter,
    EnergyUnavailable,
    NvmlCounter,
    idle_window,
    load_nvml,
    window,
)
from llm_perf_opt.instruments.measured_session import DecodeNotRepeatable
from llm_perf_opt.instruments.memory import CacheWatch, MemoryRecorder, graph_pools, snapshot_bytes
from llm_perf_opt.measure.energy_figures import energy_report
from llm_perf_opt.measure.memory_figures import breakdown, fit_prediction, kv_bytes_per_token
from llm_perf_opt.measure.stage1_analysis import Stage1Analysis
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.io import converter, to_plain
from llm_perf_opt.records.memory import (
    IDLE_SLEEP,
    EnergyPass,
    EnergyReport,
    EnergyWindow,
    MemoryPass,
    MemoryReport,
    MemorySample,
    StagePeak,
)
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.report.markdown import Doc
from llm_perf_opt.report.memory_energy import energy_section, fit_lines, memory_section, vision_peak_caveat
from llm_perf_opt.report.plots import memory_timeline
from llm_perf_opt.session.session import InferenceSession

FIXTURE = Path(__file__).parent / "fixtures" / "metrics" / "cpu_tiny_stage1.json"
MIB = 2**20


# ---- memory arithmetic --------------------------------------------------------------------------------------------
def test_the_breakdown_sums_to_the_peak() -> None:
    peak = StagePeak(vocab.PREFILL, 1, 900 * MIB, 1000 * MIB, 50 * MIB)
    b = breakdown(peak, weights=600 * MIB, resident_other=30 * MIB, preexisting_kv=0)
    assert b.parts_sum == b.peak_allocated_bytes == 900 * MIB
    assert (b.kv_cache_bytes, b.activations_bytes, b.allocator_slack_bytes) == (50 * MIB, 220 * MIB, 100 * MIB)
    reused = breakdown(attrs.evolve(peak, kv_bytes=0), weights=600 * MIB, resident_other=0, preexisting_kv=80 * MIB)
    assert reused.kv_cache_bytes == 80 * MIB and reused.parts_sum == 900 * MIB  # a reused static cache is resident


def test_fit_prediction_arithmetic() -> None:
    peak = breakdown(StagePeak(vocab.E2E, 1, 10_000, 10_400, 1_000), 6_000, 500, 0)  # activations 2 500
    fit = fit_prediction(total=40_000, outside=1_100, peak=peak, batch=2, kv_per_token=10.0)
    assert fit.fixed_bytes == 1_100 + 6_000 + 500 + 400
    assert fit.per_page_bytes == (2_500 + 1_000) / 2
    assert fit.max_batch == (40_000 - 8_000) // 1_750  # 18
    assert fit.kv_bytes_per_token == 20.0
    assert fit.max_context_tokens == (40_000 - 8_000 - 2_500) // 20  # 1 475
    none = fit_prediction(40_000, 0, breakdown(StagePeak(vocab.E2E, 1, 6_000, 6_000, 0), 6_000, 0, 0), 1, None)
    assert none.max_batch is None and none.max_context_tokens is None


@attrs.define
class FakeAllocator:
    """Allocated and reserved now, and the peaks since the last reset."""

    allocated: int = 100
    reserved: int = 200
    peak: int = 100
    peak_reserved: int = 200

    def set(self, allocated: int, peak: int | None = None) -> None:
        self.allocated = allocated
        self.peak = max(self.peak, peak or allocated)
        self.reserved = max(self.reserved, self.peak + 50)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def read(self) -> tuple[int, int, int, int]:
        return self.allocated, self.reserved, self.peak, self.peak_reserved

    def reset(self) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved


def test_the_recorder_folds_each_peak_into_every_open_stage() -> None:
    alloc = FakeAllocator()
    kv = {"bytes": 0}
    rec = MemoryRecorder(torch.device("cpu"), alloc, lambda: kv["bytes"])
    rec.begin(vocab.E2E)
    rec.begin(vocab.PREFILL)
    alloc.set(150, peak=400)  # a transient inside prefill
    kv["bytes"] = 20
    rec.end(vocab.PREFILL)
    rec.begin(vocab.DECODE)
    for _ in range(2):
        rec.begin(vocab.DECODE_STEP)
        alloc.set(alloc.allocated + 10, peak=alloc.allocated + 60)
        kv["bytes"] += 5
        rec.end(vocab.DECODE_STEP)
    rec.end(vocab.DECODE)
    rec.end(vocab.E2E)
    peaks = {p.stage: p for p in rec.peaks()}
    assert peaks[vocab.PREFILL].peak_allocated_bytes == 400 and peaks[vocab.PREFILL].kv_bytes == 20
    assert peaks[vocab.E2E].peak_allocated_bytes == 400  # the nested peak reached the enclosing stage
    assert peaks[vocab.DECODE_STEP].spans == 2 and peaks[vocab.DECODE_STEP].peak_allocated_bytes == 220
    assert peaks[vocab.DECODE].kv_bytes == 30
    assert len(rec.samples) == 10 and [s.event for s in rec.samples[:2]] == ["begin", "begin"]


def test_kv_per_token_from_the_config_matches_the_cache_of_a_real_pass() -> None:
    cfg = compose_config("stage1", "model=deepseek_ocr2_tiny", "device=cpu")
    session = InferenceSession.load(cfg.model, torch.device("cpu"))
    prepared = session.prepare(bundled_samples_dir() / "slide_square.png")
    watch = CacheWatch()
    with session.observe_cache(watch):
        session.generate(prepared, 3, MemoryRecorder(torch.device("cpu"), FakeAllocator(), watch.bytes))
    per_token = kv_bytes_per_token(session.adapter.decoder_config(session.model), session.dtype.itemsize)
    assert watch.preexisting == 0 and per_token
    assert watch.bytes() == per_token * (prepared.prompt_tokens + 3 - 1)  # the last token is never fed back


def test_graph_pools_and_snapshot_limit() -> None:
    snapshot = {
        "segments": [
            {"segment_pool_id": (0, 0), "total_size": 100, "allocated_size": 50},
            {"segment_pool_id": (1, 3), "total_size": 40, "allocated_size": 30, "is_expandable": False},
        ]
    }
    pools, _ = graph_pools(snapshot)
    assert pools is not None and (pools.segments, pools.reserved_bytes, pools.allocated_bytes) == (1, 40, 30)
    assert graph_pools({"segments": [{"total_size": 1}]})[0] is None
    data, note = snapshot_bytes(snapshot, 1.0)
    assert data is not None and "memory_viz" in note
    assert snapshot_bytes({"x": b"0" * (2 * MIB)}, 1.0)[0] is None
    assert "snapshot_max_mib=0" in snapshot_bytes(snapshot, 0)[1]


# ---- energy guards ------------------------------------------------------------------------------------------------
class FakeCounter:
    """Readings in turn, the last one repeating (a counter that stopped moving); a read costs 4 ms of `clock`."""

    def __init__(self, readings: list[int], clock: FakeClock) -> None:
        self.readings, self.clock = list(readings), clock

    def read_mj(self) -> int:
        self.clock.now += 0.004
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self.step

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TickingCounter:
    """NVML's counter as it behaves: energy at `watts(t)` integrated, published every `period` s; a read costs
    `read_s` of the clock."""

    def __init__(self, clock: FakeClock, watts: Callable[[float], float], period: float = 0.1) -> None:
        self.clock, self.watts, self.period, self.read_s = clock, watts, period, 0.004

    def read_mj(self) -> int:
        self.clock.now += self.read_s
        published = int(self.clock.now / self.period) * self.period
        steps = int(published / 0.001)
        return round(sum(self.watts(i * 0.001) for i in range(steps)))  # mJ: W x 1 ms per step

    def close(self) -> None:
        self.closed = True


def test_a_window_repeats_the_work_until_long_enough() -> None:
    clock = FakeClock(0.3)
    w = window(FakeCounter([1_000, 1_001, 301_001], clock), "pass", clock.work, 1.0, clock=clock)
    assert (w.iterations, w.millijoules) == (4, 300_000)
    assert w.seconds >= 1.2 and w.watts == pytest.approx(300.0 / w.seconds)


def test_a_window_opens_and_closes_on_the_counters_updates() -> None:
    """Work at 300 W in a 60 W idle: an aligned window measures the work's energy to a few percent, where reads a
    period away from the updates would miss up to two periods of it."""
    clock = FakeClock(0.37)
    busy: list[tuple[float, float]] = []

    def work() -> None:
        busy.append((clock.now, clock.now + clock.step))
        clock.work()

    def watts(t: float) -> float:
        return 300.0 if any(a <= t < b for a, b in busy) else 60.0

    clock.now = 0.05  # half a period after an update
    w = window(TickingCounter(clock, watts), "pass", work, 1.0, clock=clock)
    joules, seconds = w.per_iteration(60.0)
    assert w.iterations == 3 and 0 < w.tail_seconds <= 0.1 + 0.004
    assert seconds == pytest.approx(0.37, abs=0.005)
    assert joules == pytest.approx(300.0 * 0.37, rel=0.03)


@pytest.mark.parametrize(
    ("readings", "seconds", "why"),
    [
        ([1_000, 1_000], 1.0, "did not move"),
        ([5_000, 6_000, 1_000], 1.0, "went backwards"),
    ],
)
def test_a_window_that_cannot_measure_says_why(readings: list[int], seconds: float, why: str) -> None:
    clock = FakeClock(0.1)
    with pytest.raises(EnergyUnavailable, match=why):
        window(FakeCounter(readings, clock), "pass", clock.work, seconds, clock=clock)


def test_a_window_ends_at_the_repetition_nearest_its_length_and_never_below_a_second() -> None:
    clock = FakeClock(0.6)
    w = window(TickingCounter(clock, lambda _t: 100.0), "pass", clock.work, 2.0, clock=clock)
    assert w.iterations == 3  # 1.8 s is nearer 2 s than 2.4 s
    clock = FakeClock(0.6)
    w = window(TickingCounter(clock, lambda _t: 100.0), "prefill", clock.work, 1.0, clock=clock)
    assert w.iterations == 2 and w.seconds >= 1.0  # 0.6 s would be nearer, but is below MIN_WINDOW_S


class LoopingSession:
    """What `EnergyMeter.loops` drives: a pass advances the fake clock by 0.1 s for its prefill and 0.05 s per decode
    step; its decode steps repeat through `repeat_decode` unless the cache cannot rewind (`rewinds=False`)."""

    def __init__(self, clock: FakeClock, rewinds: bool) -> None:
        self.clock, self.rewinds = clock, rewinds
        self.device = torch.device("cpu")
        self.runtime = types.SimpleNamespace(compiles_prefill=False, static_cache_len=None)
        self.routing = None
        self.repeater: Callable[[Callable[[], None]], None] | None = None

    def prepare(self, path: Path) -> Path:
        return path

    def generate_batch(self, batch: Any, tokens: int, recorder: Any) -> None:
        self.clock.now += 0.1
        self.clock.now += 0.05 * (tokens - 1)
        if self.repeater is not None and tokens > 1:
            if not self.rewinds:
                raise DecodeNotRepeatable("its KV cache has SlidingLayer layers")
            self.repeater(lambda: setattr(self.clock, "now", self.clock.now + 0.05 * (tokens - 1)))

    @contextlib.contextmanager
    def repeat_decode(self, repeater: Callable[[Callable[[], None]], None]) -> Iterator[None]:
        self.repeater = repeater
        try:
            yield
        finally:
            self.repeater = None


@pytest.mark.parametrize("rewinds", [True, False])
def test_the_loops_time_decode_alone_or_fall_back_to_whole_passes(
    rewinds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill-only and decode-only loops; where the decode steps cannot repeat alone, a whole-pass loop instead and
    the reason kept. 8 tokens: 7 decode steps of 50 ms, so a decode repetition lasts 0.35 s and a pass 0.45 s."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda _device=None: None)
    clock = FakeClock(0.0)
    meter = EnergyMeter(TickingCounter(clock, lambda _t: 100.0), EnergySchema(), clock=clock, sleep=clock.advance)
    meter.loops(LoopingSession(clock, rewinds), (Path("page.png"),), 8)  # type: ignore[arg-type]
    measured = meter.finish("page.png", 1, 8)
    assert measured.prefill is not None and measured.prefill.seconds >= 1.0  # the prefill-only loop, about 1 s
    assert measured.prefill.per_iteration(measured.idle.watts)[1] == pytest.approx(0.1, abs=0.01)
    if rewinds:
        assert measured.decode is not None and measured.whole is None and measured.decode_note is None
        assert measured.decode.per_iteration(measured.idle.watts)[1] == pytest.approx(0.35, abs=0.01)
    else:
        assert measured.decode is None and "SlidingLayer" in str(measured.decode_note)
        assert measured.whole is not None and measured.whole.per_iteration(0.0)[1] == pytest.approx(0.45, abs=0.01)


class RefusingOnce(TickingCounter):
    """A counter whose first `refusals` reads fail as NVML does (permission lost for a moment)."""

    def __init__(self, clock: FakeClock, refusals: int) -> None:
        super().__init__(clock, lambda _t: 60.0)
        self.refusals = refusals

    def read_mj(self) -> int:
        if self.refusals > 0:
            self.refusals -= 1
            raise EnergyUnavailable("NVML refused the energy counter: Insufficient Permissions")
        return super().read_mj()


def _meter(counter: Any, clock: FakeClock, idle_seconds: float = 1.0) -> EnergyMeter:
    def sleep(seconds: float) -> None:
        clock.now += seconds

    meter = EnergyMeter(counter, EnergySchema(idle_seconds=idle_seconds), clock=clock, sleep=sleep)
    meter.whole = EnergyWindow(what="pass", iterations=3, seconds=1.8, millijoules=300_000)
    return meter


def test_idle_power_is_measured_over_the_runs_own_cpu_work() -> None:
    """Two seconds of host-only work at a 60 W idle: the idle window covers it, costing no sleep of its own."""
    clock = FakeClock(0.0)
    meter = _meter(TickingCounter(clock, lambda _t: 60.0), clock)
    with meter.idle_during("the profiler's post-processing"):
        clock.now += 2.0
    measured = meter.finish("page.png", 1, 32)
    assert measured.idle_source == "the profiler's post-processing"
    assert 2.0 <= measured.idle.seconds <= 2.1 + 0.01
    assert measured.idle.watts == pytest.approx(60.0, rel=0.01)


def test_short_cpu_work_is_padded_to_the_idle_length() -> None:
    clock = FakeClock(0.0)
    meter = _meter(TickingCounter(clock, lambda _t: 60.0), clock, idle_seconds=1.5)
    with meter.idle_during("post-processing"):
        clock.now += 0.3
    assert meter.idle is not None and meter.idle.seconds >= 1.5
    clock = FakeClock(0.0)
    meter = _meter(TickingCounter(clock, lambda _t: 60.0), clock, idle_seconds=0.5)
    with meter.idle_during("post-processing"):
        clock.now += 0.3
    assert meter.idle is None and "shorter than 1.0 s" in str(meter.idle_refused)
    assert "pipeline.energy.idle_seconds" in str(meter.idle_refused)


def test_a_counter_refusing_during_the_cpu_work_never_stops_it_and_a_sleep_measures_idle() -> None:
    clock = FakeClock(0.0)
    meter = _meter(RefusingOnce(clock, refusals=1), clock)
    ran = []
    with meter.idle_during("post-processing"):
        ran.append(True)
    assert ran and meter.idle is None and "Insufficient Permissions" in str(meter.idle_refused)
    measured = meter.finish("page.png", 1, 32)
    assert measured.idle_source == IDLE_SLEEP and measured.idle.watts == pytest.approx(60.0, rel=0.02)
    assert meter.counter is None  # NVML released


def test_idle_window_sleeps() -> None:
    clock = FakeClock(0.1)
    w = idle_window(FakeCounter([0, 10, 70_010], clock), 1.0, sleep=lambda _s: clock.work(), clock=clock)
    assert w.what == "idle" and w.millijoules == 70_000 and w.seconds >= 1.0 and w.tail_seconds == 0.0
    assert w.watts == pytest.approx(70.0 / w.seconds)


def test_without_pynvml_energy_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(EnergyUnavailable, match="pynvml is not installed"):
        load_nvml()


def test_nvml_refusing_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    class NVMLError(Exception):
        pass

    def refuse(*_args: Any) -> None:
        raise NVMLError("Not Supported")

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=refuse)
    with pytest.raises(EnergyUnavailable, match="NVML refused: Not Supported"):
        NvmlCounter.open(fake, torch.device("cuda", 0))
    monkeypatch.setattr(energy_mod, "gpu_handle", lambda _nvml, _device: "handle")
    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetTotalEnergyConsumption=refuse)
    with pytest.raises(EnergyUnavailable, match="Not Supported"):
        NvmlCounter.open(fake, torch.device("cuda", 0))


# ---- records, analysis, reports -----------------------------------------------------------------------------------
def _memory_pass() -> MemoryPass:
    samples = tuple(
        MemorySample(t, ev, st, a, r, kv)
        for t, ev, st, a, r, kv in [
            (0.0, "begin", vocab.E2E, 700 * MIB, 800 * MIB, 0),
            (1.0, "begin", vocab.PREFILL, 700 * MIB, 800 * MIB, 0),
            (5.0, "end", vocab.PREFILL, 760 * MIB, 1000 * MIB, 40 * MIB),
            (5.0, "begin", vocab.DECODE, 760 * MIB, 1000 * MIB, 40 * MIB),
            (9.0, "end", vocab.DECODE, 770 * MIB, 1000 * MIB, 41 * MIB),
            (9.5, "end", vocab.E2E, 770 * MIB, 1000 * MIB, 41 * MIB),
        ]
    )
    return MemoryPass(
        input="page.png",
        batch_size=1,
        new_tokens=8,
        context_tokens=300,
        weights_bytes=680 * MIB,
        baseline_allocated_bytes=700 * MIB,
        preexisting_kv_bytes=0,
        total_memory_bytes=80 * 2**30,
        outside_allocator_bytes=500 * MIB,
        kv_bytes_per_token=140 * 1024.0,
        kv_per_token_source="model config",
        peaks=(
            StagePeak(vocab.E2E, 1, 950 * MIB, 1000 * MIB, 40 * MIB),
            StagePeak(vocab.PREFILL, 1, 950 * MIB, 1000 * MIB, 40 * MIB),
            StagePeak(vocab.DECODE, 1, 780 * MIB, 1000 * MIB, 41 * MIB),
        ),
        samples=samples,
        snapshot_note="not saved (pipeline.memory.snapshot_max_mib=0)",
    )


def test_a_peak_inside_a_vision_stage_makes_the_batch_bound_conservative() -> None:
    plain = _memory_pass()
    assert vision_peak_caveat(plain) == ""
    sam = StagePeak("vision/sam", 1, 950 * MIB, 1000 * MIB, 40 * MIB)
    at_vision = attrs.evolve(plain, peaks=(*plain.peaks, sam))
    assert "The peak is in vision/sam" in vision_peak_caveat(at_vision)
    peak = breakdown(at_vision.peaks[0], at_vision.weights_bytes, 0, 0)
    assert "conservative" in "\n".join(fit_lines(fit_prediction(80 * 2**30, 0, peak, 1, None), at_vision))


def _energy_pass() -> EnergyPass:
    return EnergyPass(
        input="page.png",
        pages=1,
        new_tokens=8,
        idle=EnergyWindow("idle", 10, 1.0, 70_000),
        prefill=EnergyWindow("prefill", 20, 1.0, 300_000),  # 15 J per prefill, 50 ms
        whole=EnergyWindow("pass", 5, 1.0, 250_000),  # 50 J per pass, 200 ms
    )


def _analysed(tmp_metrics: Stage1Metrics, **measured: Any) -> Stage1Analysis:
    from llm_perf_opt.measure.stage1_analysis import Stage1Measurements, Stage1Setup

    m = tmp_metrics
    setup = Stage1Setup(
        run_id="x", model=m.model, model_class="X", device=m.device, settings=m.settings, vision_stages=(),
        config_digest="", inputs=1,
    )  # fmt: skip
    state = Stage1Measurements(**measured)
    state.flops["page.png"] = types.SimpleNamespace(  # type: ignore[assignment]
        stage_total=lambda s, _t: {vocab.PREFILL: 3e12, vocab.DECODE: 7e11}.get(s)
    )
    return Stage1Analysis(state, setup)


def test_the_analysis_derives_memory_and_energy_figures() -> None:
    base = load_stage1_metrics(FIXTURE)
    base = attrs.evolve(base, settings=attrs.evolve(base.settings, max_new_tokens=8))
    analysis = _analysed(base, memory=_memory_pass(), energy=_energy_pass())
    memory = analysis.memory()
    assert memory is not None and memory.available and memory.fit is not None
    assert all(b.parts_sum == b.peak_allocated_bytes for b in memory.breakdown)
    assert memory.analytic is not None and memory.analytic.kv_bytes == 140 * 1024 * 300
    energy = analysis.energy()
    assert energy is not None and energy.available
    stages = {s.stage: s for s in energy.stages}
    assert stages["prefill"].joules == pytest.approx(15.0) and stages["prefill"].watts == pytest.approx(300.0)
    assert stages[vocab.DECODE].joules == pytest.approx(35.0)
    assert stages[vocab.DECODE].flop_per_joule == pytest.approx(7e11 / 35.0)
    assert energy.joules_per_decode_token == pytest.approx(5.0)
    # above idle: decode's 35 J over 150 ms less 70 W x 150 ms, over 7 tokens
    assert energy.joules_per_decode_token_above_idle == pytest.approx((35.0 - 70.0 * 0.15) / 7)
    assert energy.tokens_per_joule == pytest.approx(8 / 50.0)
    assert stages["pass"].above_idle_joules == pytest.approx(50.0 - 70.0 * 0.2)


def test_energy_is_the_loops_own_and_a_loop_off_the_timed_pace_is_noted() -> None:
    """A host-paced decode loop that ran 25% slower than the timed passes (150 ms of decode per pass in the loop,
    120 ms timed): its energy is the loop's own, and the decode row says how far the loop's pace was."""
    timed = {vocab.PREFILL: 0.05, vocab.DECODE: 0.12}
    report = energy_report(_energy_pass(), {vocab.PREFILL: 3e12, vocab.DECODE: 7e11}, timed, "method")
    stages = {s.stage: s for s in report.stages}
    assert stages[vocab.DECODE].joules == pytest.approx(35.0) and stages[vocab.DECODE].seconds == pytest.approx(0.15)
    assert (
        "whole pass − prefill" in stages[vocab.DECODE].note and "+25% of the timed median" in stages[vocab.DECODE].note
    )
    assert stages[vocab.PREFILL].note == "" and report.joules_per_decode_token == pytest.approx(5.0)
    alone = energy_report(attrs.evolve(_energy_pass(), prefill=None, prefill_note="compiles"), {}, timed, "m")
    assert [s.stage for s in alone.stages] == ["pass"] and alone.joules_per_decode_token is None
    assert alone.joules_per_page == pytest.approx(50.0) and "+18%" in alone.stages[0].note  # 200 ms vs 170 ms


def test_decode_from_its_own_loop_and_the_pass_as_the_sum_of_the_two() -> None:
    """Prefill and decode looped alone (no whole-pass loop): J per decode token is the decode loop's own (no
    difference of two loops); the pass is their sum. Where the prefill loop cannot run, prefill is the whole-pass
    loop less the decode loop."""
    looped = attrs.evolve(
        _energy_pass(), whole=None, decode=EnergyWindow("decode", 10, 1.4, 350_000)
    )  # 35 J per decode section of 7 steps, 140 ms
    report = energy_report(looped, {vocab.PREFILL: 3e12, vocab.DECODE: 7e11}, {}, "m")
    stages = {s.stage: s for s in report.stages}
    assert stages[vocab.DECODE].note == "" and stages[vocab.DECODE].joules == pytest.approx(35.0)
    assert report.joules_per_decode_token == pytest.approx(5.0)
    assert stages["pass"].joules == pytest.approx(50.0) and stages["pass"].seconds == pytest.approx(0.19)
    assert stages["pass"].note == "prefill loop + decode loop" and report.joules_per_page == pytest.approx(50.0)
    assert report.tokens_per_joule == pytest.approx(8 / 50.0)
    blocked = attrs.evolve(looped, prefill=None, prefill_note="compiles", whole=EnergyWindow("pass", 5, 1.0, 250_000))
    stages = {s.stage: s for s in energy_report(blocked, {}, {}, "m").stages}
    assert stages[vocab.PREFILL].joules == pytest.approx(15.0) and stages[vocab.PREFILL].note == "whole pass − decode"
    assert stages[vocab.DECODE].note == "" and stages["pass"].note == ""
    noisy = attrs.evolve(blocked, whole=EnergyWindow("pass", 10, 1.0, 300_000))  # 30 J per pass < 35 J of decode
    stages = {s.stage: s for s in energy_report(noisy, {}, {}, "m").stages}
    assert stages[vocab.PREFILL].joules is None and "not available: whole pass − decode" in stages[vocab.PREFILL].note
    doc = Doc("t")
    energy_section(doc, report)
    looped_text = "the pass's decode steps 10 times over in 1.40 s (the KV cache rewound to the prompt each time)"
    assert looped_text in doc.text()


def test_the_records_round_trip_and_both_cases_render(tmp_path: Path) -> None:
    base = load_stage1_metrics(FIXTURE)
    analysis = _analysed(base, memory=attrs.evolve(_memory_pass(), max_positions=8192), energy=_energy_pass())
    full = attrs.evolve(base, memory=analysis.memory(), energy=analysis.energy())
    assert converter.structure(json.loads(json.dumps(to_plain(full))), Stage1Metrics) == full
    doc = Doc("t")
    timeline = memory_timeline(full, tmp_path / "memory" / "memory_timeline.png")
    assert timeline is not None and timeline.stat().st_size > 0
    memory_section(doc, full.memory, "memory/memory_timeline.png")
    energy_section(doc, full.energy)
    text = doc.text()
    for needle in ("## Memory by stage", "Fits on this GPU", "Largest batch of pages", "## Energy", "J per pass"):
        assert needle in text, needle
    assert "Energy per decode token: 5.0000 J, of which 3.5000 J above idle" in text
    assert "at most 8,192 positions (max_position_embeddings)" in text
    off = Doc("t")
    memory_section(off, MemoryReport(available=False, reason="disabled (pipeline.memory.enable=false)"), None)
    energy_section(off, EnergyReport(available=False, reason="pynvml is not installed"))
    assert "Not available: disabled (pipeline.memory.enable=false)." in off.text()
    assert "Not available: pynvml is not installed." in off.text()
    old = Doc("t")
    memory_section(old, None, None)
    energy_section(old, None)
    assert "Memory" not in old.text() and "Energy" not in old.text()  # an older folder renders as it did


@pytest.mark.parametrize(
    ("field", "recorded", "says"),
    [
        ("memory", {"available": True}, "MemoryReport says available: true but holds no measurement"),
        ("energy", {"available": False}, "EnergyReport says available: false but gives no reason"),
    ],
)
def test_an_inconsistent_memory_or_energy_record_is_refused_naming_the_file(
    field: str, recorded: dict[str, Any], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: stage1-report rendered `available: true` with no measurement as "Not available: None."."""
    from llm_perf_opt.cli.stage1_report import main as stage1_report

    with pytest.raises(ValueError, match=says):
        (MemoryReport if field == "memory" else EnergyReport)(**recorded)  # cannot be built either
    folder = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1", folder)
    metrics = folder / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), field: recorded}))
    report = (folder / "report.md").read_text()
    with pytest.raises(SystemExit) as ended:
        stage1_report([str(folder)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err  # one paragraph
    assert f"{metrics} cannot be read as a run record" in err and f"({says} @ $.{field})" in err
    assert (folder / "report.md").read_text() == report  # left as it was


def test_a_cpu_stage1_run_says_why_neither_was_measured(tmp_path: Path) -> None:
    cfg = compose_config(
        "stage1", "model=deepseek_ocr2_tiny", "device=cpu", "infer.max_new_tokens=2", "pipeline/torch_profiler=min"
    )
    Stage1Run(command_config(cfg), tmp_path / "run", run_id="cpu").execute()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["memory"] == {**metrics["memory"], "available": False}
    assert "needs a CUDA GPU" in metrics["memory"]["reason"]
    assert "NVML" in metrics["energy"]["reason"] and metrics["energy"]["available"] is False
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Memory by stage" in report and "## Energy" in report
    assert report.count("Not available: not measured on cpu") == 2
    off = compose_config("stage1", "pipeline.memory.enable=false", "pipeline.energy.loop_seconds=0.5")

    assert not command_config(off).memory.enable and command_config(off).energy.loop_seconds == 0.5

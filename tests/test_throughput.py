"""Pages per second as one figure (`measure.throughput`, `report.pages`): one value per timed forward, the time per
page beside its floor, and the same rate in report.md, metrics.json and the what-if's pages/s objective."""

from __future__ import annotations

import pytest

from llm_perf_opt.measure.throughput import page_throughput, throughput
from llm_perf_opt.measure.whatif import pass_values
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import (
    PAGE_DECODE,
    PAGE_LM_PREFILL,
    PAGE_PREPROCESS,
    PAGE_VISION,
    BatchRecord,
    ImageRecord,
    StageEfficiency,
)
from llm_perf_opt.report.batches import inputs_text
from llm_perf_opt.report.markdown import Doc
from llm_perf_opt.report.pages import bound_line, parts_table, per_day, throughput_lines


def _batch(repeat: int, size: int = 64, prefill_ms: float = 4000.0) -> BatchRecord:
    """A batch pass like the H100's at batch 64: preprocessing 2 s, prefill 4 s (vision 3 s), decode 0.7 s."""
    return BatchRecord(
        batch=0, repeat=repeat, images=("page_portrait.png",) * size, preprocess_ms=2000.0 + repeat,
        prefill_ms=prefill_ms, vision_ms={"vision/sam": 2000.0, "vision/clip": 1000.0}, decode_ms=700.0,
        decode_step_ms=(2.8,) * 255, new_tokens=256, padded_prompt_tokens=913, peak_memory_bytes=None,
    )  # fmt: skip


def _image(repeat: int, e2e_parts: tuple[float, float, float]) -> ImageRecord:
    pre, prefill, decode = e2e_parts
    return ImageRecord(
        image="a.png", repeat=repeat, preprocess_ms=pre, prefill_ms=prefill, vision_ms={"vision/sam": prefill / 2},
        decode_ms=decode, decode_step_ms=(decode / 3,) * 3, new_tokens=4, prompt_tokens=10, image_tokens=5, tiles=1,
        peak_memory_bytes=None,
    )  # fmt: skip


def _efficiency(stage: str, time_ms: float, sol_ms: float) -> StageEfficiency:
    return StageEfficiency(
        stage=stage, time_ms=time_ms, flops=1.0, bytes=1.0, arithmetic_intensity=1.0, ridge_point=1.0,
        bound="compute", mfu=None, mbu=None, speed_of_light_ms=sol_ms, gap=time_ms / sol_ms, flops_source="test",
    )  # fmt: skip


def test_a_batch_pass_finishes_all_its_pages_in_one_figure() -> None:
    forwards = [_batch(r) for r in range(3)]
    pages = page_throughput(forwards, ())
    assert pages is not None and pages.batch_size == 64 and pages.pages_per_s.n == 3  # one value per pass
    e2e = 2001.0 + 4000.0 + 700.0  # the median pass
    assert pages.pages_per_s.p50 == pytest.approx(64 / e2e * 1e3)
    assert throughput(forwards).e2e_images_per_s == pytest.approx(pages.pages_per_s.p50)  # the same figure
    assert pass_values_pages(forwards) == pytest.approx([64 / (2000.0 + r + 4700.0) * 1e3 for r in range(3)])
    assert pages.tokens_per_s.p50 == pytest.approx(64 * 256 / e2e * 1e3)
    assert pages.ttft_ms.p50 == pytest.approx(6001.0) and pages.ttlt_ms.p50 == pytest.approx(e2e)
    parts = {p.part: p.ms_per_page for p in pages.parts}
    assert parts == pytest.approx(
        {PAGE_PREPROCESS: 2001.0 / 64, PAGE_VISION: 3000.0 / 64, PAGE_LM_PREFILL: 1000.0 / 64, PAGE_DECODE: 700.0 / 64}
    )
    assert pages.bound_by is not None and pages.bound_by.part == PAGE_VISION


def pass_values_pages(forwards: list[BatchRecord]) -> list[float]:
    """The what-if's pages/s objective over the same passes."""

    class _Metrics:
        pass

    m = _Metrics()
    m.forwards = tuple(forwards)  # type: ignore[attr-defined]
    return pass_values(m, "pages_per_s")  # type: ignore[arg-type]


def test_the_floors_split_the_prefill_into_vision_and_the_language_model() -> None:
    forwards = [_batch(r) for r in range(3)]
    efficiency = [
        _efficiency(vocab.PREFILL, 12_000.0, 120.0),  # 1% of the time: 40 ms of the 4,000 ms prefill
        _efficiency("vision/sam", 6_000.0, 30.0),  # 10 ms of 2,000
        _efficiency("vision/clip", 3_000.0, 15.0),  # 5 ms of 1,000
        _efficiency(vocab.DECODE, 2_100.0, 210.0),  # 70 ms of 700
    ]
    pages = page_throughput(forwards, efficiency)
    assert pages is not None
    floors = {p.part: p.floor_ms_per_page for p in pages.parts}
    assert floors[PAGE_PREPROCESS] is None
    assert floors[PAGE_VISION] == pytest.approx(15.0 / 64)
    assert floors[PAGE_LM_PREFILL] == pytest.approx(25.0 / 64)
    assert floors[PAGE_DECODE] == pytest.approx(70.0 / 64)
    assert pages.floor_ms_per_page == pytest.approx(110.0 / 64)
    line = bound_line(pages, "pages")
    assert line is not None and "Bound by **vision**" in line and "200.0× its floor" in line
    assert f"{1e3 / (110.0 / 64 + 2001.0 / 64):,.1f} pages/s" in line  # at the floors, preprocessing as measured


def test_a_short_last_batch_is_left_out_of_the_batch_figures() -> None:
    forwards = [_batch(0), _batch(1), _batch(2), _batch(0, size=3)]
    pages = page_throughput(forwards, ())
    assert pages is not None and pages.batch_size == 64 and pages.pages_per_s.n == 3


def test_batch_1_runs_and_their_report_lines() -> None:
    forwards = [_image(r, (10.0, 40.0, 50.0 + r)) for r in range(3)]
    pages = page_throughput(forwards, ())
    assert pages is not None and pages.batch_size == 1
    assert pages.pages_per_s.p50 == pytest.approx(1e3 / 101.0) == throughput(forwards).e2e_images_per_s
    lines = throughput_lines(pages, "pages")
    assert lines[0].startswith(f"**{1e3 / 101.0:,.2f} pages/s** at batch 1 (p50 over 3 passes; 95% interval")
    assert "per day" in lines[0] and "batch pass gets" not in lines[2]
    doc = Doc("t")
    parts_table(doc, pages, "pages")
    text = doc.text()
    assert "|language-model prefill|20.00|20%|n/a|n/a|" in text
    assert page_throughput([], ()) is None


def test_per_day_and_the_compact_batch_cell() -> None:
    assert per_day(11.1) == "959,040" and per_day(30.0) == "2.59 million"
    assert inputs_text(("b.png",) * 64) == "b.png ×64"
    assert inputs_text(("a.png", "b.png", "a.png")) == "a.png ×2, b.png"


# ---- host work around the passes (a real run: batch 64 on an H200 of a 64-core host, unpinned, 2026-11-28) ------


def test_host_work_around_the_passes_and_the_pin_it_needs() -> None:
    import attrs

    from helpers import FIXTURES
    from llm_perf_opt.measure.throughput import host_around
    from llm_perf_opt.records.folders import load_stage1_metrics
    from llm_perf_opt.records.shard import PassWindow
    from llm_perf_opt.report.pages import host_around_line

    m = load_stage1_metrics(FIXTURES / "metrics" / "h200_batch64_unpinned.json")
    h = host_around(m)
    assert h is not None and h.pass_ms == pytest.approx(1978.7, abs=0.1)  # p50 end to end of the 5 passes
    assert h.outside_ms == pytest.approx(707.4, abs=0.1) and h.crowded  # 26% of the pass, 16.3 cores busy
    line = host_around_line(h, "pages", cuda=True, pinned=False)
    assert line.startswith("Around each pass: 707.4 ms (p50)") and "which the pages/s per pass leaves out" in line
    assert "wall-clock windows" not in line  # one pages/s figure in a report: the per-pass p50
    assert "16.3 cores busy" in line and "`run.cpu_affinity=1-15`" in line
    assert "Pin them" not in host_around_line(h, "pages", cuda=True, pinned=True)  # pinned already
    assert "Pin them" not in host_around_line(h, "pages", cuda=False, pinned=False)  # a CPU run computes on them
    assert host_around(attrs.evolve(m, timed_windows=())) is None  # an older folder: no windows
    one_short = attrs.evolve(m, timed_windows=m.timed_windows[:-1])
    assert host_around(one_short) is None  # windows that do not pair with the forwards
    early = attrs.evolve(
        m, timed_windows=tuple(PassWindow(w.started_s, w.started_s + 0.5, w.inputs) for w in m.timed_windows)
    )
    assert host_around(early) is not None and host_around(early).outside_ms == 0.0  # never a negative time

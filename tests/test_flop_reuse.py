"""FLOPs counted once per distinct input shape (instruments/flops.py `FlopCounts`): an input or batch of shapes already
counted reuses that count, and the reused count equals counting it (the tiny DeepSeek-OCR-2 on the CPU; pages of
the same size but different content route their tokens to different experts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from PIL import Image

from llm_perf_opt.instruments import flops
from llm_perf_opt.instruments.flops import FlopCounts, count_stage_flops, input_signature
from llm_perf_opt.measure import stage_flops

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api


@pytest.fixture(scope="module")
def noisy_small(page_images: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A page of the "small" page's size, random pixels instead of white."""
    size = Image.open(page_images["small"]).size
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("noisy") / "noisy_small.png"
    Image.fromarray(pixels).save(path)
    return path


def _prepared(session: Any, page_images: dict[str, Path], noisy_small: Path) -> tuple[Any, ...]:
    """A white page, a noisy page of the same size, a page with tiles: prepared."""
    return tuple(session.prepare(p) for p in (page_images["small"], noisy_small, page_images["two_tiles"]))


def _figures(counted: stage_flops.StageFlops) -> tuple[Any, ...]:
    """The figures of a count (its operator breakdown and source aside, which a priced count does not have)."""
    return (
        counted.prefill,
        dict(counted.vision),
        counted.decode_step_base,
        counted.decode_step_per_ctx,
        counted.prompt_tokens,
    )


@pytest.fixture
def count_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The inputs `count_stage_flops` is called on through `FlopCounts`, one entry per count run."""
    calls: list[Any] = []

    def counting(session: Any, prepared: Any) -> stage_flops.StageFlops:
        calls.append(prepared)
        return count_stage_flops(session, prepared)

    monkeypatch.setattr(flops, "count_stage_flops", counting)
    return calls


@pytest.fixture
def no_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts alone: no analytic pricing (whether a model's analytic model equals its count is a property of the
    model and the transformers release, which the pricing tests below stand in for)."""
    monkeypatch.setattr(flops, "priced_stage_flops", lambda session, prepared: None)


def test_inputs_of_one_size_are_counted_once_and_the_reused_count_is_exact(
    tiny_session: Any, page_images: dict[str, Path], noisy_small: Path, count_calls: list[Any], no_pricing: None
) -> None:
    white, noisy, tiled = _prepared(tiny_session, page_images, noisy_small)
    assert input_signature(white) == input_signature(noisy) != input_signature(tiled)
    counts = FlopCounts()
    reused = [counts.count(tiny_session, one, name) for one, name in ((white, "w"), (noisy, "n"), (tiled, "t"))]
    assert len(count_calls) == 2 and (counts.counted, counts.reused) == (2, 1)
    # Counting every input gives the same figures: the noisy page routes differently, but top-k routing sends each
    # token to k experts of one shape whichever they are.
    assert reused == [count_stage_flops(tiny_session, p) for p in (white, noisy, tiled)]


def test_batches_of_the_same_per_input_shapes_are_counted_once(
    tiny_session: Any, page_images: dict[str, Path], noisy_small: Path, count_calls: list[Any], no_pricing: None
) -> None:
    white, noisy, tiled = _prepared(tiny_session, page_images, noisy_small)
    counts = FlopCounts()
    first = counts.count(tiny_session, [white, tiled], "b0")
    again = counts.count(tiny_session, [noisy, tiled], "b1")
    other = counts.count(tiny_session, [tiled, white], "b2")  # another order: another padding layout, counted
    assert len(count_calls) == 2 and (counts.counted, counts.reused) == (2, 1)
    assert again == first == count_stage_flops(tiny_session, [noisy, tiled])
    assert other == count_stage_flops(tiny_session, [tiled, white])
    assert input_signature(white) != input_signature([white])  # one input and a batch of one never share a count


def test_a_batch_of_one_shape_is_that_many_times_one_input_once_two_were_twice_one(
    tiny_session: Any, page_images: dict[str, Path], noisy_small: Path, count_calls: list[Any], no_pricing: None
) -> None:
    white, noisy, _ = _prepared(tiny_session, page_images, noisy_small)
    counts = FlopCounts()
    counts.count(tiny_session, white, "w")
    batch = counts.count(tiny_session, [white, noisy, white], "b0")  # one shape: no padding
    full = count_stage_flops(tiny_session, [white, noisy, white])
    # one input and a batch of two counted; the batch of three scaled where two were twice one, else counted too
    assert counts.scaling_exact is not None and len(count_calls) == (2 if counts.scaling_exact else 3)
    assert batch.prompt_tokens == full.prompt_tokens
    # scaled, the batch is the count within the agreement a batch of two needed (transformers 5.17's MoE counts a
    # batch of two ~1e-6 off twice one; 5.24's exactly)
    close = 3 * flops._AGREE
    for field in ("prefill", "decode_step_base", "decode_step_per_ctx"):
        assert getattr(batch, field) == pytest.approx(getattr(full, field), rel=close), field
    assert batch.vision == pytest.approx(dict(full.vision), rel=close)
    again = counts.count(tiny_session, [noisy, white], "b1")  # a batch of two of that shape: checked once only
    assert len(count_calls) == (2 if counts.scaling_exact else 3) and again.prompt_tokens == full.prompt_tokens


def test_a_batch_is_counted_where_two_inputs_are_not_twice_one(
    tiny_session: Any,
    page_images: dict[str, Path],
    noisy_small: Path,
    count_calls: list[Any],
    no_pricing: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flops, "_agree", lambda priced, counted, new_tokens=64: False)
    white, noisy, _ = _prepared(tiny_session, page_images, noisy_small)
    counts = FlopCounts()
    batch = counts.count(tiny_session, [white, noisy, white], "b0")
    assert counts.scaling_exact is False and len(count_calls) == 3  # one input, two, then the batch itself
    assert batch == count_stage_flops(tiny_session, [white, noisy, white])


def test_other_shapes_are_priced_once_the_analytic_model_equals_the_first_count(
    tiny_session: Any, page_images: dict[str, Path], count_calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    small, tiled = (tiny_session.prepare(page_images[name]) for name in ("small", "two_tiles"))
    exact = {input_signature(p): count_stage_flops(tiny_session, p) for p in (small, tiled)}
    count_calls.clear()

    def analytic(session: Any, prepared: Any) -> stage_flops.StageFlops:  # an analytic model equal to the count
        return attrs.evolve(exact[input_signature(prepared)], by_operator={}, source=stage_flops.ANALYTIC_SOURCE)

    monkeypatch.setattr(flops, "priced_stage_flops", analytic)
    counts = FlopCounts()
    first = counts.count(tiny_session, small, "small")
    second = counts.count(tiny_session, tiled, "tiled")  # another shape: priced, not counted
    assert counts.analytic_agrees is True and (counts.counted, counts.priced) == (1, 1) and len(count_calls) == 1
    assert first.source == stage_flops.FLOP_SOURCE and second.source == stage_flops.ANALYTIC_SOURCE
    assert _figures(second) == _figures(exact[input_signature(tiled)])
    assert "priced by the analytic model" in stage_flops.run_flops_source([first, second])
    assert stage_flops.run_flops_source([first]) == stage_flops.FLOP_SOURCE


def test_a_model_whose_analytic_model_differs_is_counted_for_every_shape(
    tiny_session: Any, page_images: dict[str, Path], count_calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    small, tiled = (tiny_session.prepare(page_images[name]) for name in ("small", "two_tiles"))
    exact = {input_signature(p): count_stage_flops(tiny_session, p) for p in (small, tiled)}
    count_calls.clear()

    # an analytic model a hundred-thousandth off the count
    def off(session: Any, prepared: Any) -> stage_flops.StageFlops:
        counted = exact[input_signature(prepared)]
        return attrs.evolve(counted, prefill=counted.prefill * (1 + 1e-5), source=stage_flops.ANALYTIC_SOURCE)

    monkeypatch.setattr(flops, "priced_stage_flops", off)
    counts = FlopCounts()
    counts.count(tiny_session, small, "small")
    counts.count(tiny_session, tiled, "tiled")
    assert counts.analytic_agrees is False and (counts.counted, counts.priced) == (2, 0) and len(count_calls) == 2

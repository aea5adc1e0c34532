"""Output departures at near-ties: the top two logits behind each greedy token (`run.save_top2_logits`), a rung's
departure judged against the baseline's own top two (`whatif_run.near_tie_tolerance`), in the outputs verdict, the
ladder, the verdict line and whatif.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, whatif_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import NullRecorder
from llm_perf_opt.measure import whatif_objectives as o
from llm_perf_opt.measure.outputs import load_top_two, near_tie, save_top_two
from llm_perf_opt.measure.whatif import outputs_departure
from llm_perf_opt.measure.whatif_analysis import WhatIfAnalysis, verdict_line
from llm_perf_opt.pipeline.whatif_judge import judging_settings, near_tie_tolerance
from llm_perf_opt.records.stage1 import TopTwoLogits
from llm_perf_opt.records.whatif import ALONE, MEASURED, SAME, WORSE, NearTie, OutputAgreement, Rung, Speedup

# The baseline's top-two pass: tokens 5, 6, 7, 8; at token 2 its top two (7 and 9) are 0.02 apart at a top logit
# of 4.0 (0.5% of it), at token 3 (8 and 3) 0.4 apart (10%).
TOP2 = TopTwoLogits(
    tokens=(5, 6, 7, 8),
    ids=((5, 1), (6, 2), (7, 9), (8, 3)),
    logits=((3.0, 1.0), (5.0, 2.0), (4.0, 3.98), (4.0, 3.6)),
)
BASE = (5, 6, 7, 8)


def test_a_departure_between_the_baselines_top_two_is_a_near_tie_judged_against_the_tolerance() -> None:
    tie = near_tie((5, 6, 9, 1), BASE, TOP2, 0.01)
    assert tie is not None and tie.token == 2 and tie.top_logit == 4.0
    assert tie.gap == pytest.approx(0.02) and tie.relative_gap == pytest.approx(0.005) and tie.within
    assert not attrs.evolve(tie, tolerance=0.001).within
    assert not attrs.evolve(tie, tolerance=None).within  # no tolerance: no departure counts
    wide = near_tie((5, 6, 7, 3), BASE, TOP2, 0.01)
    assert wide is not None and wide.relative_gap == pytest.approx(0.1) and not wide.within


def test_other_departures_are_not_near_ties() -> None:
    assert near_tie(BASE, BASE, TOP2, 0.01) is None  # identical
    assert near_tie((5, 6, 4, 8), BASE, TOP2, 0.01) is None  # token 4 was not the baseline's runner-up
    assert near_tie((5, 6, 9), BASE, None, 0.01) is None  # no top-two pass recorded
    # the top-two pass generated another token before the departure: it saw another context there
    other_context = attrs.evolve(TOP2, tokens=(5, 2, 7, 8))
    assert near_tie((5, 6, 9, 1), BASE, other_context, 0.01) is None
    assert NearTie(token=0, gap=0.0, top_logit=0.0, tolerance=0.0).within  # an exact tie is a tie at any tolerance


def _agreement(tie: NearTie | None, departs: int | None = 2) -> OutputAgreement:
    return OutputAgreement(
        inputs=1, first_departure=departs, compared_tokens=4, prefill_logits_max_abs_diff=0.0, near_tie=tie
    )


def test_a_near_tie_within_tolerance_is_the_same_output_for_the_verdict_and_the_ladder() -> None:
    within = _agreement(NearTie(token=2, gap=0.02, top_logit=4.0, tolerance=0.01))
    beyond = _agreement(NearTie(token=2, gap=0.4, top_logit=4.0, tolerance=0.01))
    assert within.within_tolerance and not beyond.within_tolerance and not _agreement(None).within_tolerance
    assert _agreement(None, departs=None).within_tolerance
    judged = o.judge_outputs(within)
    assert judged.verdict == SAME
    assert judged.why == (
        "depart at token 2 of 4 at a near-tie: the baseline's top two logits there 0.02 apart, 0.50% of the top logit "
        "(tolerance 1%)"
    )
    worse = o.judge_outputs(beyond)
    assert worse.verdict == WORSE and "a close call beyond the tolerance" in (worse.why or "")
    assert outputs_departure(within, None) is None
    reason = outputs_departure(beyond, None) or ""
    assert "token 2 of 4, a close call beyond the tolerance" in reason and "near_tie_tolerance" in reason
    assert "token 2 of 4 (the ladder" in (outputs_departure(_agreement(None), None) or "")
    # the prefill-logit limit still holds for a rung within the near-tie tolerance
    assert outputs_departure(attrs.evolve(within, prefill_logits_max_abs_diff=0.5), 0.1) is not None


def test_the_verdict_line_names_the_near_tie() -> None:
    gain = Speedup(value=10.0, ci95_low=9.0, ci95_high=11.0, ci_method="t", verdict="beyond noise")
    tie = NearTie(token=2, gap=0.02, top_logit=4.0, tolerance=0.01)
    rung = Rung("cuda_graphs", ALONE, ("cuda_graphs",), (), False, MEASURED, speedup=gain, outputs=_agreement(tie))
    line = verdict_line(rung, 5)
    assert line == (
        "cuda_graphs: 10.00× (beyond noise), outputs identical up to a near-tie at generated token 2 (within tolerance)"
    )
    beyond = attrs.evolve(rung, outputs=_agreement(attrs.evolve(tie, gap=0.4)))
    assert verdict_line(beyond, 5).endswith("outputs depart at generated token 2")


def test_the_ladder_takes_a_lever_departing_at_a_near_tie() -> None:
    """The H100 runs with random weights: CUDA graphs departed at token 18, a near-tie of the baseline's logits; it
    now goes on the ladder, while a lever departing elsewhere stays off with the reason."""
    cfg = compose_config("whatif")
    settings = judging_settings(command_config(cfg), whatif_nodes(cfg))
    assert settings.near_tie_tolerance == 0.01  # the shipped default
    tie = NearTie(token=18, gap=0.01, top_logit=3.1, tolerance=0.01)
    base = Rung("graphs", ALONE, ("graphs",), (), False, MEASURED)
    rungs = [
        attrs.evolve(base, outputs=_agreement(tie, departs=18)),
        attrs.evolve(base, name="early", outputs=_agreement(None, departs=5)),
    ]
    analysis = WhatIfAnalysis(settings, (), rungs, {})
    assert analysis.departure("graphs") is None
    assert "token 5 of 4" in (analysis.departure("early") or "")


def test_a_bad_tolerance_is_one_paragraph() -> None:
    assert near_tie_tolerance(None) is None and near_tie_tolerance(0) == 0.0 and near_tie_tolerance("0.02") == 0.02
    for bad in (1.5, -0.1, "often", True):
        with pytest.raises(UserError, match=r"whatif_run\.near_tie_tolerance=.* is not a fraction of the top logit"):
            near_tie_tolerance(bad)


def test_top_two_logits_are_saved_and_read_back(tmp_path: Path) -> None:
    save_top_two(tmp_path / "top2_logits.json", {"page.png": TOP2})
    assert load_top_two(tmp_path) == {"page.png": TOP2}
    assert load_top_two(tmp_path / "elsewhere") == {}


def test_a_damaged_top_two_file_is_said_and_read_as_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "top2_logits.json").write_text("{damaged")
    assert load_top_two(tmp_path) == {}
    assert "output departures are judged without the baseline's top two logits" in caplog.text


def test_the_top_two_pass_gives_each_greedy_tokens_candidates(tiny_session: Any, page_images: dict[str, Path]) -> None:
    """On the tiny model: the pass's tokens are greedy decoding's own, each the first of its two candidates, whose
    logits equal the logits of the whole sequence recomputed without a KV cache."""
    from helpers import greedy_by_recomputation

    prepared = tiny_session.prepare(page_images["small"])
    top2 = tiny_session.top_two(prepared, 4)
    assert list(top2.tokens) == greedy_by_recomputation(tiny_session, prepared, 4)
    assert [first for first, _ in top2.ids] == list(top2.tokens)
    assert all(high >= low for high, low in top2.logits) and len(top2.logits) == 4
    ids, inputs = prepared.input_ids, dict(prepared.model_inputs)
    full = torch.cat([ids, torch.tensor([top2.tokens[:-1]])], dim=1)
    inputs.update(input_ids=full, attention_mask=torch.ones_like(full))
    with torch.inference_mode():
        logits = tiny_session.model(**inputs, use_cache=False).logits[0, -4:].float()
    values, _ = logits.topk(2, dim=-1)
    assert torch.allclose(values, torch.tensor(top2.logits), atol=1e-4)


def test_a_compiled_loop_refuses_to_keep_the_top_two(tiny_session: Any) -> None:
    loop = tiny_session._loop
    loop.compiled.append(object())  # as a compiled step would stand there
    try:
        with pytest.raises(ValueError, match="keep_top2 needs an eager loop"):
            loop.run([], 2, NullRecorder(torch.device("cpu")), embed=None, keep_top2=True)
    finally:
        loop.compiled.pop()

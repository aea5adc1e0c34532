"""Every objective of a what-if rung judged against the baseline, the trade-offs flagged, the best rung per goal and
the frontier, the `whatif.objective` setting, paths kept out of whatif.md, and records written before all of it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import attrs
import pytest

from helpers import measured_energy, run_main, whatif_run
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, whatif_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure import whatif as w
from llm_perf_opt.measure import whatif_objectives as o
from llm_perf_opt.measure.whatif_analysis import WhatIfAnalysis, WhatIfSettings, unrepeatable_outputs, verdict_line
from llm_perf_opt.pipeline.whatif_judge import judging_settings, memory_budget, workload_decode_tokens
from llm_perf_opt.records import io
from llm_perf_opt.records.folders import load_stage1, load_whatif
from llm_perf_opt.records.memory import MemoryReport
from llm_perf_opt.records.stage1 import BatchRecord, Stage1Metrics
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    BETTER,
    MEASURED,
    NOT_JUDGED,
    SAME,
    WORSE,
    Judgement,
    Lever,
    Objective,
    Rung,
    Speedup,
    WhatIfRecord,
)
from llm_perf_opt.report.whatif_report import clean_paths, judgement_text, whatif_md
from whatif_fixtures import realistic

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "whatif-h100-decode"
DECODE = o.PASS_FIGURES[4]


def _j(objective: str, verdict: str, change: float | None, base: float = 100.0) -> Judgement:
    figure = next(f for f in o.FIGURES if f.name == objective)
    value = None if change is None else base * (1 + change)
    return Judgement(objective, figure.label, figure.unit, base, value, verdict, change)


# --------------------------------------------------------------------------------------------- verdicts


def test_a_timed_figure_is_better_worse_within_noise_or_not_judged() -> None:
    base = [20.0, 20.2, 19.8, 20.1, 19.9]
    assert o.judge_passes(DECODE, base, [2.0, 2.1, 1.9]).verdict == BETTER
    worse = o.judge_passes(DECODE, base, [30.0, 30.3, 29.7])
    assert worse.verdict == WORSE and worse.change == pytest.approx(0.5)
    assert worse.ci95_low is not None and worse.ci95_low > 1  # the interval of the ratio rung / baseline
    assert o.judge_passes(DECODE, base, [20.0, 19.0, 21.0]).verdict == SAME
    few = o.judge_passes(DECODE, base, [2.0])
    assert few.verdict == NOT_JUDGED and "1 timed passes; an interval needs ≥ 3" in (few.why or "")
    assert o.judge_passes(DECODE, [], [2.0]).why == "not measured by the baseline"
    pages = o.PASS_FIGURES[5]  # higher is better
    assert o.judge_passes(pages, [1.0, 1.01, 0.99], [4.0, 4.1, 3.9]).verdict == BETTER


def test_one_value_figures_are_judged_against_their_threshold() -> None:
    same = o._relative(o.MEMORY_TOLERANCE)
    assert o.judge_value(o.PEAK_MEMORY, 7.10, 7.15, same=same, how="").verdict == SAME
    assert o.judge_value(o.PEAK_MEMORY, 7.10, 41.6, same=same, how="").verdict == WORSE
    assert o.judge_value(o.PEAK_MEMORY, None, 41.6, same=same, how="").verdict == NOT_JUDGED


def test_the_example_rungs_are_judged_on_every_objective() -> None:
    base = load_stage1(EXAMPLE / "rungs" / "00-baseline").metrics
    graphs = load_stage1(EXAMPLE / "rungs" / "02-cuda_graphs").metrics
    judged = {j.objective: j for j in o.judge(base, graphs, None, decode_tokens=256)}
    assert [j for j in judged] == [f.name for f in o.FIGURES]
    assert judged["decode_ms_per_token"].verdict == BETTER
    assert judged["page_latency_ms"].verdict == BETTER
    assert "extrapolated from 32 measured" in (judged["page_latency_ms"].why or "")
    # TTFT + 255 × decode per pass: 246.7 + 255 × 22.9 ms at baseline
    assert judged["page_latency_ms"].base == pytest.approx(6090, rel=0.05)
    assert judged["compile_s"].verdict == WORSE and judged["compile_s"].value == pytest.approx(45.4, abs=0.1)
    assert judged["memory_pass_peak_gib"].why == "baseline: the run recorded no memory pass"
    assert judged["outputs"].verdict == NOT_JUDGED  # none given
    flags = o.tradeoffs(tuple(judged.values()), None)
    assert flags == ("decode −93% and whole-page latency −90%, but warm-up/compile +45.4 s",)


def test_memory_and_energy_passes_are_judged_when_recorded_and_say_why_when_not() -> None:
    base = load_stage1(EXAMPLE / "rungs" / "00-baseline").metrics
    rung = load_stage1(EXAMPLE / "rungs" / "01-static_cache").metrics
    energy = measured_energy(2.0)
    base = attrs.evolve(base, energy=energy, memory=MemoryReport(available=False, reason="CPU run"))
    rung = attrs.evolve(rung, energy=attrs.evolve(energy, joules_per_decode_token=1.0))
    judged = {j.objective: j for j in o.judge(base, rung, None, None)}
    assert judged["joules_per_decode_token"].verdict == BETTER
    assert judged["memory_pass_peak_gib"].why == "baseline: memory pass not available: CPU run"


def test_the_first_pass_extra_is_judged_apart_from_the_steady_passes_and_says_why_when_not_kept() -> None:
    """The most an input's first warm-up pass took beyond its timed median: a rung whose steady passes are faster but
    whose first pass costs as much extra is the same, one whose first pass pays for compilation is worse (and the
    trade-off names it); an extra near 0 on both sides is the same within a tenth of the baseline's timed pass."""
    base = load_stage1(EXAMPLE / "rungs" / "00-baseline").metrics
    rung = load_stage1(EXAMPLE / "rungs" / "02-cuda_graphs").metrics
    assert not base.first_passes  # recorded before runs kept them
    judged = {j.objective: j for j in o.judge(base, rung, None, None)}
    assert judged["first_pass_extra_ms"].verdict == NOT_JUDGED
    why = "baseline: the run kept no first pass: written before they were kept, or run in a process an earlier job had"
    assert judged["first_pass_extra_ms"].why == why + " warmed"

    def first(m: Stage1Metrics, extra_ms: float) -> Stage1Metrics:
        """`m` (one input) with a first pass `extra_ms` beyond its timed median end to end (all of it prefill)."""
        (image,) = m.images
        median = statistics.median(r.e2e_ms for r in m.records)
        one = attrs.evolve(m.records[0], preprocess_ms=0.0, prefill_ms=median + extra_ms, decode_ms=0.0)
        assert one.image == image and one.e2e_ms == pytest.approx(median + extra_ms)
        return attrs.evolve(m, first_passes=(one,))

    def verdict(b: Stage1Metrics, r: Stage1Metrics) -> Judgement:
        return next(j for j in o.judge(b, r, None, None) if j.objective == "first_pass_extra_ms")

    paid = first(base, 2000.0)  # timed median 939 ms
    quicker = verdict(paid, first(rung, 100.0))  # timed median 249 ms
    assert (quicker.base, quicker.value, quicker.verdict) == (pytest.approx(2000.0), pytest.approx(100.0), BETTER)
    assert "took beyond its timed median; within 25% of the baseline's, or 10% of its timed pass" in (quicker.why or "")
    assert verdict(paid, first(rung, 1900.0)).verdict == SAME  # its first pass is 800 ms shorter, its extra as large
    assert verdict(first(base, -5.0), first(rung, 60.0)).verdict == SAME  # 0 against 60 ms: within 94 ms
    assert first(base, -5.0).first_pass_extra_ms == 0.0  # never a negative time
    compiled = first(rung, 9000.0)
    judged = {j.objective: j for j in o.judge(paid, compiled, None, None)}
    assert judged["first_pass_extra_ms"].verdict == WORSE
    assert o.tradeoffs(tuple(judged.values()), None) == (
        "decode −93% and whole-page latency −73%, but warm-up/compile +45.4 s and first-pass extra +7,000.0 ms",
    )


# --------------------------------------------------------------------------------------------- trade-offs


def test_a_gain_with_a_loss_beyond_noise_is_flagged_in_plain_words() -> None:
    judged = (
        _j("decode_ms_per_token", BETTER, -0.91),
        _j("ttft_ms", WORSE, 1.30),
        _j("prefill_ms", WORSE, 0.56),
        _j("vision_ms", SAME, 0.02),
    )
    assert o.tradeoffs(judged, None) == ("decode −91%, but time to first token +130% and prefill +56%",)
    assert o.tradeoffs(judged[:1], None) == ()  # a gain alone is no trade-off
    assert o.tradeoffs(judged[1:], None) == ()  # nor a loss alone


def test_a_setup_cost_said_in_its_unit_is_quoted_after_the_gains_said_in_percent() -> None:
    """A first-pass extra from 2,000 to 0 ms is −100% of a setup cost: quoted after the timed gains, not before them;
    a change that rounds to nothing carries no sign."""
    first_pass = Judgement("first_pass_extra_ms", "first-pass extra", "ms", 2000.0, 0.0, BETTER, -1.0)
    judged = (
        first_pass,
        _j("decode_ms_per_token", BETTER, -0.5),
        _j("vision_ms", BETTER, -0.7),
        _j("ttft_ms", WORSE, 1.0),
    )
    assert o.tradeoffs(judged, None) == ("vision −70% and decode −50%, but time to first token +100%",)
    assert o.change_text(first_pass) == "first-pass extra −2,000.0 ms"
    assert o.signed_amount(0.04) == "0.0" and o.signed_amount(-0.06) == "−0.1" and o.signed_amount(1234.5) == "+1,234.5"
    same = Judgement("first_pass_extra_ms", "first-pass extra", "ms", 10.0, 10.02, SAME, 0.002)
    assert judgement_text(same) == "0.0 ms within noise"


def _batched(base: Stage1Metrics, pages: int, vision_factor: float) -> Stage1Metrics:
    """`base` run as batches of `pages` pages: each pass's vision `vision_factor` × the baseline pass's, its prefill
    the batch's vision plus the baseline's language-model prefill, its decode steps the baseline's."""
    batches = []
    for i, r in enumerate(base.records):
        vision = {stage: ms * vision_factor for stage, ms in r.vision_ms.items()}
        prefill = sum(vision.values()) + r.prefill_ms - sum(r.vision_ms.values())
        batches.append(
            BatchRecord(
                batch=0,
                repeat=i,
                images=(r.image,) * pages,
                preprocess_ms=r.preprocess_ms * pages,
                prefill_ms=prefill,
                vision_ms=vision,
                decode_ms=r.decode_ms,
                decode_step_ms=r.decode_step_ms,
                new_tokens=r.new_tokens,
                padded_prompt_tokens=r.prompt_tokens,
                peak_memory_bytes=r.peak_memory_bytes,
            )
        )
    return attrs.evolve(base, batches=tuple(batches))


def test_pass_times_are_judged_per_page_when_the_rung_holds_more_pages_a_pass() -> None:
    """A batch-4 rung whose vision pass takes 2× the batch-1 baseline's spends half the vision time per page: "vision
    per page −50%", not "+100%"; decode per page-token (the same step over 4 pages: −75%); the time to first token, a
    page's own wait, stays a loss; a part judged per page never stands for the first token's."""
    base = load_stage1(EXAMPLE / "rungs" / "00-baseline").metrics
    rung = _batched(base, pages=4, vision_factor=2.0)
    judged = {j.objective: j for j in o.judge(base, rung, None, None)}
    vision = judged["vision_ms"]
    assert (vision.label, vision.per, vision.verdict) == ("vision per page", "page", BETTER)
    assert vision.change == pytest.approx(-0.5)
    assert (
        vision.why
        == "each pass's vision time over the pages it holds (4 pages a pass in this rung, 1 page in the baseline)"
    )
    assert o.change_text(vision) == "vision per page −50%"
    decode = judged["decode_ms_per_token"]
    assert (decode.label, decode.per, decode.change) == ("decode per page-token", "page-token", pytest.approx(-0.75))
    assert judged["prefill_ms"].per == "page"
    ttft = judged["ttft_ms"]
    assert (ttft.label, ttft.per, ttft.verdict) == ("time to first token", None, WORSE)  # a page waits for its batch
    assert judged["page_latency_ms"].per is None and judged["pages_per_s"].per is None
    assert o.tradeoffs(tuple(judged.values()), None) == (
        "pages/s +144% and decode per page-token −75%, but whole-page latency +64% and time to first token +224%",
    )  # pages/s is quoted beside whole-page latency: at other pages a pass one no longer sets the other
    assert judgement_text(vision) == "per page −50% better"
    within = Speedup(value=1.0, ci95_low=None, ci95_high=None, ci_method=None, verdict="within noise")
    assert w.helped_by_parts("ttft_ms", within, (vision, judged["prefill_ms"])) == ()
    same = {j.objective: j for j in o.judge(base, base, None, None)}
    assert same["vision_ms"].label == "vision" and same["vision_ms"].per is None  # one page a pass each: per pass


def test_a_near_total_saving_never_reads_minus_100_percent() -> None:
    assert o.change_text(_j("decode_ms_per_token", BETTER, -0.9977)) == "decode −99.8%"
    assert o.change_text(_j("decode_ms_per_token", BETTER, -0.5)) == "decode −50%"
    assert o.change_text(_j("pages_per_s", BETTER, 0.9996)) == "pages/s +100%"
    assert judgement_text(_j("decode_ms_per_token", BETTER, -0.9977)) == "−99.8% better"


def test_memory_over_the_budget_or_far_above_the_baseline_is_flagged() -> None:
    memory = _j("peak_memory_gib", WORSE, 41.6 / 7.1 - 1, base=7.1)
    flags = o.tradeoffs((memory,), 40.0)
    assert flags == (
        "peak memory 41.6 GiB is over the 40 GiB budget (whatif.memory_budget_gib)",
        "peak memory 41.6 GiB is 5.9× the baseline's 7.1 GiB (flagged above 1.5×)",
    )
    assert o.tradeoffs((_j("peak_memory_gib", WORSE, 0.2, base=7.1),), None) == ()
    assert o.tradeoffs((), 5.0, peak_gib=7.1) == (
        "peak memory 7.1 GiB is over the 5 GiB budget (whatif.memory_budget_gib)",
    )


def test_a_bad_memory_budget_is_one_paragraph() -> None:
    assert memory_budget(None) is None and memory_budget("40") == 40.0
    for bad in (-1, 0, "lots", True, "nan", "inf"):  # a boolean would otherwise read as a budget of 1 GiB
        with pytest.raises(UserError, match=r"memory_budget_gib=.* is not a positive number of GiB"):
            memory_budget(bad)


# --------------------------------------------------------------------------------------------- goals


def _rung(name: str, *judged: Judgement, workload: bool = False) -> Rung:
    return Rung(name, ALONE, (name,), (), workload, MEASURED, judgements=judged)


def _analysis(rungs: list[Rung], levers: tuple[Lever, ...] = (), objective: str = "page_latency") -> WhatIfAnalysis:
    """The judging of rungs given as judged (no folders: their verdicts stand as they are)."""
    return WhatIfAnalysis(WhatIfSettings(objective=objective), levers, rungs, {})


def _goals_rungs() -> list[Rung]:
    base = Rung("baseline", BASELINE, (), (), False, MEASURED)
    graphs = _rung(
        "cuda_graphs",
        _j("page_latency_ms", BETTER, -0.8),
        _j("ttft_ms", WORSE, 1.3),
        _j("pages_per_s", BETTER, 4.0, base=1.0),
        _j("peak_memory_gib", SAME, 0.01, base=7.0),
    )
    vision = _rung(
        "fast_vision",
        _j("page_latency_ms", BETTER, -0.1),
        _j("ttft_ms", BETTER, -0.5),
        _j("pages_per_s", BETTER, 0.1, base=1.0),
        _j("peak_memory_gib", SAME, 0.0, base=7.0),
    )
    slow = _rung(
        "slow",
        _j("page_latency_ms", WORSE, 0.2),
        _j("ttft_ms", SAME, 0.1),
        _j("pages_per_s", WORSE, -0.2, base=1.0),
        _j("peak_memory_gib", SAME, 0.0, base=7.0),
    )
    tiles = _rung("fewer_tiles", _j("page_latency_ms", BETTER, -0.95), workload=True)
    return [base, graphs, vision, slow, tiles]


def test_the_best_rung_per_goal_and_the_frontier() -> None:
    rungs = _goals_rungs()
    best = {c.goal: c for c in o.best_per_goal(rungs, 256)}
    assert best["page_latency"].rung == "cuda_graphs" and best["page_latency"].value == pytest.approx(20.0)
    assert best["page_latency"].label == "whole-page latency at 256 decode tokens"
    assert best["first_token"].rung == "fast_vision"
    assert best["throughput"].rung == "cuda_graphs"
    assert best["memory"].rung == "baseline" and best["memory"].why == "no rung beat the baseline"
    # slow is beaten by the baseline; the baseline by fast_vision; the workload-changing rung is left out
    assert o.frontier(rungs) == ("cuda_graphs", "fast_vision")


def test_a_rung_that_ran_as_the_baseline_did_says_so_and_is_never_a_best_choice() -> None:
    """`model.experts_implementation=grouped_mm` where transformers already picks grouped_mm (the H100 decode preset,
    2026-11-26: 901 kernels per step either way, yet 0.75x "within noise"): the rung is named a no-op, its verdict
    says so, and no goal or frontier names it; a lever that took effect, or sets an unrecorded key, is not."""
    base = load_stage1(Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1").metrics
    assert base.model.experts_implementation == "grouped_mm"
    same = w.no_effective_change(("model.experts_implementation=grouped_mm",), base, base)
    assert same is not None and "the baseline already ran experts grouped_mm" in same and "noise" in same
    runtime = w.no_effective_change(("runtime.kv_cache=dynamic",), base, base)
    assert runtime is not None and base.settings.runtime.label in runtime
    batched = attrs.evolve(base, model=attrs.evolve(base.model, experts_implementation="batched_mm"))
    assert w.no_effective_change(("model.experts_implementation=batched_mm",), base, batched) is None
    static = attrs.evolve(
        base, settings=attrs.evolve(base.settings, runtime=attrs.evolve(base.settings.runtime, kv_cache="static"))
    )
    assert w.no_effective_change(("runtime.kv_cache=static",), base, static) is None
    assert w.no_effective_change(("model.mode=tiny",), base, base) is None  # not recorded as built: unknown
    assert w.no_effective_change((), base, base) is None

    noop = attrs.evolve(_rung("experts_grouped_mm", _j("page_latency_ms", BETTER, -0.5)), no_change=same)
    rungs = [*_goals_rungs(), noop]
    assert all(c.rung != "experts_grouped_mm" for c in o.best_per_goal(rungs, 256))
    assert "experts_grouped_mm" not in o.frontier(rungs)
    gain = Speedup(value=1.33, ci95_low=0.9, ci95_high=1.8, ci_method="t", verdict="within noise")
    line = verdict_line(attrs.evolve(noop, speedup=gain), 5)
    assert line == f"experts_grouped_mm: 1.33× (within noise); no change: {same}"


def test_a_no_op_rung_whose_outputs_depart_shows_the_baseline_does_not_repeat() -> None:
    """The H100 example: experts_grouped_mm ran as the baseline did and still departed at token 18, as every lever
    did: the notes say a departure from token 18 on is the baseline's own run-to-run spread."""
    from llm_perf_opt.records.whatif import OutputAgreement

    departs = OutputAgreement(inputs=1, first_departure=18, compared_tokens=32, prefill_logits_max_abs_diff=0.0)
    same = attrs.evolve(_rung("experts_grouped_mm"), outputs=departs, no_change="the baseline already ran it")
    lever = attrs.evolve(_rung("static_cache"), outputs=departs)
    (note,) = unrepeatable_outputs([lever, same])
    assert note.startswith("experts_grouped_mm ran as the baseline did, yet its outputs depart at generated token 18")
    assert "at or after token 18 says nothing about a lever" in note
    assert unrepeatable_outputs([lever]) == []  # no rung ran as the baseline did: nothing to say
    assert "(near-tied logits, as random weights give)" in note  # no top-two pass: the likely cause, said as such
    from llm_perf_opt.records.whatif import NearTie

    tied = attrs.evolve(departs, near_tie=NearTie(token=18, gap=0.015625, top_logit=3.17, tolerance=0.01))
    (shown,) = unrepeatable_outputs([lever, attrs.evolve(same, outputs=tied)])
    assert "(a near-tie: the baseline's top two logits there 0.0156 apart, 0.49% of the top logit" in shown


def test_a_goal_no_rung_could_be_judged_on_says_so() -> None:
    rungs = [Rung("baseline", BASELINE, (), (), False, MEASURED), _rung("x", _j("ttft_ms", NOT_JUDGED, None))]
    best = {c.goal: c for c in o.best_per_goal(rungs, None)}
    assert best["first_token"].rung is None and best["first_token"].why == "no rung could be judged on it"
    assert best["page_latency"].label == "whole-page latency"


# --------------------------------------------------------------------------------------------- the setting


def test_the_objective_setting_picks_the_headline_goal(tmp_path: Path) -> None:

    def goal(*overrides: str) -> Objective:
        cfg = compose_config("whatif", *overrides)
        return WhatIfAnalysis(judging_settings(command_config(cfg), whatif_nodes(cfg)), (), (), {}).goal()

    assert goal().name == "page_latency_ms"
    assert goal("whatif.objective=first_token").name == "ttft_ms"
    assert goal("workload=ocr1-a4-page").label == "whole-page latency at 256 decode tokens (p50)"
    assert workload_decode_tokens(command_config(compose_config("whatif"))) == (None, None)
    with pytest.raises(UserError) as bad:
        whatif_run(compose_config("whatif", "whatif.objective=speed"), tmp_path / "d", "d")
    text = str(bad.value)
    assert "whatif.objective=speed is not known" in text
    assert all(name in text for name in (*w.GOAL_FIGURES, "decode_ms_per_token"))


def test_an_unknown_objective_ends_perf_whatif_with_exit_2(tmp_path: Path) -> None:
    run = run_main("llm_perf_opt.cli.whatif", "whatif.objective=speed", f"hydra.run.dir={tmp_path / 'w'}")
    assert run.returncode == 2, run.stderr
    assert "whatif.objective=speed is not known" in run.stderr and "page_latency" in run.stderr
    assert "Traceback" not in run.stderr


# --------------------------------------------------------------------------------------------- whatif.md


def test_whatif_md_shows_no_machine_specific_path() -> None:
    resolved = "dataset.subset_filelist=/work/main/src/llm_perf_opt/data/samples/lists/a4_page.txt"
    assert clean_paths(resolved) == "dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt"
    assert clean_paths("dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt").endswith("}/lists/a4_page.txt")
    assert clean_paths("model.path=/home/me/ckpt/deepseek-ocr") == "model.path=…/ckpt/deepseek-ocr"
    assert clean_paths("run.repeats=3") == "run.repeats=3"
    record = attrs.evolve(realistic(), workload_overrides=(resolved, "hydra.run.dir=/tmp/x/y"))
    md = whatif_md(record)
    assert "/work/main" not in md and "/tmp/x" not in md and "${llo_samples_dir:}/lists/a4_page.txt" in md
    assert "/work/" not in (EXAMPLE / "whatif.md").read_text()


def test_the_example_report_flags_its_trade_offs() -> None:
    md = (EXAMPLE / "whatif.md").read_text()
    assert "**Trade-off**: decode −93% and whole-page latency −73%, but warm-up/compile +45.4 s" in md
    assert "peak memory 41.6 GiB is 5.9× the baseline's 7.1 GiB" in md
    assert "## Every objective against the baseline" in md and "### Best rung per goal" in md
    record = load_whatif(EXAMPLE)
    assert record.frontier == ("cuda_graphs",) and record.decode_tokens == 32
    batched = record.rung("experts_batched_mm")
    assert batched is not None and (ttft := batched.judgement("ttft_ms")) is not None and ttft.verdict == WORSE


def test_a_record_written_before_per_objective_verdicts_loads_and_renders(tmp_path: Path) -> None:
    data = json.loads(io.dumps(realistic()))
    for key in ("decode_tokens", "decode_tokens_source", "memory_budget_gib", "best_per_goal", "frontier"):
        data.pop(key)
    for rung in data["rungs"]:
        rung.pop("judgements")
        rung.pop("tradeoffs")
    (tmp_path / "whatif.json").write_text(json.dumps(data))
    old = load_whatif(tmp_path)
    assert isinstance(old, WhatIfRecord) and old.best_per_goal == () and all(not r.judgements for r in old.rungs)
    md = whatif_md(old)
    assert "Not judged per objective: this record holds no per-objective verdicts" in md
    assert "### Best rung per goal" not in md and "## Rungs, ranked" in md


def test_levers_whose_outputs_depart_stay_off_the_ladder_with_the_reason() -> None:
    from llm_perf_opt.measure.whatif import outputs_departure
    from llm_perf_opt.records.whatif import OutputAgreement

    same = OutputAgreement(inputs=1, first_departure=None, compared_tokens=32, prefill_logits_max_abs_diff=0.02)
    departed = OutputAgreement(inputs=1, first_departure=7, compared_tokens=32, prefill_logits_max_abs_diff=0.02)
    assert outputs_departure(same, None) is None
    assert "token 7 of 32" in (outputs_departure(departed, None) or "")
    assert "0.02" in (outputs_departure(same, 0.01) or "") and outputs_departure(same, 0.05) is None
    assert "not compared" in (outputs_departure(None, None) or "")
    # Where the baseline's own outputs stop repeating (a rung that changed nothing departed at token 7), a later
    # or equal departure is within the baseline's run-to-run spread; an earlier one is not.
    assert outputs_departure(departed, None, repeats_until=7) is None
    assert outputs_departure(departed, None, repeats_until=9) is not None
    assert "up to token 9, where the baseline's stop repeating" in (outputs_departure(departed, None, 9) or "")
    assert "0.02" in (outputs_departure(departed, 0.01, repeats_until=7) or "")  # the logit tolerance still holds


def test_the_ladder_compares_outputs_up_to_where_the_baseline_stops_repeating(tmp_path: Path) -> None:
    """The H100 decode preset with random weights: every lever departed at token 18, and so did experts_grouped_mm,
    which changed nothing; the ladder then takes the levers that departed at or after 18, not those before."""
    from llm_perf_opt.records.whatif import OutputAgreement

    def outputs(token: int | None) -> OutputAgreement:
        return OutputAgreement(inputs=1, first_departure=token, compared_tokens=32, prefill_logits_max_abs_diff=0.0)

    noop = attrs.evolve(_rung("experts_grouped_mm"), outputs=outputs(18), no_change="the baseline already ran it")
    graphs = attrs.evolve(_rung("cuda_graphs"), outputs=outputs(18))
    early = attrs.evolve(_rung("attn_eager"), outputs=outputs(5))
    assert _analysis([noop, graphs, early]).departure("cuda_graphs") is None
    assert "token 5 of 32" in (_analysis([noop, graphs, early]).departure("attn_eager") or "")
    # without a rung that changed nothing: identical or nothing
    assert "token 18 of 32" in (_analysis([graphs, early]).departure("cuda_graphs") or "")


def test_a_lever_that_changed_nothing_is_never_stacked_and_its_gain_is_called_host_drift(tmp_path: Path) -> None:
    """The H100 run of 2026-11-26: experts_grouped_mm ran as the baseline did yet measured 1.34x "beyond noise" (the
    host slowed between the two processes), and the ladder stacked it on cuda_graphs. Now it stays off the ladder
    with the reason, is not called helped, and the notes name the drift."""
    from llm_perf_opt.measure.noise import BEYOND
    from llm_perf_opt.records.whatif import OutputAgreement

    faster = Speedup(value=1.34, ci95_low=1.18, ci95_high=1.5, ci_method="t", verdict=BEYOND)
    graphs_gain = Speedup(value=3.6, ci95_low=3.16, ci95_high=4.7, ci_method="t", verdict=BEYOND)
    departs = OutputAgreement(inputs=1, first_departure=18, compared_tokens=32, prefill_logits_max_abs_diff=0.0)
    levers = (
        Lever("cuda_graphs", ("runtime.kv_cache=static", "runtime.compile=decode")),
        Lever("experts_grouped_mm", ("model.experts_implementation=grouped_mm",)),
    )
    graphs = attrs.evolve(_rung("cuda_graphs"), speedup=graphs_gain, outputs=departs)
    noop = attrs.evolve(
        _rung("experts_grouped_mm"), speedup=faster, outputs=departs, no_change="the baseline already ran it"
    )
    base = Rung("baseline", BASELINE, (), (), False, MEASURED)
    analysis = _analysis([base, graphs, noop], levers)
    plan = analysis.ladder_plan()
    assert plan is not None and [step.levers for step in plan.steps] == [("cuda_graphs",)]
    assert dict(plan.left_out)["experts_grouped_mm"] == "the baseline already ran it"
    verdicts = {v.lever: v for v in analysis.verdicts()}
    assert verdicts["cuda_graphs"].helped and not verdicts["experts_grouped_mm"].helped
    assert analysis.host_drift() == w.HostDrift("experts_grouped_mm", 1.34)
    (note,) = [n for n in analysis.notes() if "host's pace" in n]
    assert note.startswith("experts_grouped_mm ran as the baseline did, yet measured 1.34× the baseline (beyond noise)")
    assert not any("host's pace" in n for n in _analysis([base, graphs], levers).notes())


def test_a_gain_no_larger_than_the_measured_host_drift_is_not_stacked() -> None:
    """The H100 `whatif=decode` run of 2026-11-27 (13:35): the baseline's process ran slow (eager decode 31.7 ms/token
    against 15–20 in the other runs), experts_grouped_mm, which changed nothing, measured 1.55× (95% CI 1.37–1.64),
    and the ladder stacked experts_batched_mm (1.29×, CI 1.07–1.52) on cuda_graphs + attn_eager: a 33 s rung for a
    gain the drift explains. Now a lever is stacked only when its gain's lower 95% bound is above the drift (the
    parts' gain for a lever stacked through its parts); the others stay off with the reason."""
    from llm_perf_opt.measure.noise import BEYOND, WITHIN
    from llm_perf_opt.records.whatif import OutputAgreement

    def gain(value: float, low: float, high: float, verdict: str = BEYOND) -> Speedup:
        return Speedup(value=value, ci95_low=low, ci95_high=high, ci_method="t", verdict=verdict)

    same = OutputAgreement(inputs=1, first_departure=None, compared_tokens=32, prefill_logits_max_abs_diff=0.0)
    levers = (
        Lever("cuda_graphs", ("runtime.compile=decode",)),
        Lever("experts_grouped_mm", ("model.experts_implementation=grouped_mm",)),
        Lever("experts_batched_mm", ("model.experts_implementation=batched_mm",)),
        Lever("attn_eager", ("model.attn_implementation=eager",)),
        Lever("vision_graphs", ("runtime.compile_vision=reduce-overhead",)),
    )
    small_part = attrs.evolve(_j("decode_ms_per_token", BETTER, -0.3), ci95_low=0.6, ci95_high=0.8)
    rungs = [
        attrs.evolve(_rung("cuda_graphs"), speedup=gain(3.69, 3.13, 4.01)),
        attrs.evolve(_rung("experts_grouped_mm"), speedup=gain(1.55, 1.37, 1.64), no_change="the baseline ran it"),
        attrs.evolve(_rung("experts_batched_mm"), speedup=gain(1.29, 1.07, 1.52)),
        attrs.evolve(_rung("attn_eager"), speedup=gain(1.90, 1.57, 2.02)),
        attrs.evolve(_rung("vision_graphs", small_part), speedup=gain(1.1, 0.9, 1.3, WITHIN)),
    ]
    analysis = _analysis(
        [Rung("baseline", BASELINE, (), (), False, MEASURED), *(attrs.evolve(r, outputs=same) for r in rungs)], levers
    )
    drift = analysis.host_drift()
    assert drift == w.HostDrift("experts_grouped_mm", 1.55) and drift.factor == 1.55
    assert w.host_drift([attrs.evolve(rungs[1], speedup=gain(0.5, 0.4, 0.6))]) == w.HostDrift("experts_grouped_mm", 0.5)
    assert w.host_drift(rungs[:1]) is None
    plan = analysis.ladder_plan()
    assert plan is not None and [step.levers for step in plan.steps] == [
        ("cuda_graphs",),
        ("cuda_graphs", "attn_eager"),
    ]
    left = dict(plan.left_out)
    assert left["experts_batched_mm"] == (
        "its gain, 1.07× at least by the 95% interval, is no larger than the host's drift between processes (1.55×, "
        "measured by experts_grouped_mm, which ran as the baseline did)"
    )
    assert left["vision_graphs"].startswith("its parts' gain (decode −30%), 1.25× at least by the 95% interval")
    assert plan.stacked_by_parts == ()
    assert o.within_drift(rungs[2].speedup, (), None) is None  # without a measured drift, a gain beyond noise stacks


def test_outputs_are_judged_up_to_where_the_baseline_stops_repeating() -> None:
    """With a rung that changed nothing departing at token 18, a lever departing at 18 is judged the same on outputs
    (and flags no output loss), one departing at 5 stays worse; without such a rung nothing changes."""
    from llm_perf_opt.records.whatif import OutputAgreement

    def departing(name: str, token: int, **kwargs: object) -> Rung:
        outputs = OutputAgreement(inputs=1, first_departure=token, compared_tokens=32, prefill_logits_max_abs_diff=0.0)
        judged = (_j("decode_ms_per_token", BETTER, -0.9), o.judge_outputs(outputs))
        rung = attrs.evolve(_rung(name, *judged), outputs=outputs, **kwargs)
        return attrs.evolve(rung, tradeoffs=o.tradeoffs(rung.judgements, None))

    graphs, early = departing("cuda_graphs", 18), departing("attn_eager", 5)
    assert graphs.tradeoffs == ("decode −90%, but outputs depart at token 18 of 32",)
    noop = departing("experts_grouped_mm", 18, no_change="the baseline already ran it")
    floored = _analysis([graphs, early, noop]).rungs()
    outputs = floored["cuda_graphs"].judgement("outputs")
    assert outputs is not None and outputs.verdict == SAME
    assert outputs.why == "depart at token 18 of 32, where the baseline's own outputs no longer repeat (from token 18)"
    assert floored["cuda_graphs"].tradeoffs == ()
    early_outputs = floored["attn_eager"].judgement("outputs")
    assert early_outputs is not None and early_outputs.verdict == WORSE
    assert _analysis([graphs, early]).rungs() == {"cuda_graphs": graphs, "attn_eager": early}


def test_the_rung_table_shows_joules_per_decode_token_and_notes_name_their_rungs() -> None:
    record = realistic()
    energy = _j("joules_per_decode_token", BETTER, -0.5, base=2.0)
    memory = attrs.evolve(_j("memory_pass_peak_gib", SAME, 0.0, base=7.0), why="one peak; this rung at decode")
    other = attrs.evolve(memory, why="one peak; this rung at prefill")
    measured = [r for r in record.rungs if r.phase != BASELINE and r.state == MEASURED]
    assert len(measured) >= 2
    rungs = {
        measured[0].name: attrs.evolve(measured[0], judgements=(energy, memory)),
        measured[1].name: attrs.evolve(measured[1], judgements=(other,)),
    }
    record = attrs.evolve(record, rungs=tuple(rungs.get(r.name, r) for r in record.rungs))
    md = whatif_md(record)
    header = next(line for line in md.splitlines() if line.startswith("|rung|phase|"))
    assert "|J per decode token|" in header
    baseline_row = next(line for line in md.splitlines() if line.startswith("|baseline|"))
    assert "|2.000|" in baseline_row
    assert f"memory-pass peak ({measured[0].name}): one peak; this rung at decode" in md
    assert f"memory-pass peak ({measured[1].name}): one peak; this rung at prefill" in md


def test_a_lever_that_shortened_a_part_of_the_first_token_is_stacked_after_those_that_helped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H100 runs of 2026-11-27 (`whatif=tuning`, objective first token, preprocessing on the host): compiled
    vision cut vision 64–65% and prefill 43–46% beyond noise, but the first token only within noise (205 → 156 ms in
    one run, 192 → 204 ms in the next: the host's preprocessing is that figure's noise), so the ladder stopped at
    gpu_preprocess. Now a lever whose objective moved within noise and that shortened a part beyond noise, lengthening
    none, is stacked after the levers that helped; one with a part worse is not, nor one slower beyond noise, and the
    notes say why each was stacked."""
    from llm_perf_opt.measure.noise import BEYOND, WITHIN
    from llm_perf_opt.records.whatif import LADDER, OutputAgreement

    def gain(value: float, verdict: str) -> Speedup:
        return Speedup(value=value, ci95_low=None, ci95_high=None, ci_method=None, verdict=verdict)

    parts = (_j("vision_ms", BETTER, -0.64), _j("prefill_ms", BETTER, -0.43))
    run = whatif_run(compose_config("whatif", "whatif.objective=first_token"), tmp_path)
    run.levers = (
        Lever("gpu_preprocess", ("model.preprocess.device=cuda",)),
        Lever("vision_graphs", ("runtime.compile_vision=reduce-overhead",)),
        Lever("vision_max_autotune", ("runtime.compile_vision=max-autotune",)),
        Lever("sam_flex", ("model.sam_attention=flex",)),
        Lever("slower", ("model.seed=3",)),
    )
    rungs = [
        attrs.evolve(_rung("gpu_preprocess", _j("ttft_ms", BETTER, -0.58)), speedup=gain(2.39, BEYOND)),
        attrs.evolve(_rung("vision_graphs", _j("ttft_ms", SAME, 0.06), *parts), speedup=gain(0.94, WITHIN)),
        attrs.evolve(_rung("vision_max_autotune", _j("ttft_ms", SAME, 0.1), *parts), speedup=gain(0.91, WITHIN)),
        attrs.evolve(
            _rung("sam_flex", _j("vision_ms", BETTER, -0.2), _j("prefill_ms", WORSE, 0.1)), speedup=gain(1.1, WITHIN)
        ),
        attrs.evolve(_rung("slower", _j("ttft_ms", WORSE, 0.3), *parts), speedup=gain(0.77, BEYOND)),
    ]
    same = OutputAgreement(inputs=1, first_departure=None, compared_tokens=32, prefill_logits_max_abs_diff=0.0)
    rungs = [attrs.evolve(r, outputs=same) for r in rungs]
    run.rungs = {"baseline": Rung("baseline", BASELINE, (), (), False, MEASURED)} | {r.name: r for r in rungs}
    plan = run._analysis().ladder_plan()
    assert plan is not None
    assert w.helped_by_parts("ttft_ms", rungs[1].speedup, rungs[1].judgements) == parts
    assert w.helped_by_parts("decode_ms_per_token", rungs[1].speedup, rungs[1].judgements) == ()  # no parts
    planned: list[tuple[str, ...]] = []
    monkeypatch.setattr(run, "_execute", lambda phase, plans, *_: planned.extend(p.rung.levers for p in plans))
    run._ladder()  # the pipeline schedules the ladder the analysis plans
    assert run.rungs["ladder-1-gpu_preprocess"].phase == LADDER
    assert planned == [("gpu_preprocess", "vision_graphs")]  # the best part-helped lever; its rival conflicts
    assert "runtime.compile_vision" in dict(plan.left_out)["vision_max_autotune"]
    assert [name for name, _ in plan.stacked_by_parts] == ["vision_graphs"]
    notes = [n for n in run._analysis().notes() if "stacked on the ladder after" in n]
    assert notes == [
        "vision_graphs is stacked on the ladder after the levers that helped: its time to first token (p50) moved "
        "only within noise, but its vision −64% and prefill −43% beyond noise, with no part worse."
    ]

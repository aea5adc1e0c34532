"""stage1-run with run.batch_size > 1 (tiny DeepSeek-OCR v1 on the CPU): per-input and per-batch records, a short last
batch said, outputs equal to batch 1, FLOPs counted on the batch (padding included, matching the analytic batch
model), MFU per batch pass, the report's Batches section, the sweep's throughput–latency curve, the routing heatmap;
bad batch sizes and a UserError after measuring."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_perf_opt.analytic.dense import DenseSpec
from llm_perf_opt.analytic.dense import batch_stage_costs as dense_batch_costs
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.flops import count_stage_flops
from llm_perf_opt.measure.aggregate import batch_summary
from llm_perf_opt.measure.sweep import job_figures, summarize
from llm_perf_opt.measure.whatif import objective, rung_figures
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.pipeline.stage1_render import render
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import Stage1Folder, load_stage1
from llm_perf_opt.records.stage1 import BatchRecord, Stage1Metrics
from llm_perf_opt.records.sweep import SweepJob
from llm_perf_opt.report.plots import routing_hits
from llm_perf_opt.report.sweep_report import sweep_markdown, throughput_latency_plot
from llm_perf_opt.session import process_state
from llm_perf_opt.session.session import InferenceSession

#: Runs the console scripts in child processes (seconds to a minute each).
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
# Sorted names: batch 0 = a 0-tile and a 2-tile page (different prompt lengths: left padding), batch 1 = one page.
PAGES = {"a_small.png": "small", "b_two_tiles.png": "two_tiles", "c_square.png": "square700"}
RUN = (
    "model=deepseek_ocr_tiny",
    "device=cpu",
    "run.repeats=2",
    "run.warmup=0",
    "infer.max_new_tokens=3",
    "dataset.max_images=all",
    "dataset.sampling=sorted",
    "pipeline.torch_profiler.enable=false",
)


@pytest.fixture(scope="module")
def pages(page_images: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch_pages")
    for name, source in PAGES.items():
        shutil.copy(page_images[source], root / name)
    return root


def run_stage1(folder: Path, pages: Path, *overrides: str) -> Stage1Folder:
    """stage1-run in-process into `folder` with RUN's settings, `overrides` replacing those of the same key."""
    keys = {o.split("=", 1)[0] for o in overrides}
    base = [o for o in RUN if o.split("=", 1)[0] not in keys]
    cfg = compose_config("stage1", *base, f"dataset.root={pages}", *overrides)
    with pytest.MonkeyPatch.context() as patch:  # a process of its own, as stage1-run is (it keeps first passes)
        patch.setattr(process_state, "_jobs_started", 0)
        Stage1Run(command_config(cfg), folder, run_id=folder.name).execute()
    return load_stage1(folder)


@pytest.fixture(scope="module")
def batch2(pages: Path, tmp_path_factory: pytest.TempPathFactory) -> Stage1Folder:
    return run_stage1(tmp_path_factory.mktemp("runs") / "b2", pages, "run.batch_size=2", "run.warmup=1")


@pytest.fixture(scope="module")
def batch1(pages: Path, tmp_path_factory: pytest.TempPathFactory) -> Stage1Folder:
    return run_stage1(tmp_path_factory.mktemp("runs") / "b1", pages)


def test_every_input_and_every_batch_pass_is_recorded(batch2: Stage1Folder) -> None:
    m = batch2.metrics
    assert m.settings.batch_size == 2 and m.settings.runtime.batch_size == 2
    assert m.images == tuple(PAGES)
    assert [(r.image, r.repeat) for r in m.records] == [
        ("a_small.png", 0), ("b_two_tiles.png", 0), ("a_small.png", 1), ("b_two_tiles.png", 1),
        ("c_square.png", 0), ("c_square.png", 1),
    ]  # fmt: skip
    assert [(b.batch, b.repeat, b.size) for b in m.batches] == [(0, 0, 2), (0, 1, 2), (1, 0, 1), (1, 1, 1)]
    first = m.batches[0]
    assert first.images == ("a_small.png", "b_two_tiles.png")
    small, tiles = (next(r for r in m.records if r.image == i and r.repeat == 0) for i in first.images)
    assert small.prompt_tokens != tiles.prompt_tokens  # left-padded to the longest
    assert first.padded_prompt_tokens == max(small.prompt_tokens, tiles.prompt_tokens)
    # every input of a batch waits for the batch: its TTFT and decode are the batch's; its vision is its own
    assert small.decode_ms == tiles.decode_ms == first.decode_ms
    assert small.ttft_ms == tiles.ttft_ms == first.preprocess_ms + first.prefill_ms
    assert small.vision_ms[vocab.VISION_SAM] + tiles.vision_ms[vocab.VISION_SAM] == pytest.approx(
        first.vision_ms[vocab.VISION_SAM]
    )
    steps = len(first.decode_step_ms)
    assert first.aggregate_decode_tokens_per_s == pytest.approx(2 * steps / first.decode_ms * 1e3)
    assert first.experts_hit_per_step is not None and 1 <= first.experts_hit_per_step <= 4  # top-2 of 8, 2 tokens


def test_each_input_keeps_its_share_of_its_batchs_first_pass(batch2: Stage1Folder) -> None:
    """The first warm-up pass of each batch gives each of its inputs a first pass, as the timed passes give each its
    share of theirs (the batch's preprocessing, prefill and decode; its own vision), outside the timed records."""
    m = batch2.metrics
    assert [r.image for r in m.first_passes] == list(PAGES)
    small, tiles, square = m.first_passes
    assert small.decode_ms == tiles.decode_ms != square.decode_ms  # the first batch's decode, then the second's
    assert small.vision_ms != tiles.vision_ms  # each its own vision
    assert len(m.records) == 2 * len(PAGES)  # the timed passes only
    assert "|e2e|first pass e2e|" in (batch2.path / "report.md").read_text()


def test_the_short_last_batch_runs_and_is_said(batch2: Stage1Folder) -> None:
    m = batch2.metrics
    summary = m.batch_summary
    assert summary is not None
    assert (summary.batch_size, summary.batches, summary.short_last_batch, summary.passes) == (2, 2, 1, 2)
    assert summary.aggregate_decode_tokens_per_s is not None and summary.aggregate_decode_tokens_per_s.n == 2
    assert summary.aggregate_decode_tokens_per_s.ci95_low is None  # no interval from 2 values
    assert any("last batch holds 1 input(s), fewer than run.batch_size=2" in w for w in m.warnings)
    assert m.routing is not None and m.routing.tokens_per_step == 2  # the full batches only


def test_outputs_equal_the_batch_1_run(batch2: Stage1Folder, batch1: Stage1Folder) -> None:
    assert batch1.metrics.batches == () and batch1.metrics.batch_summary is None
    assert [(p.image, p.token_ids) for p in batch2.predictions] == [(p.image, p.token_ids) for p in batch1.predictions]
    checks = [r.output_check for r in batch2.metrics.records]
    assert all(c is not None and c.identical_tokens for c in checks)


def test_batch_flops_count_the_batch_padding_included(batch2: Stage1Folder) -> None:
    """Vision runs per input: the batch's vision FLOPs are the inputs' alone. The decoder runs over the padded batch:
    its prefill counts the padding positions, so it exceeds the inputs' counts alone when prompts differ in length;
    a batch of one is the input alone."""
    per_image, per_batch = batch2.metrics.flops_per_image, batch2.metrics.flops_per_batch
    both = [per_image["a_small.png"], per_image["b_two_tiles.png"]]
    batch = per_batch["batch 0"]
    for stage in (vocab.VISION_SAM, vocab.VISION_CLIP, vocab.VISION_PROJECTOR):
        assert batch[stage] == sum(f[stage] for f in both) > 0
    assert batch[vocab.PREFILL] > sum(f[vocab.PREFILL] for f in both)
    assert batch[vocab.DECODE] > sum(f[vocab.DECODE] for f in both)  # every step attends the padded prompt
    assert per_batch["batch 1"] == per_image["c_square.png"]


def test_mfu_and_bytes_are_per_batch_pass(batch2: Stage1Folder) -> None:
    """Batch FLOPs over batch time (per-input FLOPs over the batch's time would count the time once per input)."""
    m = batch2.metrics
    mfu = m.mfu_of(vocab.PREFILL)
    assert mfu is not None
    assert mfu.time_total_ms == pytest.approx(sum(b.prefill_ms for b in m.batches))
    assert mfu.flops_total == pytest.approx(sum(m.flops_per_batch[b.cost_key][vocab.PREFILL] for b in m.batches))
    decode = m.efficiency_of(vocab.DECODE)
    assert decode is not None and decode.time_ms == pytest.approx(sum(b.decode_ms for b in m.batches))
    assert m.batch_summary is not None and (m.batch_summary.decode_experts or "").startswith("measured")


def test_report_shows_the_batches(batch2: Stage1Folder) -> None:
    report = (batch2.path / "report.md").read_text()
    assert "3 image(s) in batches of 2 × 2 timed pass(es)" in report
    assert "## Batches" in report and "|1|c_square.png|1 (short)|" in report
    assert "Aggregate decode:" in report and "per input, batch 2" in report
    assert "![Experts hit per MoE layer over the timed decode steps](plots/routing_hits.png)" in report
    assert (batch2.path / "plots" / "routing_hits.png").stat().st_size > 0
    summary = (batch2.path / "stakeholder_summary.md").read_text()
    assert "Batch size 2 (the last batch 1)" in summary and "Aggregate decode:" in summary


def test_batch_reports_rebuild_from_the_records(batch2: Stage1Folder) -> None:
    before = (batch2.path / "report.md").read_text()
    render(batch2.path)
    assert (batch2.path / "report.md").read_text() == before


def test_batch_1_reports_have_no_batch_section(batch1: Stage1Folder) -> None:
    report = (batch1.path / "report.md").read_text()
    assert "## Batches" not in report and "in batches of" not in report
    assert "(decode steps / decode time, batch 1)" in report


def _job(num: int, size: str, metrics: Stage1Metrics) -> SweepJob:
    overrides = {"model": "deepseek_ocr_tiny", "run.batch_size": size}
    return SweepJob(
        num=num, folder=str(num), swept={}, overrides=overrides, status="complete", metrics=job_figures(metrics)
    )


def test_a_batch_size_sweep_gives_the_throughput_latency_curve(
    batch1: Stage1Folder, batch2: Stage1Folder, tmp_path: Path
) -> None:
    summary = summarize(tmp_path, [_job(0, "2", batch2.metrics), _job(1, "1", batch1.metrics)])
    assert summary.swept_keys == ("run.batch_size",)
    points = summary.throughput_latency
    assert [(p.batch_size, p.job) for p in points] == [(1, 1), (2, 0)]
    one, two = points
    assert one.aggregate_decode_tokens_per_s == one.per_input_decode_tokens_per_s
    assert two.aggregate_decode_tokens_per_s == pytest.approx(2 * two.per_input_decode_tokens_per_s)
    assert batch2.metrics.batch_summary and batch2.metrics.batch_summary.aggregate_decode_tokens_per_s
    assert two.aggregate_decode_tokens_per_s == batch2.metrics.batch_summary.aggregate_decode_tokens_per_s.p50
    plot = throughput_latency_plot(summary, tmp_path / "throughput_latency.png")
    assert plot is not None and plot.stat().st_size > 0
    text = sweep_markdown(summary, None, plot.name)
    assert "## Throughput against latency (run.batch_size)" in text
    assert "![per-input against aggregate decode tokens/s by batch size](throughput_latency.png)" in text


def test_other_sweeps_have_no_curve(batch1: Stage1Folder, tmp_path: Path) -> None:
    jobs = [_job(0, "1", batch1.metrics), attrs_evolve_overrides(_job(1, "1", batch1.metrics))]
    summary = summarize(tmp_path, jobs)
    assert summary.throughput_latency == ()
    assert throughput_latency_plot(summary, tmp_path / "curve.png") is None
    assert "Throughput against latency" not in sweep_markdown(summary, None)


def attrs_evolve_overrides(job: SweepJob) -> SweepJob:
    import attrs

    return attrs.evolve(job, overrides={"model": "deepseek_ocr_tiny", "run.batch_size": "1", "run.repeats": "3"})


def test_no_routing_record_no_heatmap(batch1: Stage1Folder, tmp_path: Path) -> None:
    import attrs

    assert routing_hits(batch1.metrics, tmp_path / "hits.png") is not None
    assert routing_hits(attrs.evolve(batch1.metrics, routing=None), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def _batch(index: int, size: int, decode_ms: float) -> BatchRecord:
    return BatchRecord(
        batch=index, repeat=0, images=tuple(f"p{index}_{i}" for i in range(size)), preprocess_ms=1.0, prefill_ms=2.0,
        vision_ms={}, decode_ms=decode_ms, decode_step_ms=(decode_ms / 2, decode_ms / 2), new_tokens=3,
        padded_prompt_tokens=10, peak_memory_bytes=None,
    )  # fmt: skip


def test_the_batch_summary_leaves_a_short_last_batch_out_unless_no_batch_is_full() -> None:
    mixed = batch_summary([_batch(0, 4, 10.0), _batch(1, 4, 20.0), _batch(2, 4, 30.0), _batch(3, 1, 1.0)], 4, None)
    assert mixed is not None and (mixed.batches, mixed.short_last_batch, mixed.passes) == (4, 1, 3)
    assert mixed.decode_step_ms is not None and mixed.decode_step_ms.p50 == 10.0  # the full batches' steps only
    assert mixed.decode_step_ms.ci95_low is not None  # 3 passes: an interval
    alone = batch_summary([_batch(0, 3, 10.0)], 4, None)
    assert alone is not None and (alone.short_last_batch, alone.passes) == (3, 1)
    assert batch_summary([], 4, None) is None


# ---- FLOPs counted on a batch against the analytic batch model -----------------------------------------------
def _counted_against_analytic(session: InferenceSession, paths: list[Path]) -> tuple[Any, Any, int]:
    prepared = [session.prepare(p) for p in paths]
    counted = count_stage_flops(session, prepared)
    costs = session.adapter.analytic_batch_costs(session.model, prepared, 3, session.dtype.itemsize)
    assert costs is not None
    return counted, costs, max(p.prompt_tokens for p in prepared)


def test_v1_batch_flops_equal_the_analytic_batch_model(compose_model: Any, page_images: dict[str, Path]) -> None:
    """Padded positions are computed like tokens: the counted batch equals the analytic model of the padded batch."""
    session = InferenceSession.load(compose_model("model=deepseek_ocr_tiny"), CPU)
    counted, costs, padded = _counted_against_analytic(session, [page_images["small"], page_images["two_tiles"]])
    assert counted.prompt_tokens == padded
    assert counted.prefill == costs[vocab.PREFILL].matmul_flops
    for stage in session.vision_stages:
        assert counted.vision[stage] == costs[stage].matmul_flops
    assert counted.decode_total(3) == costs[vocab.DECODE].matmul_flops


def test_dense_batch_flops_equal_the_analytic_batch_model(tmp_path: Path) -> None:
    session = InferenceSession.load(compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model, CPU)
    prompts = []
    for i, words in enumerate((5, 40)):
        prompts.append(tmp_path / f"p{i}.txt")
        prompts[-1].write_text(" ".join(["word"] * words))
    counted, costs, padded = _counted_against_analytic(session, prompts)
    assert counted.prefill == costs[vocab.PREFILL].matmul_flops
    assert counted.decode_total(3) == costs[vocab.DECODE].matmul_flops
    spec = DenseSpec.from_config(session.model.config)
    assert spec is not None
    alone = dense_batch_costs(spec, [padded], 3, 4)[vocab.DECODE]

    def weights(cost: Any) -> float:  # the embedding reads one row per token; every other weight once per step
        return sum(m.weight_bytes for m in cost.modules if m.name != "embed_tokens")

    assert weights(costs[vocab.DECODE]) == weights(alone)
    assert costs[vocab.DECODE].kv_bytes == pytest.approx(2 * alone.kv_bytes)  # each sequence reads its own cache


# ---- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["0", "-3"])
def test_a_batch_size_below_1_fails_before_the_model_is_built(
    size: str, tmp_path: Path, pages: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(InferenceSession, "load", never)
    cfg = compose_config("stage1", *RUN, f"dataset.root={pages}", f"run.batch_size={size}")
    with pytest.raises(UserError, match=rf"run\.batch_size={size}") as info:
        Stage1Run(command_config(cfg), tmp_path / "run", run_id="bad").execute()
    assert info.value.exit_code == 2 and "run.batch_size" in info.value.fix
    status = json.loads((tmp_path / "run" / "run_status.json").read_text())
    assert status["state"] == "failed" and f"run.batch_size={size}" in status["message"]


def test_a_user_error_after_measuring_keeps_what_was_measured(
    tmp_path: Path, pages: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = InferenceSession.run_image
    calls = {"n": 0}

    def fails_on_second(self: InferenceSession, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # one timed pass of the first input, then this
            raise UserError("the second timed pass met bad input", "Fix the input")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(InferenceSession, "run_image", fails_on_second)
    cfg = compose_config("stage1", *RUN, f"dataset.root={pages}")
    with pytest.raises(UserError, match="bad input"):
        Stage1Run(command_config(cfg), tmp_path / "run", run_id="late").execute()
    status = json.loads((tmp_path / "run" / "run_status.json").read_text())
    assert status["state"] == "failed" and "bad input" in status["message"]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["settings"]["partial"] is True
    assert (metrics["settings"]["measured_passes"], metrics["settings"]["asked_passes"]) == (1, 6)
    assert "did not finish" in (tmp_path / "run" / "report.md").read_text()


# ---- on a GPU -----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_run_on_a_gpu_has_memory_mbu_and_the_speed_of_light(pages: Path, tmp_path: Path) -> None:
    """Peak memory per batch pass, and MFU/MBU/speed of light of the batch against the GPU's peaks; outputs of the
    batch (fp32) equal the inputs alone."""
    folder = run_stage1(
        tmp_path / "gpu", pages, "device=cuda", "model.dtype=float32", "run.batch_size=2", "runtime.output_check=always"
    )
    m = folder.metrics
    assert m.batch_summary is not None and (m.batch_summary.peak_memory_bytes or 0) > 0
    assert all(b.peak_memory_bytes for b in m.batches)
    decode = m.efficiency_of(vocab.DECODE)
    assert decode is not None and decode.mbu is not None and decode.speed_of_light_ms is not None
    assert decode.time_ms == pytest.approx(sum(b.decode_ms for b in m.batches))
    prefill = m.mfu_of(vocab.PREFILL)
    assert prefill is not None and prefill.mfu is not None
    assert all(r.output_check is not None and r.output_check.identical_tokens for r in m.records)
    assert "## Batches" in (folder.path / "report.md").read_text()


def test_the_whatif_pages_objective_is_the_runs_pages_figure(batch2: Stage1Folder) -> None:
    """Batch 2 over 3 pages (a short last batch of 1): the what-if's pages/s objective, its rung's pages/s and per-page
    p90 latencies are `Stage1Metrics.pages`' own (the short batch left out of every one)."""
    pages = batch2.metrics.pages
    assert pages is not None and pages.batch_size == 2 and pages.pages_per_s.n == 2  # 2 repeats of the full batch
    measured = rung_figures(batch2, objective("throughput"))
    assert measured.objective == pages.pages_per_s
    assert measured.pages_per_s == pages.pages_per_s.p50
    assert (measured.ttft_p90_ms, measured.ttlt_p90_ms) == (pages.ttft_ms.p90, pages.ttlt_ms.p90)

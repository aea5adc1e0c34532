"""The profiled pass stays bounded at large batches (`pipeline.torch_profiler.max_vision_inputs`): a batch's other
inputs are embedded before the profiler starts, the bound is recorded in operators.json and the run's settings and
said in the reports; and stage1-run counts FLOPs once per distinct input shape (tiny models on the CPU)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.instruments import flops
from llm_perf_opt.instruments.torch_profiler import profile_image
from llm_perf_opt.measure import stage_flops
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.records.stage1 import OperatorTable
from llm_perf_opt.session import compiled
from llm_perf_opt.session.runtime import RuntimeSettings

#: Builds a model and runs the pipeline in-process (seconds to a minute).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pages(page_images: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sorted: a white page, a noisy page of the same size, a page with two tiles."""
    root = tmp_path_factory.mktemp("bound_pages")
    shutil.copy(page_images["small"], root / "a_white.png")
    size = Image.open(page_images["small"]).size
    pixels = np.random.default_rng(1).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "b_noisy.png")
    shutil.copy(page_images["two_tiles"], root / "c_tiles.png")
    return root


def _profile(session: Any, paths: list[Path], max_vision_inputs: int) -> OperatorTable:
    off = {"record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False}
    return profile_image(session, paths, decode_steps=1, trace_path=None, max_vision_inputs=max_vision_inputs, **off)


def _calls(table: OperatorTable, stage: str) -> int:
    return sum(row.calls for row in table.by_stage.get(stage, ()))


def test_a_bounded_pass_profiles_the_vision_of_its_first_inputs_only(tiny_session: Any, pages: Path) -> None:
    paths = [pages / "a_white.png", pages / "b_noisy.png", pages / "a_white.png"]  # one shape: equal vision work
    every = _profile(tiny_session, paths, 0)
    bounded = _profile(tiny_session, paths, 1)
    assert (every.inputs, every.vision_inputs, every.bound_text()) == (3, None, None)
    assert (bounded.inputs, bounded.vision_inputs) == (3, 1)
    assert "the vision of 1 of the batch's 3 inputs was profiled" in (bounded.bound_text() or "")
    vision = [stage for stage in every.by_stage if vocab.is_vision(stage)]
    assert vision
    for stage in vision:
        assert _calls(bounded, stage) * 3 == _calls(every, stage) > 0
    # the decoder's prefill and decode steps are the whole batch's either way
    assert _calls(bounded, vocab.DECODE) == _calls(every, vocab.DECODE) > 0
    # a bound at or above the batch, or one input, changes nothing
    assert _profile(tiny_session, paths, 3).vision_inputs is None
    assert _profile(tiny_session, paths[:1], 1).vision_inputs is None


def test_stage1_run_records_the_bound_and_counts_flops_once_per_shape(
    pages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    counted: list[Any] = []
    count = flops.count_stage_flops

    def counting(session: Any, prepared: Any) -> stage_flops.StageFlops:
        counted.append(prepared)
        return count(session, prepared)

    monkeypatch.setattr(flops, "count_stage_flops", counting)
    cfg = compose_config(
        "stage1",
        "model=deepseek_ocr_tiny",
        "device=cpu",
        "run.repeats=1",
        "run.warmup=0",
        "infer.max_new_tokens=3",
        "dataset.max_images=all",
        "dataset.sampling=sorted",
        f"dataset.root={pages}",
        "run.batch_size=3",
        "pipeline.torch_profiler.decode_steps=1",
        "pipeline.torch_profiler.max_vision_inputs=1",
        "report.render=true",
    )
    with caplog.at_level("INFO"):
        Stage1Run(command_config(cfg), tmp_path / "run", run_id="run").execute()
    folder = load_stage1(tmp_path / "run")
    # the first page counted, the noisy one reusing its count; the tiled page and the batch priced by the analytic
    # model where it equalled the first count (one count run), else counted too (three)
    priced = any("c_tiles.png: FLOPs priced by the analytic model" in r.message for r in caplog.records)
    assert len(counted) == (1 if priced else 3)
    assert any("b_noisy.png: reused the FLOP count of a_white.png (same shapes)" in r.message for r in caplog.records)
    per_image = folder.metrics.flops_per_image
    assert per_image["a_white.png"] == per_image["b_noisy.png"] != per_image["c_tiles.png"]
    assert folder.operators is not None
    assert (folder.operators.inputs, folder.operators.vision_inputs) == (3, 1)
    assert folder.metrics.settings.profiler is not None
    assert folder.metrics.settings.profiler.max_vision_inputs == 1
    report = (tmp_path / "run" / "report.md").read_text()
    operators = (tmp_path / "run" / "operators.md").read_text()
    for text in (report, operators):
        assert "The vision of 1 of the batch's 3 inputs was profiled" in text
    assert "max_vision_inputs=1" in (tmp_path / "run" / "assumptions.md").read_text()


def test_compiled_vision_is_profiled_whole(
    tiny_session: Any, pages: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fewer inputs' views would be new shapes for compiled vision (a compile and a capture again): no bound."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "compile_function", lambda fn, *_: torch.compile(fn, backend="eager", dynamic=False))
    session = tiny_session.with_runtime(RuntimeSettings(batch_size=3, batch_vision=True, compile_vision="default"))
    paths = [pages / "a_white.png", pages / "b_noisy.png", pages / "a_white.png"]
    try:
        with caplog.at_level("INFO", logger="llm_perf_opt.instruments.torch_profiler"):
            table = _profile(session, paths, 1)
    finally:
        session.close()
        torch._dynamo.reset()
    assert (table.inputs, table.vision_inputs, table.bound_text()) == (3, None, None)
    assert "the vision of all 3 inputs (compiled vision: no bound)" in caplog.text

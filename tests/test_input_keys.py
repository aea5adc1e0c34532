"""Inputs are keyed by their path relative to the dataset root: two files of the same name in different subfolders
are two inputs, with their own timings, FLOPs, predictions and gallery thumbnails."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from helpers import run_main
from llm_perf_opt.records.folders import load_stage1


@pytest.mark.slow
def test_same_file_name_in_two_subfolders_are_two_inputs(tmp_path: Path) -> None:
    root = tmp_path / "pages"
    for sub, size in (("a", (700, 500)), ("b", (1536, 768))):  # no tiles / two tiles: different FLOPs
        (root / sub).mkdir(parents=True)
        Image.new("RGB", size, "white").save(root / sub / "page.png")
    run_dir = tmp_path / "run"
    done = run_main(  # in this process: what the run records, not the console script's process
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr2_tiny",
        f"dataset.root={root}",
        "dataset.max_images=all",
        "run.repeats=1",
        "infer.max_new_tokens=2",
        "pipeline.torch_profiler.enable=false",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    folder = load_stage1(run_dir)
    m = folder.metrics
    assert m.images == ("a/page.png", "b/page.png")
    assert set(m.flops_per_image) == {"a/page.png", "b/page.png"}
    assert m.flops_per_image["a/page.png"]["prefill"] < m.flops_per_image["b/page.png"]["prefill"]
    assert {r.image: r.tiles for r in m.records} == {"a/page.png": 0, "b/page.png": 2}
    assert {p.image: Path(p.path) for p in folder.predictions} == {
        "a/page.png": root / "a" / "page.png",
        "b/page.png": root / "b" / "page.png",
    }
    thumbs = {"viz/a__page.png", "viz/b__page.png"}
    assert all((run_dir / t).is_file() for t in thumbs)
    assert thumbs <= set(folder.status.files)  # every file the run wrote is listed

"""DeepSeek-OCR v1 without remote code: exact size, the vendor's preprocessing and token layout, the session loop.

Reference figures: ../shared/reference/deepseek-ocr-facts.md §1.3 (modes, token counts, tiling examples) and
§1.5 (parameter counts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from helpers import greedy_by_recomputation, run_main
from llm_perf_opt.config_data import plain
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration
from llm_perf_opt.models.deepseek_ocr.preprocess import (
    crop_grid,
    image_token_count,
    mode_from_config,
    preprocess,
)
from llm_perf_opt.session.session import DeepSeekOCRSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

V1_STAGES = ("vision/sam", "vision/clip", "vision/projector")
GREY = (127 / 255 - 0.5) / 0.5  # the pad colour after normalisation


@pytest.fixture(scope="module")
def v1_full_cfg(compose_model: Any) -> Any:
    return compose_model("model=deepseek_ocr")


@pytest.fixture(scope="module")
def v1_tiny_session(compose_model: Any) -> DeepSeekOCRSession:
    return DeepSeekOCRSession.load(compose_model("model=deepseek_ocr_tiny"), torch.device("cpu"))


def modes(cfg: Any) -> dict[str, Any]:
    return plain(cfg.modes)


# ---- size -------------------------------------------------------------------------------------------------
def test_full_size_parameter_counts_match_the_reference(v1_full_cfg: Any) -> None:
    config = DeepseekOcrConfig.from_architecture(plain(v1_full_cfg.architecture))
    with torch.device("meta"):
        model = DeepseekOcrForConditionalGeneration(config)

    def count(path: str) -> int:
        return sum(p.numel() for p in model.get_submodule(path).parameters())

    assert sum(p.numel() for p in model.parameters()) == 3_336_106_240
    assert count("model.sam_model") == 95_569_152
    assert count("model.vision_model") == 303_177_728
    assert count("model.vision_model.embeddings.patch_embedding") == 602_112  # in the checkpoint, never run
    assert count("model.projector") == 2_622_720
    assert model.model.image_newline.numel() + model.model.view_seperator.numel() == 2_560
    assert count("model.language_model.embed_tokens") == 165_478_400
    assert count("model.language_model") - count("model.language_model.embed_tokens") == 2_603_777_280
    assert count("lm_head") == 165_478_400


def test_inconsistent_vision_widths_are_refused(v1_full_cfg: Any) -> None:
    arch = plain(v1_full_cfg.architecture)
    arch["projector_input_dim"] = 1792
    with pytest.raises(ValueError, match="projector_input_dim"):
        DeepseekOcrForConditionalGeneration(DeepseekOcrConfig.from_architecture(arch)).to("meta")


# ---- modes and token counts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "tokens"), [("tiny", 73), ("small", 111), ("base", 273), ("large", 421)])
def test_single_view_modes_give_the_reference_token_counts(v1_full_cfg: Any, mode: str, tokens: int) -> None:
    assert image_token_count(mode_from_config(mode, modes(v1_full_cfg))) == tokens


@pytest.mark.parametrize(("grid", "tokens"), [((1, 1), 273), ((2, 3), 273 + 30 * 21), ((3, 2), 273 + 20 * 31)])
def test_gundam_token_count_formula(v1_full_cfg: Any, grid: tuple[int, int], tokens: int) -> None:
    gundam = mode_from_config("gundam", modes(v1_full_cfg))
    n_w, n_h = grid
    assert image_token_count(gundam, grid) == tokens
    if grid != (1, 1):
        assert tokens == 273 + (10 * n_h) * (10 * n_w + 1)


@pytest.mark.parametrize(
    ("size", "max_tiles", "grid"),
    [
        ((1240, 1754), 9, (2, 3)),  # A4 at 150 dpi: 6 tiles, 903 tokens
        ((2480, 3508), 9, (2, 3)),  # A4 at 300 dpi
        ((1275, 1650), 9, (2, 3)),  # Letter
        ((1920, 1080), 6, (2, 1)),  # screenshot: 2 tiles with max 6
        ((1920, 1080), 9, (4, 2)),  # 8 tiles with max 9
        ((640, 640), 9, (1, 1)),  # both sides <= 640: no tiles
        ((640, 360), 9, (1, 1)),
    ],
)
def test_crop_grid_matches_the_reference_examples(size: tuple[int, int], max_tiles: int, grid: tuple[int, int]) -> None:
    assert crop_grid(*size, tile=640, min_tiles=2, max_tiles=max_tiles) == grid


def test_a4_page_in_gundam_has_903_image_tokens(v1_full_cfg: Any) -> None:
    gundam = mode_from_config("gundam", modes(v1_full_cfg))
    views = preprocess(Image.new("RGB", (1240, 1754), "white"), gundam)
    assert views.grid == (2, 3)
    assert views.tiles is not None and tuple(views.tiles.shape) == (6, 3, 640, 640)
    assert tuple(views.global_view.shape) == (1, 3, 1024, 1024)
    assert image_token_count(gundam, views.grid) == 903


def test_small_modes_stretch_and_large_modes_pad(v1_full_cfg: Any) -> None:
    wide = Image.new("RGB", (1600, 800), "white")
    tiny = preprocess(wide, mode_from_config("tiny", modes(v1_full_cfg)))
    base = preprocess(wide, mode_from_config("base", modes(v1_full_cfg)))
    assert tuple(tiny.global_view.shape) == (1, 3, 512, 512) and tiny.tiles is None
    assert torch.allclose(tiny.global_view, torch.ones(1, 3, 512, 512))  # white everywhere: stretched
    assert tuple(base.global_view.shape) == (1, 3, 1024, 1024)
    assert torch.allclose(base.global_view[0, :, 0], torch.full((3, 1024), GREY))  # grey band above the page
    assert torch.allclose(base.global_view[0, :, 512], torch.ones(3, 1024))  # the page in the middle


def test_unknown_mode_is_a_user_error(v1_full_cfg: Any) -> None:
    with pytest.raises(UserError, match=r"model.mode=huge .*tiny, small, base, large, gundam"):
        mode_from_config("huge", modes(v1_full_cfg))


# ---- the model on the tiny config ----------------------------------------------------------------------------
def test_features_follow_the_vendor_layout(v1_tiny_session: DeepSeekOCRSession, page_images: dict[str, Path]) -> None:
    model = v1_tiny_session.model.model
    prepared = v1_tiny_session.prepare(page_images["a4"])  # Gundam, 2x3 tiles
    inputs = prepared.model_inputs
    with torch.inference_mode():
        features = model.image_features(inputs["pixel_values"], inputs["pixel_values_local"], inputs["crop_grid"])
    assert features.shape[0] == prepared.image_tokens == 903
    newline, separator = model.image_newline, model.view_seperator
    tiles_part = 30 * 21  # 30 stitched rows of 20 features + newline
    is_newline = torch.isclose(features, newline).all(-1)
    expected = torch.zeros(features.shape[0], dtype=torch.bool)
    expected[20:tiles_part:21] = True
    expected[tiles_part + 16 : tiles_part + 16 * 17 : 17] = True
    assert torch.equal(is_newline, expected)
    assert torch.equal(features[-1], separator)


@pytest.mark.slow
@pytest.mark.parametrize("page", ["small", "a4"])
def test_cached_decoding_equals_recomputing_the_whole_sequence(
    v1_tiny_session: DeepSeekOCRSession, page_images: dict[str, Path], page: str
) -> None:
    prepared = v1_tiny_session.prepare(page_images[page])
    cached = v1_tiny_session.generate(prepared, 4, StageRecorder(torch.device("cpu"), nvtx=False))
    recomputed = greedy_by_recomputation(v1_tiny_session, prepared, 4)
    assert cached == recomputed


def test_run_image_times_the_v1_vision_stages(
    v1_tiny_session: DeepSeekOCRSession, page_images: dict[str, Path]
) -> None:
    assert v1_tiny_session.vision_stages == V1_STAGES
    measured = v1_tiny_session.run_image(page_images["a4"], 3, nvtx=False)
    for stage in V1_STAGES:
        assert measured.stage_calls[stage] == 2  # the tiles, then the global view
        assert 0 < measured.stage_ms[stage] < measured.prefill_ms
    assert measured.image_tokens == 903 and measured.tiles == 6


@pytest.mark.slow
def test_stage1_run_on_the_tiny_v1_model(tmp_path: Path, page_images: dict[str, Path]) -> None:
    run_dir = tmp_path / "run"
    result = run_main(  # in this process: the console script's own process is test_stage1_cli's
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "model.mode=base",
        "device=cpu",
        f"dataset.root={page_images['a4'].parent}",
        "dataset.max_images=1",
        "infer.max_new_tokens=3",
        "pipeline/torch_profiler=min",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["model"]["adapter"] == "deepseek_ocr"
    assert metrics["model"]["preprocess"]["mode"] == "base"
    assert "random weights" in metrics["model"]["weights_detail"]
    stages = metrics["stages"] if "stages" in metrics else metrics["aggregate"]
    text = json.dumps(stages)
    for stage in V1_STAGES:
        assert stage in text
    assert (run_dir / "report.md").is_file()


@pytest.mark.slow
def test_unknown_mode_on_the_command_line_fails_cleanly(tmp_path: Path, page_images: dict[str, Path]) -> None:
    run_dir = tmp_path / "run"
    result = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "model.mode=huge",
        "device=cpu",
        f"dataset.root={page_images['a4'].parent}",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.mode=huge" in result.stderr and "Traceback" not in result.stderr
    status = json.loads((run_dir / "run_status.json").read_text())
    assert status["state"] == "failed" and "model.mode=huge" in status["message"]
    assert not (run_dir / "report.md").exists()

"""DeepSeek-OCR v1 preprocessing with torch ops (`model.preprocess.device=cuda`): its views against PIL's within the
stated pixel tolerance, the tile layout, the padding's placement, the setting's validation and the session wiring.
The torch path runs on the CPU here; the tests marked `gpu` run it on the GPU (skipped without CUDA)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from helpers import run_cli
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import plain
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.models.deepseek_ocr.device_preprocess import (
    PIXEL_TOLERANCE,
    compare_views,
    padded_view,
    page_tensor,
    preprocess_on_device,
    resize,
    tile_views,
)
from llm_perf_opt.models.deepseek_ocr.preprocess import PAD_COLOUR, Mode, Views, mode_from_config, preprocess
from llm_perf_opt.pipeline.whatif import read_levers, validate
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.session import DeepSeekOCRSession

PAGES = ("page_portrait.png", "page_landscape.png", "receipt_long.png", "slide_square.png")
MODES = ("gundam", "base", "tiny")
CPU = torch.device("cpu")
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def v1_modes() -> dict[str, Any]:
    return plain(compose_config("stage1", "model=deepseek_ocr_tiny").model.modes)


def page(name: str) -> Image.Image:
    with Image.open(bundled_samples_dir() / name) as image:
        return image.convert("RGB")


def levels(image: Image.Image) -> torch.Tensor:
    """(3, H, W) float levels of a PIL image."""
    return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1).float()


# ---- equality with PIL ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PAGES)
def test_torch_path_on_the_cpu_matches_pil_within_the_tolerance(name: str, mode: str, v1_modes: Any) -> None:
    image, chosen = page(name), mode_from_config(mode, v1_modes)
    reference = preprocess(image, chosen)
    views = preprocess_on_device(image, chosen, device=CPU)
    assert views.grid == reference.grid and views.tile_count == reference.tile_count
    assert views.global_view.dtype == torch.float32
    difference = compare_views(reference, views)
    assert difference.within(PIXEL_TOLERANCE), difference
    assert difference.values == reference.global_view.numel() + (
        0 if reference.tiles is None else reference.tiles.numel()
    )


def test_resize_matches_pil_in_both_pass_orders() -> None:
    """Shrinking the height far more than the width (Pillow 13 runs the rows first), growing, and mixed."""
    image = page("receipt_long.png").resize((288, 1100))
    for size in ((300, 300), (100, 1000), (500, 200), (640, 1280), (250, 1100), (288, 500)):
        got = resize(levels(image), *size)
        assert (got - levels(image.resize(size))).abs().max() <= 1, size


def test_padding_is_placed_as_imageops_pad_places_it() -> None:
    """Fitted and centred on grey with Python's rounding, for pages wider, taller and as wide as high."""
    rng = random.Random(3)
    for _ in range(12):
        size = (rng.randint(20, 140), rng.randint(20, 140))
        image = Image.fromarray(np.random.default_rng(rng.randint(0, 99)).integers(0, 256, (*size[::-1], 3), np.uint8))
        side = rng.choice((48, 64, 65))
        expected = levels(ImageOps.pad(image, (side, side), color=PAD_COLOUR))
        assert (padded_view(levels(image), side) - expected).abs().max() <= 1, (size, side)


def test_tiles_are_cut_row_by_row_by_one_reshape() -> None:
    """A page of 3 x 2 solid blocks at the grid's size: tile i is block i (row by row), normalised."""
    colours = [(10 * i, 20 + i, 200 - i) for i in range(6)]
    image = Image.new("RGB", (24, 16))
    for i, colour in enumerate(colours):
        image.paste(colour, ((i % 3) * 8, (i // 3) * 8, (i % 3 + 1) * 8, (i // 3 + 1) * 8))
    tiles = tile_views(levels(image), (3, 2), 8, torch.float32)
    assert tiles.shape == (6, 3, 8, 8) and tiles.is_contiguous()
    column = tile_views(torch.zeros(3, 24, 8), (1, 3), 8, torch.float32)
    assert column.shape == (3, 3, 8, 8) and column.is_contiguous()  # one column of tiles: a view, made contiguous
    for i, colour in enumerate(colours):
        expected = (torch.tensor(colour, dtype=torch.float32) / 255.0 - 0.5) / 0.5
        assert torch.equal(tiles[i], expected[:, None, None].expand(3, 8, 8))


def test_normalised_values_equal_pils_bit_for_bit_where_levels_agree() -> None:
    """A page that needs no resize (a Gundam tile grid of its own size): the same float32 values as PIL's path."""
    image = page("slide_square.png").resize((1280, 1280))
    mode = Mode(name="gundam", base_size=1280, image_size=640, crop_mode=True)
    reference, views = preprocess(image, mode), preprocess_on_device(image, mode, device=CPU)
    assert reference.tiles is not None and views.tiles is not None
    assert torch.equal(reference.tiles, views.tiles)
    assert torch.equal(reference.global_view, views.global_view)


def test_compare_views_counts_uint8_levels() -> None:
    mode = Mode(name="tiny", base_size=4, image_size=4, crop_mode=False)
    grey = torch.full((1, 3, 4, 4), (127 / 255 - 0.5) / 0.5)  # level 127
    reference = Views(mode=mode, global_view=grey, tiles=None, grid=(1, 1))
    moved = reference.global_view.clone()
    moved[0, 0, 0, 0] += 3 * 2 / 255  # 3 levels
    moved[0, 1, 0, 0] -= 2 / 255  # 1 level
    difference = compare_views(reference, Views(mode=mode, global_view=moved.bfloat16(), tiles=None, grid=(1, 1)))
    assert (difference.max_levels, difference.values) == (3, 48)
    assert difference.beyond_one_level == pytest.approx(1 / 48)
    assert not difference.within()  # 1 value in 48 beyond one level: over the 0.1% allowed
    assert difference.within(attrs.evolve(PIXEL_TOLERANCE, beyond_one_level=0.05))
    assert not difference.within(attrs.evolve(PIXEL_TOLERANCE, max_levels=2, beyond_one_level=0.05))
    with pytest.raises(ValueError, match="view shapes differ"):
        compare_views(reference, Views(mode=mode, global_view=torch.zeros(1, 3, 4, 5), tiles=None, grid=(1, 1)))


def test_page_tensor_is_the_pages_levels() -> None:
    image = page("snippet_small.png")
    pixels = page_tensor(image, CPU)
    assert pixels.dtype == torch.float32 and pixels.is_contiguous()
    assert torch.equal(pixels, levels(image))


# ---- the setting -------------------------------------------------------------------------------------------------
def test_the_default_is_the_pil_path_and_is_recorded(compose_model: Any) -> None:
    adapter = make_adapter(compose_model("model=deepseek_ocr_tiny"))
    adapter.bind_device(CPU, torch.float32)
    assert adapter.preprocess.device == "cpu" and adapter.preprocess_target is None
    assert adapter.preprocess_settings()["device"] == "cpu"


def test_an_unknown_preprocess_device_is_one_user_error(compose_model: Any) -> None:
    with pytest.raises(UserError, match=r"model\.preprocess\.device=gpu is not a place to preprocess pages") as e:
        make_adapter(compose_model("model=deepseek_ocr_tiny", "model.preprocess.device=gpu"))
    assert "model.preprocess.device=cpu" in str(e.value)


def test_cuda_preprocessing_on_a_cpu_run_is_refused_before_building(compose_model: Any) -> None:
    cfg = compose_model("model=deepseek_ocr", "model.preprocess.device=cuda")  # full size: refused before building
    with pytest.raises(UserError, match=r"model\.preprocess\.device=cuda .* this run's device is cpu") as e:
        DeepSeekOCRSession.load(cfg, CPU)
    assert "device=cuda" in str(e.value)


def test_views_made_on_the_device_are_not_copied_again(compose_model: Any) -> None:
    """The adapter bound to a device makes the views there (here the CPU, as a GPU run binds its GPU); moving the
    prepared inputs to that device and dtype keeps the very same tensors."""
    adapter = make_adapter(compose_model("model=deepseek_ocr_tiny"))
    image = page("slide_square.png")
    reference = adapter.prepare(image, None)
    adapter.preprocess_target = (CPU, torch.bfloat16)
    prepared = adapter.prepare(image, None)
    assert (prepared.prompt_tokens, prepared.image_tokens, prepared.tiles, prepared.views) == (
        reference.prompt_tokens,
        reference.image_tokens,
        reference.tiles,
        reference.views,
    )
    pixels = prepared.model_inputs["pixel_values"]
    assert pixels.dtype == torch.bfloat16
    moved = prepared.to(CPU, torch.bfloat16)
    assert moved.model_inputs["pixel_values"] is pixels
    assert moved.model_inputs["pixel_values_local"] is prepared.model_inputs["pixel_values_local"]


def test_the_gpu_preprocess_lever_is_a_cuda_lever_of_v1() -> None:
    levers = {lever.name: lever for lever in read_levers(compose_config("whatif", "whatif=vision").whatif.levers, [])}
    lever = levers["gpu_preprocess"]
    assert lever.overrides == ("model.preprocess.device=cuda",) and lever.needs == "cuda"
    assert validate(["model=deepseek_ocr_tiny", *lever.overrides]) is None
    assert "gpu_preprocess" in {
        lever.name for lever in read_levers(compose_config("whatif", "whatif=all").whatif.levers, [])
    }


# ---- on the GPU --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PAGES)
def test_gpu_views_match_pil_within_the_tolerance(name: str, mode: str, dtype: torch.dtype, v1_modes: Any) -> None:
    image, chosen = page(name), mode_from_config(mode, v1_modes)
    device = torch.device("cuda", torch.cuda.current_device())
    views = preprocess_on_device(image, chosen, device=device, dtype=dtype)
    assert views.global_view.device == device and views.global_view.dtype == dtype
    assert views.tiles is None or (views.tiles.device == device and views.tiles.is_contiguous())
    difference = compare_views(preprocess(image, chosen), views)
    assert difference.within(PIXEL_TOLERANCE), difference


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
def test_gpu_session_prepares_on_the_gpu_without_a_second_copy(compose_model: Any) -> None:
    cfg = compose_model("model=deepseek_ocr_tiny", "model.preprocess.device=cuda")
    session = DeepSeekOCRSession.load(cfg, torch.device("cuda", 0))
    image = bundled_samples_dir() / "page_portrait.png"
    prepared = session.prepare(image)
    pixels = prepared.model_inputs["pixel_values"]
    assert pixels.device == session.device and pixels.dtype == session.dtype == torch.bfloat16
    assert prepared.to(session.device, session.dtype).model_inputs["pixel_values"] is pixels
    assert prepared.tiles == 6 and prepared.image_tokens == 903  # 2 x 3 tiles, as the PIL path cuts them
    assert session.run_image(image, 2).preprocess_ms > 0


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
def test_stage1_run_with_gpu_preprocessing_completes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "device=cuda",
        "model.preprocess.device=cuda",
        "run.repeats=2",
        "infer.max_new_tokens=4",
        "dataset.max_images=2",
        f"hydra.run.dir={out}",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"]["preprocess"]["device"] == "cuda"
    assert all(r["preprocess_ms"] > 0 for r in metrics["records"])

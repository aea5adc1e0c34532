"""DeepSeek-OCR-2's views made with torch ops (models/deepseek_ocr2_views.py, `model.preprocess.device=cuda`) against
transformers' PIL image processor: the same shapes and tiles, pixels within the stated tolerance (run on the CPU
here; the GPU runs the same code)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image
from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil

from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.models.deepseek_ocr.device_preprocess import PIXEL_TOLERANCE, view_difference
from llm_perf_opt.models.deepseek_ocr2_views import ocr2_views
from llm_perf_opt.session.adapters.registry import make_adapter

CPU = torch.device("cpu")
PAGES = ("page_portrait.png", "page_landscape.png", "receipt_long.png", "slide_square.png", "snippet_small.png")


def _page(name: str) -> Image.Image:
    with Image.open(bundled_samples_dir() / name) as image:
        return image.convert("RGB")


@pytest.mark.parametrize("name", PAGES)
@pytest.mark.parametrize(("crop", "max_tiles"), [(True, 6), (True, 2), (False, 6)])
def test_views_match_the_pil_processor(name: str, crop: bool, max_tiles: int) -> None:
    image = _page(name)
    processor = DeepseekOcr2ImageProcessorPil(
        size={"height": 1024, "width": 1024}, tile_size=768, crop_to_patches=crop, min_patches=2, max_patches=max_tiles
    )
    reference = processor(image, return_tensors="pt")
    views = ocr2_views(
        image, global_size=1024, tile_size=768, crop_to_patches=crop, min_tiles=2, max_tiles=max_tiles, device=CPU
    )
    assert views.tile_count == int(reference["num_local_patches"][0])
    local = reference.get("pixel_values_local")
    assert (views.tiles is None) == (local is None)
    difference = view_difference([(reference["pixel_values"], views.global_view), (local, views.tiles)])
    assert difference.within(PIXEL_TOLERANCE), difference
    assert views.global_view.shape == (1, 3, 1024 if crop else 768, 1024 if crop else 768)


def test_views_come_in_the_asked_dtype() -> None:
    views = ocr2_views(
        _page("page_portrait.png"),
        global_size=1024,
        tile_size=768,
        crop_to_patches=True,
        min_tiles=2,
        max_tiles=6,
        device=CPU,
        dtype=torch.bfloat16,
    )
    assert views.tiles is not None and views.tiles.is_contiguous()
    assert views.global_view.dtype == views.tiles.dtype == torch.bfloat16


def test_the_adapter_prepares_the_same_prompt_from_either_path(compose_model: Any) -> None:
    pil = make_adapter(compose_model("model=deepseek_ocr2_tiny"))
    pil.bind_device(CPU, torch.float32)
    assert pil.preprocess.device == "cpu" and pil.preprocess_target is None
    torch_ops = make_adapter(compose_model("model=deepseek_ocr2_tiny", "model.preprocess.device=cuda"))
    torch_ops.preprocess_target = (CPU, torch.float32)  # the GPU path's code, on the CPU
    image = _page("page_portrait.png")
    expected, got = pil.prepare(image, None), torch_ops.prepare(image, None)
    assert (got.prompt_tokens, got.image_tokens, got.tiles, got.views) == (
        expected.prompt_tokens,
        expected.image_tokens,
        expected.tiles,
        expected.views,
    )
    assert torch.equal(got.model_inputs["input_ids"], expected.model_inputs["input_ids"])
    assert got.model_inputs["num_local_patches"] == expected.model_inputs["num_local_patches"] == [6]
    pairs = [(expected.model_inputs[k], got.model_inputs[k]) for k in ("pixel_values", "pixel_values_local")]
    assert view_difference(pairs).within(PIXEL_TOLERANCE)


def test_cuda_preprocessing_needs_a_gpu_run_and_a_known_device(compose_model: Any) -> None:
    adapter = make_adapter(compose_model("model=deepseek_ocr2_tiny", "model.preprocess.device=cuda"))
    with pytest.raises(UserError, match=r"model\.preprocess\.device=cuda .* this run's device is cpu"):
        adapter.bind_device(CPU, torch.float32)
    with pytest.raises(UserError, match=r"model\.preprocess\.device=tpu is not a place to preprocess pages"):
        make_adapter(compose_model("model=deepseek_ocr2_tiny", "model.preprocess.device=tpu"))

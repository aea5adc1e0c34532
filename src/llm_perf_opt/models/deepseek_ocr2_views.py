"""DeepSeek-OCR-2 preprocessing with torch ops on the model's device (`model.preprocess.device=cuda`).

The views transformers' `DeepseekOcr2ImageProcessorPil` makes, made with v1's PIL-exact primitives
(:mod:`llm_perf_opt.models.deepseek_ocr.device_preprocess`), within its `PIXEL_TOLERANCE` of the PIL processor's
views (tests/test_device_preprocess_ocr2.py): tiles in the grid transformers picks (`get_optimal_tiled_canvas`);
the global view scaled so that its longer side is the global size, pasted on grey as `pad_to_square` does.
"""

from __future__ import annotations

import attrs
import torch
from PIL import Image
from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import get_optimal_tiled_canvas

from llm_perf_opt.models.deepseek_ocr.device_preprocess import normalise, on_grey, page_tensor, resize, tile_views


@attrs.frozen
class Ocr2Views:
    """One page's views: the global view (1, 3, S, S) and the tiles (n, 3, T, T) or None, in the model's dtype."""

    global_view: torch.Tensor
    tiles: torch.Tensor | None

    @property
    def tile_count(self) -> int:
        return 0 if self.tiles is None else int(self.tiles.shape[0])


def ocr2_views(
    image: Image.Image,
    *,
    global_size: int,
    tile_size: int,
    crop_to_patches: bool,
    min_tiles: int,
    max_tiles: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Ocr2Views:
    """The page's views as `DeepseekOcr2ImageProcessorPil` makes them, with the pixel work on `device`."""
    pixels = page_tensor(image, device)
    width, height = image.size
    tiles = None
    if crop_to_patches and max(width, height) > tile_size:
        across, down = get_optimal_tiled_canvas((height, width), (tile_size, tile_size), min_tiles, max_tiles)
        tiles = tile_views(pixels, (across, down), tile_size, dtype)
    side = global_size if crop_to_patches else tile_size
    scale = side / max(width, height)
    fit_width, fit_height = round(width * scale), round(height * scale)
    square = max(fit_width, fit_height)
    left, top = (0, (square - fit_height) // 2) if fit_width > fit_height else ((square - fit_width) // 2, 0)
    canvas = on_grey(resize(pixels, fit_width, fit_height), square, left, top)
    return Ocr2Views(global_view=normalise(canvas, dtype)[None], tiles=tiles)

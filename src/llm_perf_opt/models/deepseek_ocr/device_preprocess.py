"""DeepSeek-OCR v1 preprocessing with torch ops on the model's device (``model.preprocess.device=cuda``).

The page is decoded by PIL on the host and copied once, as uint8, to the device; there the views are made as
:func:`~llm_perf_opt.models.deepseek_ocr.preprocess.preprocess` makes them with PIL: antialiased bicubic resizes
(a = -0.5) in two separable passes, each rounded and clamped to 8 bit, in PIL's order; grey padding centred as
``ImageOps.pad`` places it; the tiles cut as one reshape; normalisation straight to the model's dtype. The pixels
match PIL's within :data:`PIXEL_TOLERANCE` (PIL resamples with fixed-point weights, torch in float). The same code
runs on the CPU (tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from PIL import __version__ as pillow_version

from llm_perf_opt.models.deepseek_ocr.preprocess import NO_TILES, PAD_COLOUR, Mode, Views, crop_grid

# Pillow 13 runs the vertical pass first when the height shrinks by more than twice the width's shrink (in pixels);
# earlier versions always run the horizontal pass first (libImaging/Resample.c, ImagingResampleInner).
VERTICAL_FIRST_RULE = int(pillow_version.split(".")[0]) >= 13


@attrs.frozen
class PixelTolerance:
    """How far the device path's views may be from PIL's, in uint8 levels."""

    max_levels: int  # largest |difference| of any value
    beyond_one_level: float  # largest share of values more than one level apart


#: Measured on the four bundled pages in every mode (CPU, torch 2.13, Pillow 13): at most 2 levels apart, at most
#: 6.1e-7 of the values beyond 1 level (a handful per page). The margin covers the GPU's other summation order.
PIXEL_TOLERANCE = PixelTolerance(max_levels=3, beyond_one_level=0.001)


@attrs.frozen
class ViewDifference:
    """The device path's views against the PIL path's, in uint8 levels over every value of every view."""

    max_levels: int
    beyond_one_level: float  # share of values more than one level apart
    values: int

    def within(self, tolerance: PixelTolerance = PIXEL_TOLERANCE) -> bool:
        return self.max_levels <= tolerance.max_levels and self.beyond_one_level <= tolerance.beyond_one_level


def page_tensor(image: Image.Image, device: torch.device) -> torch.Tensor:
    """The page's RGB levels as (3, H, W) float32 on `device`, copied there as uint8 (pinned, to a GPU)."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    array = np.asarray(rgb)  # (H, W, 3) uint8, read-only: copied once below
    if device.type == "cuda":
        host = torch.empty(array.shape, dtype=torch.uint8, pin_memory=True)
        host.numpy()[...] = array
        pixels = host.to(device, non_blocking=True)
    else:
        pixels = torch.from_numpy(array.copy())
    return pixels.permute(2, 0, 1).to(torch.float32, memory_format=torch.contiguous_format)


def _resample(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """One antialiased bicubic pass, rounded half up and clamped to uint8 levels (PIL's ``clip8``)."""
    out = F.interpolate(pixels[None], size=(height, width), mode="bicubic", antialias=True, align_corners=False)[0]
    return out.add_(0.5).floor_().clamp_(0, 255)


def vertical_first(in_width: int, in_height: int, width: int, height: int) -> bool:
    """Whether the installed Pillow resamples the rows before the columns for this resize."""
    shrink = in_height - height
    return VERTICAL_FIRST_RULE and shrink > 0 and shrink > (in_width - width) * 2


def resize(pixels: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(3, H, W) levels resized as PIL's ``resize(BICUBIC)``: one 8-bit pass per axis that changes, in PIL's order."""
    in_height, in_width = (int(n) for n in pixels.shape[-2:])
    if (width, height) == (in_width, in_height):
        return pixels
    first = (height, in_width) if vertical_first(in_width, in_height, width, height) else (in_height, width)
    for step in (first, (height, width)):
        if tuple(pixels.shape[-2:]) != step:
            pixels = _resample(pixels, *step)
    return pixels


def normalise(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Levels to [-1, 1] as the PIL path computes it in float32 (mean = std = 0.5), then in `dtype`."""
    return ((pixels / 255.0 - 0.5) / 0.5).to(dtype)


def contain_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``ImageOps.contain``'s size for a page fitted into side x side (aspect ratio kept, Python's rounding)."""
    ratio = width / height
    if ratio > 1:
        return side, round(height / width * side)
    if ratio < 1:
        return round(width / height * side), side
    return side, side


def padded_view(pixels: torch.Tensor, side: int) -> torch.Tensor:
    """``ImageOps.pad(page, (side, side), color=PAD_COLOUR)``: fitted, then centred on grey (levels)."""
    height, width = pixels.shape[-2:]
    fit_width, fit_height = contain_size(width, height, side)
    if (fit_width, fit_height) == (side, side):
        return resize(pixels, side, side)
    if min(fit_width, fit_height) == 0:
        return on_grey(pixels[:, :0, :0], side, 0, 0)  # PIL pastes an empty image
    left, top = round((side - fit_width) * 0.5), round((side - fit_height) * 0.5)
    return on_grey(resize(pixels, fit_width, fit_height), side, left, top)


def on_grey(pixels: torch.Tensor, side: int, left: int, top: int) -> torch.Tensor:
    """(3, h, w) levels pasted at (left, top) on a side x side square of the padding grey (levels)."""
    colour = torch.tensor(PAD_COLOUR, dtype=pixels.dtype, device=pixels.device)
    canvas = colour[:, None, None].expand(3, side, side).clone()
    height, width = pixels.shape[-2:]
    canvas[:, top : top + height, left : left + width] = pixels
    return canvas


def tile_views(pixels: torch.Tensor, grid: tuple[int, int], tile: int, dtype: torch.dtype) -> torch.Tensor:
    """The page resized to the grid and cut into (n_w * n_h, 3, T, T) tiles, row by row: one reshape."""
    across, down = grid
    page = normalise(resize(pixels, across * tile, down * tile), dtype)
    tiles = page.view(3, down, tile, across, tile).permute(1, 3, 0, 2, 4).reshape(down * across, 3, tile, tile)
    return tiles.contiguous()  # one column of tiles reshapes to a view: the model gets contiguous tiles either way


def preprocess_on_device(
    image: Image.Image,
    mode: Mode,
    *,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    min_tiles: int = 2,
    max_tiles: int = 9,
) -> Views:
    """`preprocess.preprocess` with the pixel work on `device`: the same views, as `dtype` tensors there."""
    pixels = page_tensor(image, device)
    if not mode.crop_mode:
        side = mode.image_size
        view = resize(pixels, side, side) if side <= 640 else padded_view(pixels, side)  # Tiny/Small stretch
        return Views(mode=mode, global_view=normalise(view, dtype)[None], tiles=None, grid=NO_TILES)
    grid = crop_grid(image.width, image.height, tile=mode.image_size, min_tiles=min_tiles, max_tiles=max_tiles)
    tiles = None if grid == NO_TILES else tile_views(pixels, grid, mode.image_size, dtype)
    global_view = normalise(padded_view(pixels, mode.base_size), dtype)[None]
    return Views(mode=mode, global_view=global_view, tiles=tiles, grid=grid)


def _levels(values: torch.Tensor) -> torch.Tensor:
    """Normalised values back to integer uint8 levels (exact from float32 and bfloat16 alike)."""
    return torch.round((values.detach().to("cpu", torch.float32) + 1) * 127.5).to(torch.int16)


def compare_views(reference: Views, candidate: Views) -> ViewDifference:
    """`candidate` (the device path's views) against `reference` (PIL's) in uint8 levels: the largest difference
    and the share of values more than one level apart. Views of other shapes or grids raise ValueError."""
    if reference.grid != candidate.grid:
        raise ValueError(f"crop grids differ: {reference.grid} vs {candidate.grid}")
    return view_difference([(reference.global_view, candidate.global_view), (reference.tiles, candidate.tiles)])


def view_difference(pairs: Sequence[tuple[torch.Tensor | None, torch.Tensor | None]]) -> ViewDifference:
    """(reference, candidate) view tensors (normalised, mean = std = 0.5) compared in uint8 levels; a pair of two
    Nones is skipped, one None or other shapes raise ValueError."""
    largest, beyond, values = 0, 0, 0
    for ref, cand in pairs:
        if ref is None and cand is None:
            continue
        if ref is None or cand is None:
            raise ValueError("one side has tiles and the other has none")
        if ref.shape != cand.shape:
            raise ValueError(f"view shapes differ: {tuple(ref.shape)} vs {tuple(cand.shape)}")
        diff = (_levels(ref) - _levels(cand)).abs()
        largest = max(largest, int(diff.max()))
        beyond += int((diff > 1).sum())
        values += diff.numel()
    return ViewDifference(max_levels=largest, beyond_one_level=beyond / values, values=values)

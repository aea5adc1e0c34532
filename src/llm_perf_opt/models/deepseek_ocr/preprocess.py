"""DeepSeek-OCR v1 preprocessing as the vendor's ``infer()`` does it: modes, Gundam crop grid, token counts.

- Tiny/Small (side <= 640): the page is resized (stretched) to the square side, Base/Large: padded to it
  (``ImageOps.pad``, grey 127), keeping the aspect ratio.
- Gundam (``crop_mode``): the global view is the page padded to ``base_size``; unless both sides are at most the
  tile side, the page is also resized to the closest-aspect grid of ``n_w x n_h`` tiles (InternVL's
  ``dynamic_preprocess``, ``min_tiles <= n_w * n_h <= max_tiles``) and cut into square tiles, row by row.
- Pixels are normalised with mean = std = 0.5 (values in [-1, 1]).
- Image tokens: a view of side S gives a g x g grid, g = ceil(S / 16 / 4), with one newline token per row; the
  tiles are stitched into one (n_h g_t) x (n_w g_t) grid with a newline per stitched row; one view separator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch
from PIL import Image, ImageOps

from llm_perf_opt.errors import UserError

PATCH = 16  # SAM patch size
DOWNSAMPLE = 4  # net_2 and net_3, stride 2 each
PAD_COLOUR = (127, 127, 127)  # int(0.5 * 255) per channel: the normalisation mean
NO_TILES = (1, 1)


@attrs.frozen
class Mode:
    """One resolution mode (the vendor README's Tiny/Small/Base/Large/Gundam)."""

    name: str
    base_size: int  # the global view's side in crop mode
    image_size: int  # the tile side in crop mode; the only view's side otherwise
    crop_mode: bool

    @property
    def global_size(self) -> int:
        return self.base_size if self.crop_mode else self.image_size


@attrs.frozen
class Views:
    """One page turned into model views."""

    mode: Mode
    global_view: torch.Tensor  # (1, 3, S, S), float32 in [-1, 1]
    tiles: torch.Tensor | None  # (n_w * n_h, 3, T, T) row by row, or None
    grid: tuple[int, int]  # (n_w, n_h); (1, 1) = no tiles

    @property
    def tile_count(self) -> int:
        return 0 if self.tiles is None else int(self.tiles.shape[0])


def mode_from_config(name: str, modes: Mapping[str, Mapping[str, Any]]) -> Mode:
    """The mode called `name` in the model config's `modes` table."""
    key = str(name).lower()
    if key not in modes:
        raise UserError(
            f"model.mode={name} is not a DeepSeek-OCR mode (known: {', '.join(modes)})",
            f"Use model.mode={'|'.join(modes)}, or add a mode under model.modes with base_size, image_size and "
            "crop_mode",
        )
    row = modes[key]
    return Mode(
        name=key, base_size=int(row["base_size"]), image_size=int(row["image_size"]), crop_mode=bool(row["crop_mode"])
    )


def grid_side(view_px: int) -> int:
    """Feature rows (= columns) of a square view: ceil(S / 16 / 4)."""
    return math.ceil(view_px / PATCH / DOWNSAMPLE)


def image_token_count(mode: Mode, grid: tuple[int, int] = NO_TILES) -> int:
    """`<image>` placeholders for one page: global rows with newlines + separator + stitched tiles with newlines."""
    g = grid_side(mode.global_size)
    count = g * (g + 1) + 1
    if grid != NO_TILES:
        across, down = grid
        t = grid_side(mode.image_size)
        count += (down * t) * (across * t + 1)
    return count


def candidate_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """(n_w, n_h) grids with min_tiles <= n_w * n_h <= max_tiles, fewest tiles first (the vendor's order)."""
    grids = {
        (i, j)
        for n in range(min_tiles, max_tiles + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_tiles <= i * j <= max_tiles
    }
    return sorted(grids, key=lambda g: g[0] * g[1])


def crop_grid(width: int, height: int, *, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """The Gundam crop grid for a page: (1, 1) when both sides fit a tile, else the closest-aspect grid (ties go to
    the larger grid when the page area exceeds half the grid's pixel area: InternVL's ``find_closest_aspect_ratio``)."""
    if width <= tile and height <= tile:
        return NO_TILES
    if not 1 <= min_tiles <= max_tiles:
        raise UserError(
            f"model.preprocess.min_tiles={min_tiles} and max_tiles={max_tiles} do not form a range of tile counts",
            "Use 1 <= min_tiles <= max_tiles (the vendor uses 2 and 9)",
        )
    aspect = width / height
    best, best_diff = NO_TILES, float("inf")
    for grid in candidate_grids(min_tiles, max_tiles):
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best


def to_tensor(image: Image.Image) -> torch.Tensor:
    """(3, H, W) float32 normalised with mean = std = 0.5."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return (torch.from_numpy(array).permute(2, 0, 1) - 0.5) / 0.5


def square_view(image: Image.Image, side: int, *, stretch: bool) -> Image.Image:
    """Stretch (Tiny/Small) or pad with grey keeping the aspect ratio (every other view) to side x side."""
    if stretch:
        image = image.resize((side, side))
    return ImageOps.pad(image, (side, side), color=PAD_COLOUR)


def cut_tiles(image: Image.Image, grid: tuple[int, int], tile: int) -> list[Image.Image]:
    """Resize the page to the grid's size and cut it into tiles, row by row."""
    across, down = grid
    resized = image.resize((across * tile, down * tile))
    return [
        resized.crop((col * tile, row * tile, (col + 1) * tile, (row + 1) * tile))
        for row in range(down)
        for col in range(across)
    ]


def preprocess(image: Image.Image, mode: Mode, *, min_tiles: int = 2, max_tiles: int = 9) -> Views:
    """One page in `mode`: the global view, the tiles (Gundam only) and the crop grid."""
    image = image.convert("RGB")
    if not mode.crop_mode:
        view = square_view(image, mode.image_size, stretch=mode.image_size <= 640)
        return Views(mode=mode, global_view=to_tensor(view)[None], tiles=None, grid=NO_TILES)
    grid = crop_grid(image.width, image.height, tile=mode.image_size, min_tiles=min_tiles, max_tiles=max_tiles)
    tiles = None if grid == NO_TILES else torch.stack([to_tensor(t) for t in cut_tiles(image, grid, mode.image_size)])
    global_view = to_tensor(square_view(image, mode.base_size, stretch=False))[None]
    return Views(mode=mode, global_view=global_view, tiles=tiles, grid=grid)

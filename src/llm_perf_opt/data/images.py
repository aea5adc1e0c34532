"""Open an input image the way the models' own loaders do: upright by its EXIF orientation (the vendor's DeepSeek-OCR
loader and transformers' `load_image` both apply `ImageOps.exif_transpose`). Every place that opens an input image
for the model (the dataset probe, the adapters, the gallery) goes through :func:`open_upright`, so sizes, tile grids
and thumbnails agree.

Scanned pages can be large (a legal page at 1,000 dpi is about 121 Mpx, above PIL's 89.5 Mpx decompression-bomb
warning threshold): they open without PIL's warning (:func:`large_page_note` says the size once instead, when the
dataset is selected); above PIL's error limit (twice the threshold) a file is skipped with the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import ExifTags, Image, ImageOps


@contextmanager
def large_pages_allowed() -> Iterator[None]:
    """Open images without PIL's DecompressionBombWarning (its error, above twice the threshold, still stands)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def large_page_note(path: Path, width: int, height: int) -> str | None:
    """One line for a page above PIL's decompression-bomb warning threshold, None for any other."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or width * height <= limit:
        return None
    return (
        f"{path.name} is a large page: {width}×{height} px ({width * height / 1e6:.3g} Mpx), above PIL's "
        f"decompression-bomb warning threshold of {limit / 1e6:.3g} Mpx; it runs as any page (PIL refuses images "
        f"above {2 * limit / 1e6:.3g} Mpx)"
    )


def stored_size(path: Path) -> tuple[int, int]:
    """Width and height from the image header, as stored (no EXIF orientation applied, pixels not decoded)."""
    with large_pages_allowed(), Image.open(path) as stored:
        return stored.size


def open_upright(path: Path) -> tuple[Image.Image, int | None]:
    """The image at `path`, loaded and upright, and the EXIF orientation tag it carried (None when it has none).

    The returned image is an in-memory copy (the file is closed); decoding errors propagate as PIL raises them.
    """
    with large_pages_allowed(), Image.open(path) as stored:
        stored.load()
        tag = stored.getexif().get(ExifTags.Base.Orientation)
        upright = ImageOps.exif_transpose(stored)
    assert upright is not None  # not in place: always a new image
    return upright, int(tag) if isinstance(tag, int) else None

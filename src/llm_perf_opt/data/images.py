"""Open an input image the way the models' own loaders do: turned upright by its EXIF orientation.

The vendor's DeepSeek-OCR loader and transformers' `load_image` both apply `ImageOps.exif_transpose` before
preprocessing, so a phone photo of a portrait page stored landscape with EXIF orientation 6 runs as a portrait
page. Every place that opens an input image for the model (the dataset probe, the adapters, the gallery) goes
through :func:`open_upright`, so sizes, tile grids and thumbnails agree.
"""

from __future__ import annotations

from pathlib import Path

from PIL import ExifTags, Image, ImageOps

#: EXIF orientations that turn or mirror the stored pixels (1 is "as stored").
TRANSPOSING = frozenset(range(2, 9))


def open_upright(path: Path) -> tuple[Image.Image, int | None]:
    """The image at `path`, loaded and upright, and the EXIF orientation tag it carried (None when it has none).

    The returned image is an in-memory copy (the file is closed); decoding errors propagate as PIL raises them.
    """
    with Image.open(path) as stored:
        stored.load()
        tag = stored.getexif().get(ExifTags.Base.Orientation)
        upright = ImageOps.exif_transpose(stored)
    assert upright is not None  # not in place: always a new image
    return upright, int(tag) if isinstance(tag, int) else None

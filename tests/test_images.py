"""Input images read as the models' own loaders read them: upright by their EXIF orientation, everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from llm_perf_opt.data.dataset import ImageEntry, select_images
from llm_perf_opt.data.images import open_upright
from llm_perf_opt.report.gallery import thumbnail_with_boxes
from llm_perf_opt.session.adapters.registry import make_adapter

RED = (255, 0, 0)
STORED = (6, 4)  # width, height as stored in the file
# Where the stored top-left pixel lands once the image is upright, per EXIF orientation (the EXIF 2.3 definitions:
# 2 mirrors left-right, 3 turns 180°, 4 mirrors top-bottom, 5 transposes, 6 turns 90° clockwise, 7 transverses,
# 8 turns 90° anticlockwise), with the upright size.
UPRIGHT: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {
    1: ((6, 4), (0, 0)),
    2: ((6, 4), (5, 0)),
    3: ((6, 4), (5, 3)),
    4: ((6, 4), (0, 3)),
    5: ((4, 6), (0, 0)),
    6: ((4, 6), (3, 0)),
    7: ((4, 6), (3, 5)),
    8: ((4, 6), (0, 5)),
}


def save_oriented(path: Path, size: tuple[int, int], orientation: int | None, colour: Any = "white") -> Path:
    """An image of `size` (as stored) with a red top-left pixel and the EXIF `orientation` tag (None: no EXIF)."""
    image = Image.new("RGB", size, colour)
    image.putpixel((0, 0), RED)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, exif=exif)
    return path


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".webp"])
@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_open_upright_applies_each_orientation(orientation: int, suffix: str, tmp_path: Path) -> None:
    path = save_oriented(tmp_path / f"o{orientation}{suffix}", STORED, orientation)
    image, tag = open_upright(path)
    size, red = UPRIGHT[orientation]
    assert tag == orientation
    assert image.size == size
    if suffix == ".png":  # lossless: the marked pixel is exactly where the orientation puts it
        assert image.convert("RGB").getpixel(red) == RED


def test_an_image_without_exif_is_as_stored(tmp_path: Path) -> None:
    image, tag = open_upright(save_oriented(tmp_path / "plain.png", STORED, None))
    assert tag is None and image.size == STORED


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_the_dataset_records_the_upright_size_and_the_orientation(orientation: int, tmp_path: Path) -> None:
    save_oriented(tmp_path / "page.jpg", (300, 200), orientation)
    (entry,) = select_images(tmp_path).images
    assert isinstance(entry, ImageEntry)
    assert (entry.width, entry.height) == ((200, 300) if orientation >= 5 else (300, 200))
    assert entry.orientation == orientation


def test_a_portrait_page_stored_landscape_gets_the_portrait_tile_grid(tmp_path: Path, compose_model: Any) -> None:
    """An A4 page photographed sideways (1754x1240 stored, EXIF orientation 6) is a 1240x1754 portrait page."""
    adapter = make_adapter(compose_model("model=deepseek_ocr"))  # v1, Gundam: no weights needed to preprocess
    rotated = adapter.prepare_file(save_oriented(tmp_path / "rotated.jpg", (1754, 1240), 6), None)
    assert rotated.model_inputs["crop_grid"] == [2, 3]  # 2 wide, 3 high: the portrait grid
    assert (rotated.tiles, rotated.image_tokens) == (6, 903)
    landscape = adapter.prepare_file(save_oriented(tmp_path / "landscape.jpg", (1754, 1240), None), None)
    assert landscape.model_inputs["crop_grid"] == [3, 2]
    assert landscape.image_tokens == 893


def test_gallery_thumbnails_are_upright(tmp_path: Path) -> None:
    source = save_oriented(tmp_path / "page.png", (600, 400), 8)
    thumb = thumbnail_with_boxes(source, None, tmp_path / "thumb.png")
    with Image.open(thumb) as image:
        assert image.width < image.height

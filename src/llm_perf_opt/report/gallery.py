"""Page thumbnails with DeepSeek-OCR grounding boxes (`<|ref|>label<|/ref|><|det|>[[x1,y1,x2,y2]]<|/det|>`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs
from PIL import ImageDraw

from llm_perf_opt.data.images import open_upright

_GROUNDING = re.compile(r"<\|ref\|>(.*?)<\|/ref\|>\s*<\|det\|>(.*?)<\|/det\|>", re.DOTALL)
_COORD_RANGE = 999  # boxes are in 0..999 page coordinates
THUMB_WIDTH = 480


@attrs.frozen
class GroundingBox:
    label: str
    x1: float
    y1: float
    x2: float
    y2: float


def parse_boxes(text: str | None) -> list[GroundingBox]:
    """Every well-formed box in `text`; malformed coordinate lists are ignored."""
    if not text:
        return []
    boxes = []
    for label, coords in _GROUNDING.findall(text):
        try:
            parsed = ast.literal_eval(coords.strip())
        except (ValueError, SyntaxError):
            continue
        for box in parsed if isinstance(parsed, list) else []:
            if isinstance(box, list | tuple) and len(box) == 4 and all(isinstance(v, int | float) for v in box):
                boxes.append(GroundingBox(label.strip(), *(float(v) for v in box)))
    return boxes


def count_boxes(text: str | None) -> int:
    return len(parse_boxes(text))


def thumbnail_with_boxes(image_path: Path, text: str | None, target: Path, width: int = THUMB_WIDTH) -> Path:
    """A `width`-pixel-wide PNG of the page with its grounding boxes drawn; returns `target`."""
    with open_upright(image_path)[0] as image:
        page = image.convert("RGB")
    scale = width / page.width
    thumb = page.resize((width, max(1, round(page.height * scale))))
    draw = ImageDraw.Draw(thumb)
    for box in parse_boxes(text):
        xy = (
            box.x1 / _COORD_RANGE * thumb.width,
            box.y1 / _COORD_RANGE * thumb.height,
            box.x2 / _COORD_RANGE * thumb.width,
            box.y2 / _COORD_RANGE * thumb.height,
        )
        draw.rectangle(xy, outline=(220, 30, 30), width=2)
        draw.text((xy[0] + 2, xy[1] + 1), box.label[:24], fill=(220, 30, 30))
    target.parent.mkdir(parents=True, exist_ok=True)
    thumb.save(target, optimize=True)
    return target

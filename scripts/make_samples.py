"""Generate the bundled sample page images in ``src/llm_perf_opt/data/samples/``.

Run by hand from the repository root::

    python scripts/make_samples.py

The output is deterministic (fixed seed, no timestamps, optimized PNG), so running it again rewrites the
same bytes. The five images have different sizes and aspect ratios so that the DeepSeek-OCR image
processor cuts a different number of 768x768 tiles for them. The script also writes ``README.md`` next to
the images, with the tile counts taken from the real transformers image processor.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

SEED = 20240611
OUT_DIR = Path(__file__).resolve().parents[1] / "src" / "llm_perf_opt" / "data" / "samples"
MAX_TOTAL_BYTES = 2 * 1024 * 1024
TILE_SIZE = 768

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by this are from at or an have not which but all "
    "were when we there can more if will one about so out up into than them only other new some could "
    "time these two may first then do any like my now over such our man me even most made after also "
    "did many before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three system model memory kernel latency throughput "
    "token image page layer attention encoder decoder vision language batch tensor cache profile "
    "document result table column figure section report measure device bandwidth compute"
)
WORDS = tuple(_WORD_TEXT.split())

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


def load_font(size: int) -> Font:
    """The Pillow default font at ``size`` px, or the fixed bitmap default on Pillow < 10.1."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: load_default() takes no size
        return ImageFont.load_default()


def sentence(rng: random.Random, n_min: int = 6, n_max: int = 16) -> str:
    """One lorem-ipsum-like English sentence."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(n_min, n_max))]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, n_sentences: int) -> str:
    """Several sentences joined into one paragraph."""
    return " ".join(sentence(rng) for _ in range(n_sentences))


def title(rng: random.Random, n_words: int) -> str:
    """A title-cased heading."""
    return " ".join(rng.choice(WORDS).capitalize() for _ in range(n_words))


def wrap(draw: ImageDraw.ImageDraw, text: str, font: Font, width: int) -> list[str]:
    """Greedy word wrap of ``text`` to lines no wider than ``width`` px."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if current and draw.textlength(candidate, font=font) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


def line_height(font: Font) -> int:
    """Line pitch in px for ``font``."""
    _, top, _, bottom = font.getbbox("Hg")
    return int((bottom - top) * 1.45) + 1


def draw_paragraph(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, font: Font, width: int) -> int:
    """Draw a wrapped paragraph at ``xy``; return the y just below it."""
    x, y = xy
    pitch = line_height(font)
    for line in wrap(draw, text, font, width):
        draw.text((x, y), line, fill=0, font=font)
        y += pitch
    return y


def draw_table(
    draw: ImageDraw.ImageDraw,
    xy: tuple[int, int],
    col_widths: Sequence[int],
    rows: Sequence[Sequence[str]],
    font: Font,
    header_font: Font,
) -> int:
    """Draw a grid table whose first row is a shaded header; return the y just below it."""
    x0, y0 = xy
    row_h = line_height(font) + 10
    total_w = sum(col_widths)
    draw.rectangle((x0, y0, x0 + total_w, y0 + row_h), fill=220)
    for r, row in enumerate(rows):
        y = y0 + r * row_h
        x = x0
        for c, cell in enumerate(row):
            draw.text((x + 6, y + 5), cell, fill=0, font=header_font if r == 0 else font)
            x += col_widths[c]
    y_end = y0 + len(rows) * row_h
    for r in range(len(rows) + 1):
        draw.line((x0, y0 + r * row_h, x0 + total_w, y0 + r * row_h), fill=0, width=2 if r <= 1 else 1)
    x = x0
    for c in range(len(col_widths) + 1):
        draw.line((x, y0, x, y_end), fill=0, width=1)
        if c < len(col_widths):
            x += col_widths[c]
    return y_end


def table_rows(rng: random.Random, n_rows: int) -> list[list[str]]:
    """A header row plus ``n_rows`` rows of a small measurement table."""
    rows = [["Item", "Stage", "Tokens", "Time (ms)", "Share"]]
    for i in range(n_rows):
        rows.append(
            [
                f"{rng.choice(WORDS).capitalize()} {i + 1}",
                rng.choice(("prefill", "decode", "vision", "encode")),
                str(rng.randint(16, 4096)),
                f"{rng.uniform(0.5, 250.0):.2f}",
                f"{rng.uniform(0.5, 40.0):.1f}%",
            ]
        )
    return rows


def page_portrait(rng: random.Random) -> Image.Image:
    """A4 page at 150 dpi: title, paragraphs, a table, more paragraphs."""
    w, h = 1240, 1754
    img = Image.new("L", (w, h), 255)
    draw = ImageDraw.Draw(img)
    body, head, big = load_font(22), load_font(24), load_font(44)
    margin = 110
    draw.text((margin, 100), title(rng, 5), fill=0, font=big)
    draw.text((margin, 165), f"Technical note {rng.randint(100, 999)}", fill=60, font=head)
    y = 230
    for _ in range(3):
        y = draw_paragraph(draw, (margin, y), paragraph(rng, 5), body, w - 2 * margin) + 22
    y = draw_table(draw, (margin, y + 10), (250, 200, 150, 180, 140), table_rows(rng, 8), body, head) + 40
    while y < h - 260:
        y = draw_paragraph(draw, (margin, y), paragraph(rng, 4), body, w - 2 * margin) + 22
    draw.text((w // 2 - 20, h - 80), "- 1 -", fill=0, font=body)
    return img


def page_landscape(rng: random.Random) -> Image.Image:
    """Landscape page: heading, two text columns, a table spanning the width."""
    w, h = 1754, 1240
    img = Image.new("L", (w, h), 255)
    draw = ImageDraw.Draw(img)
    body, head, big = load_font(20), load_font(22), load_font(40)
    margin, gutter = 90, 60
    draw.text((margin, 70), title(rng, 6), fill=0, font=big)
    col_w = (w - 2 * margin - gutter) // 2
    top, bottom = 150, 760
    for col in range(2):
        x = margin + col * (col_w + gutter)
        y = top
        while y < bottom - 120:
            y = draw_paragraph(draw, (x, y), paragraph(rng, 3), body, col_w) + 18
    draw.line((w // 2, top, w // 2, bottom - 40), fill=160, width=1)
    widths = (360, 280, 260, 320, 300)
    draw_table(draw, (margin, bottom), widths, table_rows(rng, 9), body, head)
    return img


def receipt_long(rng: random.Random) -> Image.Image:
    """A long narrow shop receipt with items, prices and totals."""
    w, h = 576, 2200
    img = Image.new("L", (w, h), 255)
    draw = ImageDraw.Draw(img)
    body, big = load_font(22), load_font(34)
    margin = 36
    pitch = line_height(body)

    def centered(y: int, text: str, font: Font) -> None:
        draw.text(((w - draw.textlength(text, font=font)) / 2, y), text, fill=0, font=font)

    def row(y: int, left: str, right: str) -> None:
        draw.text((margin, y), left, fill=0, font=body)
        draw.text((w - margin - draw.textlength(right, font=body), y), right, fill=0, font=body)

    centered(50, "CORNER MARKET", big)
    centered(100, f"{rng.randint(10, 99)} {title(rng, 2)} Street", body)
    centered(100 + pitch, f"Tel 555-{rng.randint(1000, 9999)}", body)
    centered(100 + 2 * pitch, f"Receipt {rng.randint(100000, 999999)}  Till {rng.randint(1, 9)}", body)
    y = 100 + 4 * pitch
    draw.line((margin, y, w - margin, y), fill=0, width=2)
    y += 16
    subtotal = 0.0
    while y < h - 520:
        qty = rng.randint(1, 4)
        price = rng.randint(49, 2499) / 100
        name = f"{rng.choice(WORDS)} {rng.choice(WORDS)}".upper()[:22]
        row(y, f"{qty} x {name}", f"{qty * price:.2f}")
        subtotal += qty * price
        y += pitch
    draw.line((margin, y + 6, w - margin, y + 6), fill=0, width=1)
    y += 24
    tax = subtotal * 0.08
    for label, value in (("SUBTOTAL", subtotal), ("TAX 8%", tax), ("TOTAL", subtotal + tax)):
        row(y, label, f"{value:.2f}")
        y += pitch
    y += pitch
    row(y, "CARD ****" + str(rng.randint(1000, 9999)), f"{subtotal + tax:.2f}")
    y += 3 * pitch
    centered(y, "THANK YOU FOR SHOPPING", body)
    centered(y + pitch, "Please keep this receipt", body)
    for i in range(60):  # a barcode
        bx = 80 + i * 7
        if rng.random() < 0.6:
            draw.rectangle((bx, y + 4 * pitch, bx + rng.randint(1, 4), y + 4 * pitch + 90), fill=0)
    return img


def snippet_small(rng: random.Random) -> Image.Image:
    """A small cropped text snippet (both sides <= 768 px, so no tiles)."""
    w, h = 640, 360
    img = Image.new("L", (w, h), 255)
    draw = ImageDraw.Draw(img)
    body = load_font(20)
    # Start above the top edge and run past the bottom so the first and last lines are cut, like a crop.
    draw_paragraph(draw, (24, -12), paragraph(rng, 14), body, w - 48)
    return img


def slide_square(rng: random.Random) -> Image.Image:
    """A slide-like square page: heading, bullet points and a small table."""
    w, h = 1000, 1000
    img = Image.new("L", (w, h), 255)
    draw = ImageDraw.Draw(img)
    body, head, big = load_font(26), load_font(26), load_font(48)
    margin = 70
    draw.rectangle((0, 0, w, 140), fill=235)
    draw.text((margin, 45), title(rng, 4), fill=0, font=big)
    y = 190
    for _ in range(5):
        draw.ellipse((margin, y + 10, margin + 12, y + 22), fill=0)
        y = draw_paragraph(draw, (margin + 30, y), sentence(rng, 6, 12), body, w - 2 * margin - 30) + 14
    rows = [["Config", "Tiles", "Latency"]]
    for i in range(4):
        tiles = rng.choice((0, 2, 3, 4, 6))
        rows.append([f"{rng.choice(WORDS)}-{i}", str(tiles), f"{rng.uniform(80, 900):.0f} ms"])
    draw_table(draw, (margin, y + 30), (330, 200, 260), rows, body, head)
    draw.text((w - 120, h - 60), "3 / 12", fill=80, font=body)
    return img


SAMPLES = (
    ("page_portrait.png", page_portrait, "A4 portrait page at 150 dpi: title, paragraphs, a grid table"),
    ("page_landscape.png", page_landscape, "Landscape page: two text columns and a grid table"),
    ("receipt_long.png", receipt_long, "Long narrow shop receipt: items, prices, totals, barcode"),
    ("snippet_small.png", snippet_small, "Small text snippet cropped out of a page"),
    ("slide_square.png", slide_square, "Square slide: heading, bullet points, a small table"),
)


def local_tiles(path: Path) -> int:
    """Number of 768x768 tiles the DeepSeek-OCR-2 image processor (transformers) cuts for ``path``."""
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import (
        DeepseekOcr2ImageProcessorPil,
    )

    processor = DeepseekOcr2ImageProcessorPil()
    with Image.open(path) as img:
        out = processor(img.convert("RGB"))
    return int(out["num_local_patches"][0])


def write_readme(rows: list[tuple[str, str, int, int, int, int]]) -> None:
    """Write README.md describing the generated files."""
    lines = [
        "# Bundled sample images",
        "",
        "Synthetic document page images used when `dataset.root` is not set. They are generated by",
        "`scripts/make_samples.py` (deterministic: running it again writes the same bytes); do not edit them",
        "by hand.",
        "",
        "Their sizes differ so that the DeepSeek-OCR / DeepSeek-OCR-2 image processor cuts a different",
        f"number of {TILE_SIZE}x{TILE_SIZE} tiles for each, next to the 1024x1024 global view (0 tiles when",
        f"both sides are <= {TILE_SIZE} px, else 2 to 6). The tile counts below come from running",
        "transformers' `DeepseekOcr2ImageProcessorPil` on each file.",
        "",
        "| File | Content | Size (w x h px) | File size (bytes) | 768-px tiles |",
        "|---|---|---|---|---|",
    ]
    for name, desc, w, h, nbytes, tiles in rows:
        lines.append(f"| `{name}` | {desc} | {w} x {h} | {nbytes} | {tiles} |")
    (OUT_DIR / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    """Generate the samples and README; return a process exit code."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, int, int, int, int]] = []
    for i, (name, make, desc) in enumerate(SAMPLES):
        img = make(random.Random(SEED + i))
        path = OUT_DIR / name
        img.save(path, format="PNG", optimize=True)
        tiles = local_tiles(path)
        nbytes = path.stat().st_size
        rows.append((name, desc, img.width, img.height, nbytes, tiles))
        print(f"{name:20s} {img.width:5d} x {img.height:<5d} {nbytes:8d} bytes  {tiles} tiles")
    write_readme(rows)
    total = sum(p.stat().st_size for p in OUT_DIR.iterdir() if p.is_file())
    print(f"total {total} bytes in {OUT_DIR} (limit {MAX_TOTAL_BYTES})")
    if total > MAX_TOTAL_BYTES:
        print("error: the samples folder is over 2 MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU preprocessing path's views against PIL's, for every bundled page, mode and dtype, in uint8 levels (the
largest difference and the share more than one level apart), with the Pillow version: a diagnostic for the
tolerance in `models.deepseek_ocr.device_preprocess`.

    python bench/device_preprocess_diff.py
"""

from __future__ import annotations

import PIL
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.data.images import open_upright
from llm_perf_opt.models.deepseek_ocr.device_preprocess import PIXEL_TOLERANCE, compare_views, preprocess_on_device
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, preprocess

PAGES = ("page_portrait.png", "page_landscape.png", "receipt_long.png", "slide_square.png")


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    modes = compose_config("stage1", "model=deepseek_ocr").model.modes
    print(f"Pillow {PIL.__version__}, torch {torch.__version__}, {device}; tolerance {PIXEL_TOLERANCE}")
    for name in PAGES:
        with open_upright(bundled_samples_dir() / name)[0] as image:
            image = image.convert("RGB")
            for mode_name in ("gundam", "base", "tiny"):
                m = modes[mode_name]
                mode = Mode(
                    name=mode_name,
                    base_size=int(m.base_size),
                    image_size=int(m.image_size),
                    crop_mode=bool(m.crop_mode),
                )
                reference = preprocess(image, mode)
                for dtype in (torch.bfloat16, torch.float32):
                    diff = compare_views(reference, preprocess_on_device(image, mode, device=device, dtype=dtype))
                    print(f"  {name:20s} {mode_name:7s} {dtype!s:15s} {diff}")


if __name__ == "__main__":
    main()

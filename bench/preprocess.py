"""Benchmark: DeepSeek-OCR v1 preprocessing on the CPU (PIL) and on the GPU (`model.preprocess.device=cuda`).

Side by side in one process, alternating, on one page (default: the bundled A4 page, Gundam mode): each sample is
what the session's preprocess stage times for one input: the page decoded from its file, its views made and put on
the device in the model's dtype (the PIL path's float32 views copied and cast there; the GPU path's made there), the
device synchronised at the end. The median of `--repeats` samples after `--warmup` per path; the decode alone is
timed too (the floor both share), and the two paths' views are compared in uint8 levels.

    python bench/preprocess.py                    # cuda if there is one; --device cpu runs the torch path on the CPU
    python bench/preprocess.py --mode base --out preprocess.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import plain
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.data.images import open_upright
from llm_perf_opt.models.deepseek_ocr.device_preprocess import PIXEL_TOLERANCE, compare_views, preprocess_on_device
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, Views, mode_from_config, preprocess
from llm_perf_opt.session.session import device_name, resolve_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _on_device(views: Views, device: torch.device, dtype: torch.dtype) -> Views:
    """The PIL path's views moved as the session moves them (PreparedInputs.to)."""
    tiles = None if views.tiles is None else views.tiles.to(device=device, dtype=dtype, non_blocking=True)
    global_view = views.global_view.to(device=device, dtype=dtype, non_blocking=True)
    return Views(mode=views.mode, global_view=global_view, tiles=tiles, grid=views.grid)


def _paths(image: Path, mode: Mode, device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[], Any]]:
    def decode() -> Any:
        return open_upright(image)[0]

    def cpu() -> Views:
        return _on_device(preprocess(decode(), mode), device, dtype)

    def gpu() -> Views:
        return preprocess_on_device(decode(), mode, device=device, dtype=dtype)

    return {"decode only": decode, "cpu (PIL)": cpu, f"{device.type} (torch)": gpu}


def _time(run: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    run()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, default=bundled_samples_dir() / "page_portrait.png")
    parser.add_argument("--mode", default="gundam")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bf16 on GPU)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device.type == "cuda" else torch.float32
    mode = mode_from_config(args.mode, plain(compose_config("stage1", "model=deepseek_ocr").model.modes))
    paths = _paths(args.image, mode, device, dtype)
    for run in paths.values():
        for _ in range(args.warmup):
            run()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeats):  # alternating, so slow drifts of the host hit every path alike
        for name, run in paths.items():
            samples[name].append(_time(run, device))
    cpu_views, device_views = (paths[name]() for name in list(paths)[1:])
    difference = compare_views(cpu_views, device_views)
    medians = {name: statistics.median(ms) for name, ms in samples.items()}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_name(device),
        "torch": torch.__version__,
        "image": args.image.name,
        "mode": mode.name,
        "dtype": str(dtype).removeprefix("torch."),
        "grid": list(cpu_views.grid),
        "repeats": args.repeats,
        "median_ms": medians,
        "views_difference": {
            "max_levels": difference.max_levels,
            "beyond_one_level": difference.beyond_one_level,
            "within_tolerance": difference.within(PIXEL_TOLERANCE),
        },
    }
    print(f"{result['date']}  {result['device']}  torch {torch.__version__}")
    print(f"{args.image.name}, mode {mode.name}, grid {cpu_views.grid}, {result['dtype']}, median of {args.repeats}:")
    for name, ms in medians.items():
        print(f"  {name:<16} {ms:8.2f} ms")
    cpu_ms, device_ms = list(medians.values())[1:]
    print(
        f"  speed-up {cpu_ms / device_ms:.2f}x; views {difference.max_levels} level(s) apart at most, "
        f"{difference.beyond_one_level:.2e} beyond one level"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

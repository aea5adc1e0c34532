"""Benchmark (issue 42): does reading torch's and the CUDA libraries into the page cache ahead, on a background thread
while torch imports, shorten a cold start? One run: import torch and transformers' auto classes, then a first GEMM,
convolution, attention and a few small kernels on the GPU, each phase timed. Drop the page cache before each run
(`sync; echo 3 > /proc/sys/vm/drop_caches`, root) to make it cold. Results: docs/benchmarks.md.

    python3 bench/library_prefetch.py none|fadvise|read [--maps]

none: nothing ahead; fadvise: posix_fadvise(WILLNEED) on each library; read: each library read whole. --maps: list
the shared libraries the process mapped, largest first.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import threading
import time
from pathlib import Path

STARTED = time.perf_counter()


def libraries() -> list[str]:
    """torch's libraries and the pip CUDA wheels', largest first (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    roots = [str(Path(spec.origin).parent / "lib")]
    nvidia = importlib.util.find_spec("nvidia")
    for location in nvidia.submodule_search_locations or [] if nvidia is not None else []:
        roots += glob.glob(os.path.join(location, "*", "lib"))
    files = [f for root in roots for f in glob.glob(os.path.join(root, "*.so*")) if os.path.isfile(f)]
    return sorted(files, key=os.path.getsize, reverse=True)


def ahead(mode: str, done: dict[str, float]) -> None:
    """Read (or advise) every library; how long it took and how many bytes it read go to `done`."""
    start, total, buffer = time.perf_counter(), 0, bytearray(8 << 20)
    for path in libraries():
        if mode == "fadvise":
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
            continue
        with open(path, "rb", buffering=0) as handle:
            while read := handle.readinto(buffer):
                total += read
    done.update(seconds=time.perf_counter() - start, bytes=total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("none", "fadvise", "read"))
    parser.add_argument("--maps", action="store_true")
    args = parser.parse_args()
    done: dict[str, float] = {}
    if args.mode != "none":
        threading.Thread(target=ahead, args=(args.mode, done), daemon=True).start()
    import torch

    imported_torch = time.perf_counter()
    import transformers.modeling_utils
    import transformers.models.auto.modeling_auto  # noqa: F401

    imported = time.perf_counter()
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    x = torch.randn(2048, 2048, device=cuda, dtype=bf16)
    _ = x @ x
    pages = torch.randn(1, 3, 1024, 1024, device=cuda, dtype=bf16)
    _ = torch.nn.functional.conv2d(pages, torch.randn(768, 3, 16, 16, device=cuda, dtype=bf16), stride=16)
    q = torch.randn(1, 12, 4096, 64, device=cuda, dtype=bf16)
    _ = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    _ = torch.nn.functional.layer_norm(x, (2048,)), torch.softmax(x.float(), -1), torch.topk(x, 6)
    torch.cuda.synchronize()
    ended = time.perf_counter()
    print(
        f"{args.mode}: torch {imported_torch - STARTED:.2f} s, transformers {imported - imported_torch:.2f} s, "
        f"first kernels {ended - imported:.2f} s, total {ended - STARTED:.2f} s; ahead: {done or 'nothing'}"
    )
    if args.maps:
        mapped = {line.split()[5] for line in Path("/proc/self/maps").read_text().splitlines() if ".so" in line}
        sizes = {path: os.path.getsize(path) for path in mapped if os.path.exists(path)}
        for path, size in sorted(sizes.items(), key=lambda item: -item[1])[:40]:
            print(f"  {size / 1e6:9.1f} MB {path}")
        print(f"  {sum(sizes.values()) / 1e9:.2f} GB mapped in {len(sizes)} files")


if __name__ == "__main__":
    main()

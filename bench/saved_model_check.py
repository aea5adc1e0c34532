"""Build once, reuse, checked on a real model: how long building the random-weights model takes against loading
the saved one, and whether the loaded model has the same tensors and outputs. Run it twice with one cache folder:

    python3 bench/saved_model_check.py save /tmp/model_cache            # builds, saves (timed)
    python3 bench/saved_model_check.py load /tmp/model_cache            # loads (timed), builds again, compares

Options after the folder are stage1-run overrides (default: model=deepseek_ocr, device=cuda)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import attrs
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import plain
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.session.model_settings import ModelSettings
from llm_perf_opt.session.session import InferenceSession, resolve_device

PAGE = "snippet_small.png"


def timed_load(settings: ModelSettings, device: torch.device) -> tuple[InferenceSession, float]:
    """A session of `settings` and the seconds it took to make (synchronised)."""
    started = time.perf_counter()
    session = InferenceSession.load(settings, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return session, time.perf_counter() - started


def compare(loaded: InferenceSession, built: InferenceSession) -> None:
    """Tensors, generated tokens and prefill logits of the two sessions, printed side by side."""
    want = {**dict(built.model.named_parameters()), **dict(built.model.named_buffers())}
    got = {**dict(loaded.model.named_parameters()), **dict(loaded.model.named_buffers())}
    differing = [k for k, t in want.items() if k not in got or not torch.equal(got[k], t)]
    print(f"tensors: {len(want)} built, {len(got)} loaded, {len(differing)} differ {differing[:3]}")
    page = bundled_samples_dir() / PAGE
    outputs = []
    for session in (built, loaded):
        session.keep_prefill_logits = True
        outputs.append(session.run_image(page, 8, nvtx=False))
    a, b = outputs
    assert a.prefill_logits is not None and b.prefill_logits is not None
    same = torch.equal(a.prefill_logits, b.prefill_logits)
    print(f"tokens equal: {a.token_ids == b.token_ids}; prefill logits equal: {same}")


def main(mode: str, cache: str, *overrides: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = compose_config("stage1", *(overrides or ("model=deepseek_ocr", "device=cuda")))
    device = resolve_device(str(cfg.device))
    settings = ModelSettings.from_config(plain(cfg.model))
    cached = attrs.evolve(settings, cache_dir=str(Path(cache)))
    session, took = timed_load(cached, device)
    print(f"{mode}: {took:.1f} s ({session.loaded.weights_detail})")
    if mode == "load":
        built, build_s = timed_load(settings, device)
        print(f"build without the cache: {build_s:.1f} s")
        compare(session, built)


if __name__ == "__main__":
    main(*sys.argv[1:])

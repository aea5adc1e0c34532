"""Benchmark: what NVTX ranges + CUDA-event stage timing add to end-to-end latency.

Side by side in one process on one loaded session, interleaved passes over the same preprocessed image
(preprocessing is CPU work outside the instrumented region, and its own run-to-run noise would only blur the
comparison):
- instrumented: prefill + decode as `run_image` runs them (NVTX ranges, CUDA events per stage and per decode step,
  vision-stage hooks), then reading every span (`spans_ms`);
- uninstrumented: the same prefill + decode with a no-op recorder and the hooks detached;
- for MoE decoders, instrumented with the routing record on (hooks on the routers, indices kept on the device and
  copied once at the end of the pass); the routing cost is its ratio to the instrumented pass without it.
All are timed by the same wall clock with a device synchronisation at each end. The figure of merit is the
median of the per-pair ratios (each pair runs back to back, which cancels slow drifts of the host), with the
plain medians beside it. `--kv-cache static --compile decode` measures the same under a compiled decode.

    python bench/instrumentation_overhead.py --model deepseek_ocr2 --repeats 7 --out overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.instruments.timing import NullRecorder, StageRecorder
from llm_perf_opt.records.vocabulary import DECODE
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession, device_name, resolve_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek_ocr2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--image", default=str(bundled_samples_dir() / "page_portrait.png"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--kv-cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--compile", default="none", choices=["none", "decode", "prefill_decode"])
    parser.add_argument("--compile-mode", default="reduce-overhead")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    cfg = compose_config(
        "stage1",
        f"model={args.model}",
        f"runtime.kv_cache={args.kv_cache}",
        f"runtime.compile={args.compile}",
        f"runtime.compile_mode={args.compile_mode}",
    )
    device = resolve_device(args.device)
    runtime = RuntimeSettings.from_nodes(stage1_nodes(cfg))
    session = InferenceSession.load(cfg.model, device, runtime)
    routing = session.routing
    image = Path(args.image)

    prepared = session.prepare(image)

    decode_ms: dict[bool, list[float]] = {False: [], True: []}  # the decode stage's CUDA-event time, by routing on

    def instrumented(with_routing: bool = False) -> float:
        if routing is not None and not with_routing:
            routing.remove()
        try:
            _sync(device)
            start = time.perf_counter()
            recorder = StageRecorder(device)
            session.generate(prepared, args.new_tokens, recorder)
            decode_ms[with_routing].append(recorder.totals_ms()[DECODE])
            if routing is not None and with_routing:
                routing.end_pass()  # the one copy of the pass's expert indices to the host
            _sync(device)
            return (time.perf_counter() - start) * 1e3
        finally:
            if routing is not None:
                routing.attach()

    def routed() -> float:
        return instrumented(with_routing=True)

    def plain() -> float:
        session.remove_stage_hooks()
        if routing is not None:
            routing.remove()
        try:
            _sync(device)
            start = time.perf_counter()
            session.generate(prepared, args.new_tokens, NullRecorder(device))
            _sync(device)
            return (time.perf_counter() - start) * 1e3
        finally:
            session.install_stage_hooks()
            if routing is not None:
                routing.attach()

    variants = [plain, instrumented] + ([routed] if routing is not None else [])
    for _ in range(args.warmup):
        for variant in variants:
            variant()
    times: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for i in range(args.repeats):  # interleave, rotating which goes first
        for variant in variants[i % len(variants) :] + variants[: i % len(variants)]:
            times[variant.__name__].append(variant())
    with_ms, without_ms = times["instrumented"], times["plain"]
    med_with, med_without = statistics.median(with_ms), statistics.median(without_ms)
    ratios = [a / b for a, b in zip(with_ms, without_ms, strict=True)]
    routing_result = {}
    if routing is not None:
        routed_ratios = [a / b for a, b in zip(times["routed"], with_ms, strict=True)]
        timed_decode = {on: values[-args.repeats :] for on, values in decode_ms.items()}  # warm-up passes dropped
        decode_ratios = [a / b for a, b in zip(timed_decode[True], timed_decode[False], strict=True)]
        routing_result = {
            "routing_ms": times["routed"],
            "median_routing_ms": statistics.median(times["routed"]),
            "routing_overhead_pct_median_paired": (statistics.median(routed_ratios) - 1) * 100,
            "median_decode_ms_without_routing": statistics.median(timed_decode[False]),
            "median_decode_ms_with_routing": statistics.median(timed_decode[True]),
            "routing_overhead_pct_of_decode_median_paired": (statistics.median(decode_ratios) - 1) * 100,
        }
    result = {
        "benchmark": "instrumentation_overhead",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_name(device),
        "model": args.model,
        "image": image.name,
        "new_tokens": args.new_tokens,
        "runtime": runtime.label,
        "repeats": args.repeats,
        "instrumented_ms": with_ms,
        "uninstrumented_ms": without_ms,
        "median_instrumented_ms": med_with,
        "median_uninstrumented_ms": med_without,
        "overhead_pct_of_medians": (med_with / med_without - 1) * 100,
        "overhead_pct_median_paired": (statistics.median(ratios) - 1) * 100,
        "paired_ratio_p10_p90": [
            float(x) for x in (sorted(ratios)[len(ratios) // 10], sorted(ratios)[-1 - len(ratios) // 10])
        ],
        **routing_result,
    }
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("ed_ms") and k != "routing_ms"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

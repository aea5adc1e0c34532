#!/bin/bash
# Benchmark (issue 25): does a what-if rung's host pace depend on how it was started? `perf-whatif whatif=decode` with
# only the baseline and two rungs that change nothing (experts_grouped_mm, grouped_mm's own default, and a copy of it),
# the profiler, memory and energy passes and the ladder off, once with rungs forked from the preloaded server and once
# with fresh interpreters; prints each rung's decode ms/token per timed pass and what the host spent per pass
# (metrics.json's host_usage). Results: docs/benchmarks.md. On the project's GPU machines run it after
# `source .gpu/setup.sh`. Overrides after the folder go to both runs (e.g. model=deepseek_ocr_tiny off the GPU).
#   bash bench/whatif_host_pace.sh /tmp/host-pace
set -euo pipefail
out="${1:-tmp/whatif-host-pace}"
shift $(( $# < 1 ? $# : 1 ))
extra=("$@")
source "$(dirname "$0")/lib.sh"
mkdir -p "$out"
for fork in true false; do
  timed_module "$out" "fork_$fork" "" llm_perf_opt.cli.whatif whatif=decode infer.max_new_tokens=32 \
    pipeline.energy.enable=false pipeline.memory.enable=false pipeline.torch_profiler.enable=false \
    whatif_run.ladder=false 'whatif_run.exclude=[static_cache,cuda_graphs,compiled_decode,experts_batched_mm,attn_eager]' \
    "+whatif.levers.grouped_again={overrides: ['model.experts_implementation=grouped_mm']}" \
    "whatif_run.fork_rungs=$fork" "${extra[@]}"
  echo "whatif_run.fork_rungs=$fork: $elapsed s ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
  python3 - "$out/fork_$fork" <<'PY' | tee -a "$out/times.txt"
import json, sys
from pathlib import Path

for rung in sorted(Path(sys.argv[1], "rungs").iterdir()):
    m = json.loads((rung / "metrics.json").read_text())
    per_token = " ".join(f"{r['decode_ms'] / max(1, r['new_tokens'] - 1):5.1f}" for r in m["records"])
    line = f"  {rung.name:24s} decode ms/token per pass: {per_token}"
    u = m.get("host_usage")
    if u and u["passes"]:
        n, own = u["passes"], u.get("pass_thread_cpu_s")
        line += (f"; per pass: CPU {(u['user_cpu_s'] + u['system_cpu_s']) / n:.2f} s"
                 + (f" (the passes' thread {own / n:.2f} s)" if own is not None else "")
                 + f", wall {u['wall_s'] / n:.2f} s, involuntary switches {u['involuntary_switches'] / n:.0f}")
    print(line)
PY
done

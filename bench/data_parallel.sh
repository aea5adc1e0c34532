#!/bin/bash
# Benchmark (issue 45, several GPUs): pages/s of DeepSeek-OCR v1 (random weights) on the A4 page at batch 32 with a
# static cache and compiled decode (256 new tokens), on 1 GPU, then data parallel on 2 and 4 GPUs of this host (one
# process per GPU, at once: `run.data_parallel=N`), each against the 1-GPU run; prints the scaling table (per-GPU
# pages/s, combined pages/s over the window in which all processes were timing, pages per day, efficiency).
#   bash bench/data_parallel.sh /tmp/dp            # 1, 2 and 4 GPUs (needs 4 visible GPUs)
#   bash bench/data_parallel.sh /tmp/dp "1 2"      # 1 and 2 GPUs
#   EXTRA="pipeline.memory.enable=false" bash bench/data_parallel.sh /tmp/dp "1 2"   # with further overrides
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
# Results: docs/benchmarks.md.
set -euo pipefail
out="${1:-tmp/data-parallel}"
counts="${2:-1 2 4}"
workload=(workload=ocr1-a4-page runtime.kv_cache=static runtime.compile=decode model.preprocess.device=cuda
  run.batch_size=32 run.fill_batches=true infer.max_new_tokens=256)
read -r -a extra <<< "${EXTRA:-}"  # further overrides for every run, e.g. EXTRA="runtime.batch_vision=true"
workload+=("${extra[@]}")
mkdir -p "$out"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "data parallel on ${device:-no GPU}, $(date -u +%F): ${workload[*]}"

folders=()
for n in $counts; do
  start=$(date +%s)
  if [ "$n" = 1 ]; then
    python3 -m llm_perf_opt.cli.stage1 "${workload[@]}" device=cuda:0 "hydra.run.dir=$out/gpu1" \
      >"$out/gpu1.log" 2>&1 || echo "1 GPU: exit $? (see $out/gpu1.log)"
  else
    baseline=()
    [ -f "$out/gpu1/metrics.json" ] && baseline=("run.data_parallel_baseline=$out/gpu1")
    python3 -m llm_perf_opt.cli.stage1 "${workload[@]}" "run.data_parallel=$n" "${baseline[@]}" \
      "hydra.run.dir=$out/gpu$n" >"$out/gpu$n.log" 2>&1 || echo "$n GPUs: exit $? (see $out/gpu$n.log)"
    [ -f "$out/gpu$n/data_parallel.json" ] && folders+=("$out/gpu$n")
  fi
  echo "$n GPU(s): $(($(date +%s) - start)) s end to end"
done

if [ -f "$out/gpu1/metrics.json" ]; then
  python3 - "$out/gpu1" <<'PY'
import sys
from llm_perf_opt.pipeline.data_parallel import single_gpu
one = single_gpu(sys.argv[1])
print(f"1 GPU: {one.pages_per_s:,.2f} pages/s ({one.source})")
PY
fi
if [ ${#folders[@]} -gt 0 ]; then
  python3 -m llm_perf_opt.pipeline.data_parallel "${folders[@]}" | tee "$out/scaling.md"
fi

#!/bin/bash
# Benchmark: `perf-whatif` on the default DeepSeek-OCR v1 (random weights) and the bundled A4 page, one preset per
# call, timed end to end (model builds, compilation and every rung included). Results: docs/benchmarks.md.
#   bash bench/whatif_ladder.sh decode /tmp/whatif-decode     # target: ≤ 10 min, best rung ≤ 3 ms/token
#   bash bench/whatif_ladder.sh batch /tmp/whatif-batch
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
preset="${1:-decode}"
out="${2:-tmp/whatif-bench-$preset}"
shift 2 || true
start=$(date +%s)
python3 -m llm_perf_opt.cli.whatif "whatif=$preset" \
  'dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt' \
  "hydra.run.dir=$out" "$@"
elapsed=$(( $(date +%s) - start ))
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "perf-whatif whatif=$preset: $elapsed s end to end ($(date -u +%F), ${device:-no GPU})"

#!/bin/bash
# Benchmark (issues 22, 24, 25): what the untimed passes cost and whether they touch the timed figures. The default
# `stage1-run` on DeepSeek-OCR v1 (random weights) and the bundled A4 page, interleaved on one machine with the same
# run without module attribution (pipeline.torch_profiler.modules=false) and without the memory and energy passes;
# the default twice (repeatability, J per decode token included). Each run timed end to end, then `perf-compare` of
# each against the first default run (noise verdicts per figure). Results: docs/benchmarks.md.
#   bash bench/stage1_overheads.sh /tmp/overheads                                  # eager
#   RUNS="default-1 no-modules" bash bench/stage1_overheads.sh /tmp/overheads-graphs runtime.kv_cache=static \
#     runtime.compile=decode                                 # CUDA graphs, attribution on vs off only
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
out="${1:-tmp/stage1-overheads}"
shift || true
page='dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt'
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
mkdir -p "$out"

timed() {  # timed <label> <overrides...>: one stage1-run into $out/<label>, its end-to-end seconds printed
  local label="$1" start elapsed
  shift
  start=$(date +%s.%N)
  python3 -m llm_perf_opt.cli.stage1 "$page" "hydra.run.dir=$out/$label" "$@" >"$out/$label.log" 2>&1 \
    || echo "$label: exit $? (see $out/$label.log)"
  elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  echo "$label: $elapsed s end to end ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
}

runs="${RUNS:-default-1 no-modules no-memory-energy default-2}"
for run in $runs; do
  case "$run" in
    default-*) timed "$run" "$@" ;;
    no-modules) timed "$run" pipeline.torch_profiler.modules=false "$@" ;;
    no-memory-energy) timed "$run" pipeline.memory.enable=false pipeline.energy.enable=false "$@" ;;
    *) echo "unknown run $run (default-N, no-modules, no-memory-energy)" && exit 2 ;;
  esac
done
for other in $runs; do
  [ "$other" = default-1 ] && continue
  python3 -m llm_perf_opt.cli.compare "$out/default-1" "$out/$other" --out "$out/compare-$other/" >/dev/null \
    || echo "perf-compare default-1 $other: exit $?"
done

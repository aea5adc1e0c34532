#!/bin/bash
# Benchmark (issue 25): `stage2-profile` light on the default DeepSeek-OCR v1 (random weights) and the bundled A4
# page, end to end, with where its time went (capture.json: each tool run's seconds). With a second argument, the
# same command runs first from another source tree (e.g. the code before a change, `git archive <rev> src`), on the
# same machine, one after the other. Results: docs/benchmarks.md.
#   bash bench/stage2_speed.sh /tmp/s2speed                      # this checkout
#   bash bench/stage2_speed.sh /tmp/s2speed /tmp/old/src         # that tree first ("before"), then this checkout
#   bash bench/stage2_speed.sh /tmp/s2speed "" pipeline.nsys.gpu_metrics_hz=100000   # more overrides, both runs
#   RUNS=before bash bench/stage2_speed.sh /tmp/s2speed /tmp/old/src   # one of the two (each may take minutes)
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
out="${1:-tmp/stage2-speed}"
before_src="${2:-}"
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
source "$(dirname "$0")/lib.sh"
mkdir -p "$out"

run() {  # run <label> [PYTHONPATH prefix]
  local label="$1" prefix="${2:-}"
  timed_module "$out" "$label" "$prefix" llm_perf_opt.cli.stage2 "${extra[@]}"
  echo "$label: $elapsed s end to end ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
  python3 - "$out/$label/capture.json" <<'PY' | tee -a "$out/times.txt"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
print("  " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in runs.items()))
PY
}

runs="${RUNS:-before after}"
if [ -n "$before_src" ] && [[ " $runs " == *" before "* ]]; then
  run before "$before_src"
fi
if [[ " $runs " == *" after "* ]]; then
  run after
fi

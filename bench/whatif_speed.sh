#!/bin/bash
# Benchmark (issue 25): `perf-whatif whatif=decode` on the default DeepSeek-OCR v1 (random weights) and the bundled A4
# page, end to end, each run compiling from a cold inductor cache of its own; with a second argument the same run from
# another source tree first (e.g. the code before a change, `git archive <rev> src`), on the same machine, one after
# the other. Overrides after the second argument go to both runs; AFTER_EXTRA (space-separated) to this checkout's
# only, for settings the older code does not have. Results: docs/benchmarks.md.
#   bash bench/whatif_speed.sh /tmp/wspeed                               # this checkout
#   AFTER_EXTRA="pipeline.energy.enable=false pipeline.memory.enable=false" \
#     bash bench/whatif_speed.sh /tmp/wspeed /tmp/old/src                # 465565a had neither pass
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
out="${1:-tmp/whatif-speed}"
before_src="${2:-}"
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
read -r -a after_extra <<< "${AFTER_EXTRA:-}"
source "$(dirname "$0")/lib.sh"
mkdir -p "$out"

run() {  # run <label> <PYTHONPATH prefix> [overrides...]
  local label="$1" prefix="$2"
  shift 2
  TORCHINDUCTOR_CACHE_DIR="$out/$label-inductor" timed_module "$out" "$label" "$prefix" llm_perf_opt.cli.whatif \
    whatif=decode "${extra[@]}" "$@"
  rm -rf "$out/$label-inductor"
  echo "$label: $elapsed s end to end ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
  grep -h "rung .*: complete in\|rung .*: failed" "$out/$label/whatif.log" 2>/dev/null | sed 's/.* - /  /' \
    | tee -a "$out/times.txt" || true
}

if [ -n "$before_src" ]; then
  run before "$before_src"
fi
run after "" whatif_run.inductor_cache=run "${after_extra[@]}"

#!/bin/bash
# Benchmark (issue 25): the default `stage1-run` on DeepSeek-OCR v1 (random weights) and the bundled A4 page, end to
# end, with the within-image CV of prefill and the decode step; with a second argument the same run from another
# source tree first (e.g. the code before a change, `git archive <rev> src`), alternating, on one machine. Results:
# docs/benchmarks.md.
#   bash bench/stage1_speed.sh /tmp/s1speed                    # this checkout, twice
#   bash bench/stage1_speed.sh /tmp/s1speed /tmp/old/src        # before, after, before, after
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
out="${1:-tmp/stage1-speed}"
before_src="${2:-}"
rounds="${ROUNDS:-2}"
source "$(dirname "$0")/lib.sh"
mkdir -p "$out"

run() {  # run <label> [PYTHONPATH prefix]
  local label="$1" prefix="${2:-}" cv
  timed_module "$out" "$label" "$prefix" llm_perf_opt.cli.stage1
  cv=$(python3 - "$out/$label/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
cv = {v["stage"]: v.get("within_image_cv_median") for v in m.get("variation", [])}
p50 = {s["stage"]: s["summary"]["p50"] for s in m["stages"]}
print(", ".join(f"{s} p50 {p50[s]:.2f} ms CV {cv[s]:.1%}" for s in ("prefill", "decode/step") if cv.get(s) is not None))
PY
) || cv="(no figures: see $out/$label.log)"
  echo "$label: $elapsed s end to end; $cv ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
}

for i in $(seq 1 "$rounds"); do
  if [ -n "$before_src" ]; then
    run "before-$i" "$before_src"
  fi
  run "after-$i"
done

#!/bin/bash
# Benchmark (issue 25, build once, reuse): `stage2-profile` (light) and `perf-whatif whatif=decode` on the default
# DeepSeek-OCR v1 (random weights) and the bundled A4 page, each timed end to end twice on one machine: with the
# child processes building the model and compiling from scratch ("before": stage2.reuse_model=false;
# whatif_run.reuse_model=false whatif_run.inductor_cache=null with a fresh TORCHINDUCTOR_CACHE_DIR) and with the
# saved model and the shared inductor cache ("after", the defaults). Results: docs/benchmarks.md.
#   bash bench/build_once.sh /tmp/build-once            # before and after, both commands (four runs)
#   bash bench/build_once.sh /tmp/build-once after      # only the defaults
#   bash bench/build_once.sh /tmp/build-once warm       # the defaults, then perf-whatif again on a warm inductor cache
# "after" starts from an empty user cache (XDG_CACHE_HOME under the output folder), as on a fresh machine.
# On the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
# Targets (issue 25, H100): stage2-profile light <= 120 s (from 458 s), perf-whatif whatif=decode <= 180 s (from 330 s).
set -euo pipefail
out="${1:-tmp/build-once}"
which="${2:-both}"
page='dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt'
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
mkdir -p "$out"

timed() {  # timed <label> <command...>: run it, print its end-to-end seconds
  local label="$1" start elapsed
  shift
  start=$(date +%s)
  "$@" >"$out/$label.log" 2>&1 || echo "$label: exit $? (see $out/$label.log)"
  elapsed=$(($(date +%s) - start))
  echo "$label: $elapsed s end to end ($(date -u +%F), ${device:-no GPU})" | tee -a "$out/times.txt"
}

if [ "$which" = both ] || [ "$which" = before ]; then
  timed stage2-before python3 -m llm_perf_opt.cli.stage2 "$page" stage2.reuse_model=false \
    "hydra.run.dir=$out/stage2-before"
  TORCHINDUCTOR_CACHE_DIR="$out/inductor-before" timed whatif-before python3 -m llm_perf_opt.cli.whatif \
    whatif=decode "$page" whatif_run.reuse_model=false whatif_run.inductor_cache=null \
    "hydra.run.dir=$out/whatif-before"
fi
if [ "$which" != before ]; then
  export XDG_CACHE_HOME="$out/xdg-cache"  # whatif_run.inductor_cache=user: empty at the start
  timed stage2-after python3 -m llm_perf_opt.cli.stage2 "$page" "hydra.run.dir=$out/stage2-after"
  timed whatif-after python3 -m llm_perf_opt.cli.whatif whatif=decode "$page" "hydra.run.dir=$out/whatif-after"
  if [ "$which" = warm ]; then
    timed whatif-warm python3 -m llm_perf_opt.cli.whatif whatif=decode "$page" "hydra.run.dir=$out/whatif-warm"
  fi
fi
# Same figures before and after (kernel tables within noise): compare the folders.
for pair in stage2 whatif; do
  if [ -d "$out/$pair-before" ] && [ -d "$out/$pair-after" ]; then
    python3 -m llm_perf_opt.cli.compare "$out/$pair-before" "$out/$pair-after" >"$out/compare-$pair.log" 2>&1 \
      || echo "perf-compare $pair: exit $? (see $out/compare-$pair.log)"
  fi
done
# Which child built and saved the model and which loaded it (one line each):
grep -rh --include=*.log "saved model\|saved the model\|model ready" "$out/stage2-after" 2>/dev/null | cut -c1-200 || true
cat "$out/times.txt"

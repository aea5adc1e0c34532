#!/bin/bash
# Benchmark (issue 42): each README command as the first command on a freshly started machine, its caches emptied
# (matplotlib's font cache via MPLCONFIGDIR, inductor's and triton's caches, the source tree's __pycache__, and no
# bytecode written, as on the project's GPU machines): its wall time and where the time went (before the first log
# line: interpreter, imports; each step's "step done in" line; after the last log line: reports, exit). With a second
# argument the same commands from another source tree first (e.g. the code before a change, `git archive <rev> src`),
# on the same machine, one after the other. Results: docs/benchmarks.md.
#   bash bench/cold_start.sh /tmp/cold                         # this checkout
#   bash bench/cold_start.sh /tmp/cold /tmp/old/src             # before, then after
#   MODEL=deepseek_ocr_tiny COMMANDS="stage1 batch64" bash bench/cold_start.sh /tmp/cold   # a dry check on a CPU
# COMMANDS picks among: stage1 (default stage1-run), stage2 (stage2-profile, light), whatif (perf-whatif whatif=decode
# workload=ocr1-a4-page), batch64 (stage1-run at batch 64 with CUDA graphs on the A4 page at 256 new tokens). MODEL, when set, is
# added as model=<MODEL> to every command. IMPORTTIME=1 runs each under `python -X importtime` and adds its 15 costliest
# imports (cumulative, nested ones too: from a cold disk on a fresh machine) to times.txt. COMPILE_PACKAGES=1 first writes
# the bytecode of the packages on PYTHONPATH (this source tree's excepted) as `pip install` does: the project's GPU
# machines' extra packages are installed without it, so every command there compiles them (about 3 s of its start). On
# the project's GPU machines (no console scripts installed) run it after `source .gpu/setup.sh`.
set -euo pipefail
out="${1:-tmp/cold-start}"
before_src="${2:-}"
read -r -a commands <<< "${COMMANDS:-stage1 stage2 whatif batch64}"
source "$(dirname "$0")/lib.sh"
mkdir -p "$out"
out=$(cd "$out" && pwd)
model=()
if [ -n "${MODEL:-}" ]; then
  model=("model=$MODEL")
fi
# issue 45's throughput configuration: the A4 page at 256 new tokens, batch 64 with CUDA-graph decode, 3 timed passes
batch64=(workload=ocr1-a4-page run.batch_size=64 run.fill_batches=true run.repeats=3 runtime.kv_cache=static
  runtime.compile=decode)
if [ "$(python3 -c 'import torch; print(torch.cuda.is_available())')" = "True" ]; then
  batch64+=(model.preprocess.device=cuda)
else  # a dry check on a CPU: compiled decode without CUDA graphs
  batch64+=(runtime.compile_mode=default)
fi

# cold <label> <PYTHONPATH prefix or ""> <module> [overrides...]: `python3 -m <module>` with every cache emptied, into
# <out>/<label>; its wall time and log summary appended to <out>/times.txt.
cold() {
  local label="$1" prefix="$2" module="$3" start end fresh
  shift 3
  fresh="$out/$label-caches"
  rm -rf "$fresh" "$out/$label"
  mkdir -p "$fresh/mpl" "$fresh/inductor" "$fresh/triton"
  if [ -n "$prefix" ]; then
    find "$prefix" -name __pycache__ -type d -prune -exec rm -rf {} +
  fi
  find "$(dirname "$0")/../src" -name __pycache__ -type d -prune -exec rm -rf {} +
  start=$(date +%s.%N)
  MPLCONFIGDIR="$fresh/mpl" TORCHINDUCTOR_CACHE_DIR="$fresh/inductor" TRITON_CACHE_DIR="$fresh/triton" \
    PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="${prefix:+$prefix:}${PYTHONPATH:-}" \
    python3 ${IMPORTTIME:+-X importtime} -m "$module" "${model[@]}" "$@" "hydra.run.dir=$out/$label" >"$out/$label.log" 2>&1 \
    || echo "$label: exit $? (see $out/$label.log)" | tee -a "$out/times.txt"
  end=$(date +%s.%N)
  rm -rf "$fresh"
  python3 - "$label" "$start" "$end" "$out/$label" "${device:-no GPU}" <<'PY' | tee -a "$out/times.txt"
import datetime as dt
import re
import sys
from pathlib import Path

label, start, end, run_dir, device = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
print(f"{label}: {end - start:.1f} s end to end ({dt.date.today()}, {device})")
stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
logs = sorted(run_dir.glob("*.log")) if run_dir.is_dir() else []
times, steps = [], []
for line in logs[0].read_text(errors="replace").splitlines() if logs else []:
    if (found := stamp.match(line)) is not None:
        times.append(dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    if "step done in" in line or ": complete in" in line:
        steps.append("  " + line.split(" - ", 1)[-1])
if times:
    print(f"  before the first log line: {times[0] - start:.1f} s (interpreter, imports, config)")
print("\n".join(steps) if steps else "  (no step lines: see the log)")
if times:
    print(f"  after the last log line: {end - times[-1]:.1f} s (reports, summary, exit)")
imports = []  # `-X importtime` lines: "import time: self | cumulative | name" (a nested import indented)
for line in (run_dir.parent / f"{label}.log").read_text(errors="replace").splitlines():
    if line.startswith("import time:") and "|" in line:
        _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        if cumulative.isdigit():
            imports.append((int(cumulative), name))
for cumulative, name in sorted(imports, reverse=True)[:15]:
    print(f"  import {name}: {cumulative / 1e6:.2f} s (cumulative)")
PY
}

run_all() {  # run_all <label prefix> <PYTHONPATH prefix or "">
  local tag="$1" prefix="$2" name
  for name in "${commands[@]}"; do
    case "$name" in
      stage1) cold "$tag-stage1" "$prefix" llm_perf_opt.cli.stage1 ;;
      stage2) cold "$tag-stage2" "$prefix" llm_perf_opt.cli.stage2 ;;
      whatif) cold "$tag-whatif" "$prefix" llm_perf_opt.cli.whatif whatif=decode workload=ocr1-a4-page ;;
      batch64) cold "$tag-batch64" "$prefix" llm_perf_opt.cli.stage1 "${batch64[@]}" ;;
      *) echo "unknown command in COMMANDS: $name (stage1, stage2, whatif, batch64)" >&2; exit 2 ;;
    esac
  done
}

if [ -n "${COMPILE_PACKAGES:-}" ]; then
  IFS=: read -r -a entries <<< "${PYTHONPATH:-}"
  for entry in "${entries[@]}"; do
    if [ -d "$entry" ] && [ "$(cd "$entry" && pwd)" != "$(cd "$(dirname "$0")/../src" && pwd)" ]; then
      # a file that does not compile (a package's test data) is left as it is, as pip leaves it
      python3 -m compileall -q -j 0 "$entry" >/dev/null 2>&1 || true
    fi
  done
fi
if [ -n "$before_src" ]; then
  run_all before "$before_src"
fi
run_all after ""

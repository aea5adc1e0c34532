# Shared by the bench scripts (source it): the bundled A4 page, this GPU's name, and one timed toolkit run.
# shellcheck disable=SC2034  # page and device are read by the scripts that source this file
page='dataset.subset_filelist=${llo_samples_dir:}/lists/a4_page.txt'
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)

# timed_module <out> <label> <PYTHONPATH prefix or ""> <module> [overrides...]: `python3 -m <module>` on the A4 page
# into <out>/<label> (its output in <out>/<label>.log); the seconds it took end to end in $elapsed.
timed_module() {
  local out="$1" label="$2" prefix="$3" module="$4" start
  shift 4
  start=$(date +%s.%N)
  PYTHONPATH="${prefix:+$prefix:}${PYTHONPATH:-}" python3 -m "$module" "$page" "$@" "hydra.run.dir=$out/$label" \
    >"$out/$label.log" 2>&1 || echo "$label: exit $? (see $out/$label.log)"
  elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
}

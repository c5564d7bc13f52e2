#!/usr/bin/env bash
# The autopilot on a GPU from HarnessGym's own baseline kernel (issue 30, item 5): the
# HarnessGym-shaped task of tests/harnessgym/task imported with `--entry
# kernel.py:fused_rmsnorm_silu_gate` (an rmsnorm_gate kernel task: hidden cases, guarded verify),
# `harnesslab run --runner autopilot` for AP_BUDGET seconds (no new iteration after it), then the
# baseline and the best kernel scored by HarnessGym's protocol too: its verifier's final mode
# (best of --repeats event-timed calls per case, summed), on HarnessGym's four final cases
# (1536x1024, 896x2048, 448x4096, 192x8192 fp16; the fixture's own final cases are CPU-sized).
# Run after an install that puts harnesslab on PYTHONPATH (session_gpu.sh PARTS=autopilot).
# Prints the score curve (verified score and best so far against wall time and iterations) and
# the two protocols side by side; the summary goes to $OUT/autopilot_summary.json.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HL=${HL:-python3 -m harnesslab.servers}
T=$(mktemp -d)
$HL import harnessgym tests/harnessgym/task --out "$T/task" --name hg_rmsnorm \
  --entry kernel.py:fused_rmsnorm_silu_gate >/dev/null || exit 1
$HL init --task "$T/task" -w "$T/ws" >/dev/null || exit 1
python3 - "$T/cases.json" <<'PY'
import json, sys
cases = [{"name": f"hg_{r}x{d}", "rows": r, "dim": d, "seed": 2700 + i}
         for i, (r, d) in enumerate(((1536, 1024), (896, 2048), (448, 4096), (192, 8192)))]
json.dump({"cases": cases}, open(sys.argv[1], "w"))
PY
seed_verify() {  # $1: a folder with kernel.py and kernel_config.json -> HarnessGym's best_us
  local d=$T/seed_$2; mkdir -p "$d"; cp tests/harnessgym/task/{benchmark.py,verifier.py} "$d/"
  cp "$1/kernel.py" "$1/kernel_config.json" "$d/"
  for i in 1 2 3; do
    (cd "$d" && python3 verifier.py --json --mode final --warmup 10 --repeats 20 --cases-file "$T/cases.json") \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print('$2 run $i: HarnessGym best_us', r['best_us'], r['status'], r['config'])"
  done
}
seed_verify "$T/ws" baseline
t0=$(date +%s)
timeout "${AP_S:-480}" $HL run -w "$T/ws" --runner autopilot --iterations 50 --budget "${AP_BUDGET:-300}" --json \
  > "$OUT/autopilot_summary.json" 2>"$OUT/autopilot.err"
echo "autopilot rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/autopilot.err"
python3 "$(dirname "$0")/autopilot_summary.py" "$OUT/autopilot_summary.json"
echo "best config: $(cat "$T/ws/kernel_config.json" | tr -d '\n')"
seed_verify "$T/ws" best

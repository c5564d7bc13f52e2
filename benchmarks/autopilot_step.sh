#!/usr/bin/env bash
# The autopilot on a GPU on the decode-step task (issue 32): `harnesslab init --task decode_step`
# (the PyTorch-eager step as the workspace), then `harnesslab run --runner autopilot` for
# AP_BUDGET seconds (no new iteration after it): the score curve (the step verify's timed score:
# the sum over hidden traces of each trace's p50 step latency), the best and the final re-verify.
# Then each turn's tool calls with their durations (the autopilot's transcript). Run after an
# install that puts harnesslab on PYTHONPATH (session_gpu.sh PARTS=apstep).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HL=${HL:-python3 -m harnesslab.servers}
T=$(mktemp -d)
$HL init --task "${AP_TASK:-decode_step}" -w "$T/ws" >/dev/null || exit 1
t0=$(date +%s)
timeout "${AP_S:-420}" $HL run -w "$T/ws" --runner autopilot --iterations 50 --budget "${AP_BUDGET:-240}" --json \
  > "$OUT/autopilot_step_summary.json" 2>"$OUT/autopilot_step.err"
echo "autopilot rc=$? in $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/autopilot_step.err"
python3 "$(dirname "$0")/autopilot_summary.py" "$OUT/autopilot_step_summary.json"
# Where an iteration's time went: every autopilot tool call (the turn's stdout is its transcript),
# even from a run the limit cut short.
find "$T/ws/.harnesslab/runs" -name stdout.txt 2>/dev/null | sort | while read -r f; do
  echo "-- ${f#*/runs/}"
  python3 - "$f" <<'PY'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("event") == "call":
        print(f"  {r['tool']:26s} {r['duration_s']:8.1f} s  error={r['is_error']}")
PY
done

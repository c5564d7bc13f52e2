#!/usr/bin/env bash
# GPU evidence for issue 4 (SSH end to end), issue 7 (autopilot loop on the GPU), issue 5
# (guarded verify on the GPU) and issue 8 (full lab matrix), each capped in time. A device call
# is limited to 10 minutes; measured on an H200 (2026-11-21), two calls hold it all:
#   PARTS=ssh,autopilot,lab SSH_S=140 AP_S=140 LAB_S=300 bash benchmarks/gpu_final.sh  (~5 min)
#   PARTS=integrity INT_PARTS=repeat,cost,honest,corpus INT_S=560 bash benchmarks/gpu_final.sh
#                                                                                  (~9 min)
# carrying .whl (mcp, asyncssh, pydantic... as cp312 wheels). Everything lands in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/final.log"
exec > >(tee -a "$LOG") 2>&1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
rm -rf /tmp/hl /tmp/site /root/.local/state/harnesslab /tmp/ap
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/hl . >/dev/null 2>&1 || { echo "package install failed"; exit 1; }
export PYTHONPATH=/tmp/hl:/tmp/site
HL="python3 -m harnesslab.servers"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PARTS=${PARTS:-ssh,autopilot,integrity,lab}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has ssh; then
el "== issue 4: SSH end to end"
timeout ${SSH_S:-240} python3 benchmarks/bench_ssh_e2e.py --calls 6 --configs 32 --serial-configs 8 > "$OUT/ssh.txt" 2>"$OUT/ssh.err"; echo "ssh rc=$?"; cat "$OUT/ssh.txt"
fi
if has autopilot; then
el "== issue 7: autopilot loop on the GPU"
timeout ${AP_S:-240} $HL run --task rmsnorm_gate -w /tmp/ap --iterations 2 --runner autopilot --json > "$OUT/autopilot.json" 2>"$OUT/autopilot.err"; echo "autopilot rc=$?"
python3 -c "
import json,sys
try:
    s=json.load(open('$OUT/autopilot.json')); print({k: s.get(k) for k in ('status','baseline_score','best_score','iterations','gpu_seconds','meaningful','device') if k in s}); print(json.dumps(s)[:1500])
except Exception as e: print('autopilot summary unreadable', e); print(open('$OUT/autopilot.err').read()[-1500:])
"
fi
if has lab; then
el "== issue 8: lab matrix"
timeout ${LAB_S:-350} python3 benchmarks/lab_gpu.py --out /tmp/lab --budget-s $(( ${LAB_S:-350} - 20 )) 2>/tmp/lab.err | tee "$OUT/lab.txt" | tail -30; echo "lab rc=$?"
cp /tmp/lab/results.json "$OUT/lab_results.json" 2>/dev/null || tail -5 /tmp/lab.err
fi
if has integrity; then
el "== issue 5: guarded verify on the GPU"
timeout ${INT_S:-220} python3 benchmarks/integrity_gpu.py --parts ${INT_PARTS:-corpus,honest,repeat,cost} --repeats 20 --budget-s $(( ${INT_S:-220} - 30 )) --json "$OUT/integrity${INT_TAG:-}.json" 2>"$OUT/integrity${INT_TAG:-}.err" | tee "$OUT/integrity${INT_TAG:-}.txt" | tail -60; echo "integrity rc=$?"
fi
el "done"

#!/usr/bin/env bash
# One device call for the foundation issue: benchmark matrix, ncu agreement, eval repeatability.
# Run from the repo root on the GPU machine with the carried wheels in .whl/.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
rm -rf /tmp/hl /tmp/ws /root/.local/state/harnesslab
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/hl . >/dev/null 2>&1 || { echo "package install failed"; exit 1; }
export PYTHONPATH=/tmp/hl:/tmp/site
HL="python3 -m harnesslab.servers"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"

echo "== toolkit eval: baseline, then the solution twice (repeatability)"
$HL init /tmp/ws >/dev/null
$HL eval -w /tmp/ws --json > "$OUT/eval_baseline.json"; echo "baseline rc=$?"
cp tasks/rmsnorm_gate/solutions/fast.py /tmp/ws/kernel.py
$HL eval -w /tmp/ws --json > "$OUT/eval_sol1.json"; echo "sol1 rc=$?"
$HL eval -w /tmp/ws --json > "$OUT/eval_sol2.json"; echo "sol2 rc=$?"
$HL verify -w /tmp/ws --json > "$OUT/verify_sol.json"; echo "verify rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def load(n):
    try: return json.load(open(f"{out}/{n}"))
    except Exception as e: return {"status": f"unreadable {e}", "cases": []}
b, s1, s2 = load("eval_baseline.json"), load("eval_sol1.json"), load("eval_sol2.json")
print("baseline", b.get("status"), b.get("score_us"), b.get("reason","")[:200])
print("solution", s1.get("status"), s1.get("score_us"), s1.get("reason","")[:200])
for c1, c2, cb in zip(s1.get("cases", []), s2.get("cases", []), b.get("cases", [])):
    m1, m2 = c1.get("median_us"), c2.get("median_us")
    d = abs(m1 - m2) / m1 * 100 if m1 and m2 else float("nan")
    print(f"{c1['name']:16s} {c1.get('timing_method')} tail {c1.get('sync_tail_us') or 0:5.1f} base {cb.get('median_us') or 0:8.2f} launch {cb.get('launch_overhead_us') or 0:6.1f} | sol {m1 or 0:8.2f} / {m2 or 0:8.2f} us  diff {d:4.1f}%  {c1.get('pct_of_copy_bw') or 0:5.1f}% copy  spread {c1.get('spread') or 0:.3f} {c1.get('timing_method')}")
v = load("verify_sol.json")
print("verify", v.get("verdict"), v.get("score_us"), v.get("geomean_pct_of_copy_bw"), [r.get("code") for r in v.get("reasons", [])][:5])
PY

echo "== ncu vs runner on 4096x8192 fp16 (solution)"
timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:rmsnorm --csv \
  python3 benchmarks/bench_rmsnorm_gate.py --ncu-target > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; echo "ncu rc=$?"
python3 - "$OUT" <<'PY'
import csv, json, sys, statistics
out = sys.argv[1]
lines = open(f"{out}/ncu.csv").read().splitlines()
ev = json.load(open(f"{out}/eval_sol1.json"))
runner = {"runner_median_us": next((c["median_us"] for c in ev["cases"] if c["name"] == "4096x8192_fp16"), None)}
rows = [r for r in csv.reader(l for l in lines if l.startswith('"'))]
hdr, data = rows[0], rows[1:]
iv = hdr.index("Metric Value"); iu = hdr.index("Metric Unit")
vals = []
for r in data:
    v = float(r[iv].replace(",", "")); u = r[iu]
    vals.append({"ns": v / 1000, "nsecond": v / 1000, "us": v, "usecond": v, "ms": v * 1000, "msecond": v * 1000}[u])
ncu = statistics.median(vals) if vals else float("nan")
rm = runner.get("runner_median_us") or float("nan")
print(f"ncu gpu__time_duration median {ncu:.2f} us over {len(vals)} kernels; runner median {rm:.2f} us; diff {abs(rm-ncu)/ncu*100:.1f}%")
PY

echo "== benchmark matrix"
timeout 330 python3 benchmarks/bench_rmsnorm_gate.py --out "$OUT/bench.json" 2> "$OUT/bench.log"; echo "bench rc=$?"
tail -3 "$OUT/bench.log"

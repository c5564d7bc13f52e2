#!/usr/bin/env bash
# rmsnorm_gate's strategies (baseline, solution, FLA, torch.compile) on the HarnessGym task's four
# final cases (1536x1024, 896x2048, 448x4096, 192x8192, fp16), through the lab's protocol, from a
# copy of tasks/ whose rmsnorm_gate matrix is those four cases. Run after an install that puts
# harnesslab and the peers on PYTHONPATH (benchmarks/perf_gpu.sh does). Prints the lab's table;
# the summed device time per strategy is the last lines. OUT_DIR: where results.json goes.
set -uo pipefail
T=$(mktemp -d); cp -r tasks "$T/tasks"
python3 - "$T/tasks/rmsnorm_gate/task.toml" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
cases = "".join(
    f'\n[[lab.cases]]\ndtype = "float16"\nshape = {{ rows = {r}, dim = {d} }}\n'
    for r, d in ((1536, 1024), (896, 2048), (448, 4096), (192, 8192))
)
s = s.replace("[lab]\n", "[lab]\nmin_elements = 0\n", 1).replace("min_elements = 16777216\n", "", 1)
open(p, "w").write(s + cases)
PY
timeout "${HG_S:-150}" python3 benchmarks/lab_gpu.py --tasks rmsnorm_gate --tasks-root "$T/tasks" --no-ncu \
  --out "${OUT_DIR:-$T/out}" --budget-s $(( ${HG_S:-150} - 20 )) 2>"$T/err" | tail -12
python3 - "${OUT_DIR:-$T/out}/results.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d.get("rows", d if isinstance(d, list) else []) if isinstance(r, dict)]
sums = {}
for r in rows:
    if r.get("task") == "rmsnorm_gate" and r.get("median_us") and r.get("passed"):
        sums.setdefault(r.get("strategy"), []).append(r["median_us"])
for k, v in sorted(sums.items()):
    print(f"sum over {len(v)} cases | {k} | {sum(v):.1f} us")
PY

#!/usr/bin/env bash
# HarnessGym's protocol per case: tests/harnessgym/task's verifier (final mode, --warmup 10
# --repeats 20: the best of 20 event-timed single calls per case) on HarnessGym's four final
# cases, RUNS times for each kernel_config.json given as an argument, printing every case's
# best_us and median_us. Shows where autopilot_hg.sh's two protocols part.
#   bash benchmarks/hg_verifier_configs.sh '{"num_warps": 4}' '{"num_warps": 8}'
set -uo pipefail
T=$(mktemp -d)
python3 - "$T/cases.json" <<'PY'
import json, sys
cases = [{"name": f"hg_{r}x{d}", "rows": r, "dim": d, "seed": 2700 + i}
         for i, (r, d) in enumerate(((1536, 1024), (896, 2048), (448, 4096), (192, 8192)))]
json.dump({"cases": cases}, open(sys.argv[1], "w"))
PY
cp tests/harnessgym/task/{benchmark.py,verifier.py,kernel.py} "$T/"
for config in "$@"; do
  echo "$config" > "$T/kernel_config.json"
  for i in $(seq 1 "${RUNS:-5}"); do
    (cd "$T" && python3 verifier.py --json --mode final --warmup 10 --repeats 20 --cases-file "$T/cases.json") |
      python3 -c "
import json, sys
r = json.load(sys.stdin)
cells = ' '.join(f\"{c['name']} {c.get('best_us') or 0:.1f}/{c.get('median_us') or 0:.1f}\" for c in r['cases'])
print(f\"{json.dumps(r['config'])} run $i: best_us {r['best_us']:.1f} | per case best/median us: {cells}\")"
  done
done

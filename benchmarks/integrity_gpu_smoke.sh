#!/usr/bin/env bash
# Raw guarded runner on a GPU, no harnesslab install needed (torch + triton only): the guard's
# verify mode on a few kernels, printing each case's per-call codes and timing records.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=/tmp/hlstage; rm -rf $S; mkdir -p $S/tasks $S/candidates
cp tools/gpu/runner.py tools/gpu/guard.py tools/gpu/guard_gpu.py tools/gpu/guard_child.py $S/
cp -r tasks/rmsnorm_gate $S/tasks/
for k in "$@"; do
  mkdir -p $S/candidates/$(basename $k .py); cp $k $S/candidates/$(basename $k .py)/kernel.py
  cp tasks/rmsnorm_gate/workspace/kernel_config.json $S/candidates/$(basename $k .py)/
done
python3 - "$S" "$@" <<'PY'
import json, subprocess, sys, time, os
S = sys.argv[1]
for k in sys.argv[2:]:
    name = os.path.basename(k)[:-3]
    req = {"mode": "verify", "candidate_dir": f"{S}/candidates/{name}", "entry": "kernel.py:rmsnorm_gate",
           "config_file": "kernel_config.json", "nonce": "n",
           "tolerances": {"float16": {"atol": 4e-3, "rtol": 4e-3}, "bfloat16": {"atol": 3.2e-2, "rtol": 1.6e-2}},
           "cases": [{"name": "a", "dtype": "float16", "shape": {"rows": 4096, "dim": 8192}},
                     {"name": "b", "dtype": "bfloat16", "shape": {"rows": 333, "dim": 3000}}],
           "seed": 1, "checks": 3, "reference": f"{S}/tasks/rmsnorm_gate/reference.py"}
    if name == "fast":
        req["baseline_dir"] = f"{S}/candidates/kernel"
    open(f"{S}/req.json", "w").write(json.dumps(req))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, f"{S}/runner.py", f"{S}/req.json"], capture_output=True, text=True, cwd=S)
    wall = time.perf_counter() - t0
    res = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    r = next((x for x in res if x.get("event") == "result"), {})
    print(f"== {name}: rc {p.returncode} wall {wall:.1f}s runner {r.get('runner_wall_s')} err {r.get('error')} {r.get('reason')}")
    if not r: print(p.stderr[-3000:])
    for c in r.get("cases", []):
        bad = [(x["role"], x["kind"], x["codes"]) for x in c["calls"] if x["codes"]]
        print("  case", c["name"], "calls", len(c["calls"]), "bad", bad[:4], "nc", c.get("null_control"))
        prof = [x.get("profile") for x in c["calls"] if x.get("profile")]
        print("  profile", prof[:1])
        for role, t in (c.get("timing") or {}).items():
            s = t["samples_us"]
            print(f"  timing {role}: {t['method']} calls {t['calls_per_sample']} sets {t['input_sets']} med {sorted(s)[len(s)//2] if s else None} wall/sample {sorted(t['parent_wall_us'])[len(s)//2] if s else None} bad {t['bad_calls']}/{t['checked_calls']} codes {t['codes'][:3]} err {t.get('capture_error')}")
    json.dump(r, open(f"{os.environ.get('OUT','/tmp')}/{name}.json", "w"))
    if p.returncode: print(p.stderr[-2000:])
PY

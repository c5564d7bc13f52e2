#!/usr/bin/env bash
# GPU evidence for issue 18 (faster loops, kernels ahead of the peers) in ONE device call of
# under 540 s, carrying .whl (benchmarks/fetch_wheels.sh: mcp, asyncssh, pydantic... and the
# lab's peers fla-core, liger-kernel, einops). Parts, each selectable and each under its own
# time limit (defaults sum to ~520 s with the install):
#   sweep      32-config sweep over the dev cases on the warm compile pool (cold pool, then warm
#              pool on a changed candidate) vs the serial single-process path, same run:
#              configs/min, compile and timing phases                         -> $OUT/sweep.json
#   objective  warm run_objective round trip over SSH (in-process asyncssh on loopback), the
#              per-phase breakdown, two back-to-back evals' per-case agreement -> $OUT/objective.json
#   lab        the lab matrix, every task, with torch.compile and the peers (FLA, Liger, cuBLAS);
#              results.json and the report (report.md, results.csv, plots) for
#              docs/lab/<date>-<device>/                -> $OUT/lab_results.json, $OUT/lab_report.tgz
# Everything printed also goes to $OUT/perf.log. Run:
#   PARTS=sweep,objective,lab bash benchmarks/perf_gpu.sh        (carry: [".whl"])
# Limits: SWEEP_S (default 180), OBJ_S (70), LAB_S (240; the lab stops starting work 30 s early).
# Sizes (defaults: the issue's): SWEEP_CONFIGS=32 SERIAL_CONFIGS=8 OBJ_CALLS=8; LAB_ARGS adds
# lab_gpu.py options (a CPU dry run: LAB_ARGS="--tasks swiglu --max-cases 1 --interpret always").
# For a fuller lab matrix, a second call: PARTS=lab LAB_S=520 bash benchmarks/perf_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/perf.log") 2>&1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
W=${PERF_TMP:-/tmp/hlperf}  # everything this script writes outside $OUT (the benches use temp dirs)
rm -rf "$W"; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" .whl/*.whl || exit 1
if [[ -z "${USE_INSTALLED:-}" ]]; then  # USE_INSTALLED=1: the harnesslab already importable (CPU dry run)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$W/hl" . >/dev/null 2>&1 || { echo "package install failed"; exit 1; }
fi
export PYTHONPATH=$W/hl:$W/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
PARTS=${PARTS:-sweep,objective,lab}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
el "install done; parts: $PARTS"
if has sweep; then
  el "== sweep: warm compile pool vs serial single process"
  timeout "${SWEEP_S:-180}" python3 benchmarks/bench_ssh_e2e.py --parts sweep --configs "${SWEEP_CONFIGS:-32}" \
    --serial-configs "${SERIAL_CONFIGS:-8}" --sweeps 2 --json "$OUT/sweep.json" 2>"$OUT/sweep.err"
  echo "sweep rc=$?"; tail -5 "$OUT/sweep.err"
fi
if has objective; then
  el "== objective: warm run_objective over SSH, breakdown, back-to-back agreement"
  timeout "${OBJ_S:-70}" python3 benchmarks/bench_ssh_e2e.py --parts objective --calls "${OBJ_CALLS:-8}" \
    --breakdown --json "$OUT/objective.json" 2>"$OUT/objective.err"
  echo "objective rc=$?"; tail -5 "$OUT/objective.err"
fi
if has lab; then
  el "== lab matrix with peers"
  python3 -c "
for mod in ('fla.modules.fused_norm_gate', 'liger_kernel.ops.swiglu', 'liger_kernel.ops.softmax'):
    try:
        __import__(mod); print('peer import ok:', mod)
    except Exception as exc:
        print('peer import FAILED:', mod, type(exc).__name__, exc)
" 2>&1 | grep -v Warning
  LAB=${LAB_S:-240}
  # shellcheck disable=SC2086  # LAB_ARGS is a list of options
  timeout "$LAB" python3 benchmarks/lab_gpu.py --out "$W/lab" --budget-s $(( LAB - 30 )) ${LAB_ARGS:-} \
    2>"$W/lab.err" | tail -40
  echo "lab rc=$?"
  if cp "$W/lab/results.json" "$OUT/lab_results.json" 2>/dev/null; then
    DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00' | tr 'A-Z' 'a-z')
    NAME="$(date +%Y-%m-%d)-${DEV:-gpu}"
    python3 -m harnesslab.servers lab --from-results "$W/lab/results.json" --out "$W/labrep/$NAME" \
      2>>"$W/lab.err" | tail -5
    tar -C "$W/labrep" -czf "$OUT/lab_report.tgz" "$NAME" && echo "report: docs/lab/$NAME (lab_report.tgz)"
  else
    tail -20 "$W/lab.err"
  fi
fi
el "done"

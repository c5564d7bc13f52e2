#!/usr/bin/env bash
# One device call of GPU evidence for Integrity 3.0 (issue 25), any op (26), performance (30) and
# CUDA C++ (31), built from the project's own scripts. Each part runs under its own limit and
# never stops the next; everything printed also goes to $OUT/session.log. Carry .whl
# (benchmarks/fetch_wheels.sh: mcp, asyncssh, pydantic, pytest, the lab's peers).
#   PARTS=gputests,corpus,honest bash benchmarks/session_gpu.sh          (~9 min on an H100)
#   PARTS=sweep,objective,variants,repeat bash benchmarks/session_gpu.sh (~9 min)
#   PARTS=kernelbench,cuda,hg bash benchmarks/session_gpu.sh             (~8 min)
#   PARTS=cudavariants bash benchmarks/session_gpu.sh                    (~4 min: 3.5 + install)
# TESTS_K selects tests/gpu tests by keyword (-k); TASK the task of honest, repeat, fresh, concurrent.
# Parts:
#   gputests     pytest -m gpu tests/gpu (the guarded verify, CUDA in the sandbox, CUDA kernels)
#   corpus       every cheat of tools/integrity/cheats/ through the guarded verify (integrity_gpu.py)
#   honest       baseline, the tasks' solutions and the honest twins must pass
#   repeat       REPEATS guarded verifies of rmsnorm_gate's fast.py: false rejections, spread, cost
#   fresh        REPEATS guarded verifies of fast.py, each in a fresh state dir: all must pass
#   concurrent   four guarded verifies at once in one state dir against one alone (<= 2x)
#   sweep        32-config sweep on the warm compile pool against the serial path (bench_ssh_e2e.py;
#                SWEEP_LANGS="triton cuda": each template in turn, CUDA C++'s whole space is 20)
#   objective    warm run_objective over SSH, phases, back-to-back agreement (bench_ssh_e2e.py)
#   timingab     TAB_VARIANTS of timing.py (timing_variants.py): the per-case phases and warm run_objective
#   agreement    back-to-back agreement of the isolated cases under several sampling caps (agreement_gpu.py:
#                AGR_ARGS, e.g. "--rounds 40 --variants 30:1,30:4,60:4")
#   stepreplay   the step verify's record and replay in one process (step_replay_gpu.py: the eager
#                baseline and the Triton solution recorded, checked, captured, replayed, timed)
#   stepverify   the decode_step guarded verify with and without its replay (step_verify_gpu.py:
#                SV_ARGS, e.g. "--modes gpu,never --candidates eager,triton")
#   objab        OBJ_VARIANTS of the installed package (package_variants.py): warm run_objective each
#   variants     rmsnorm_gate's solution, its variants and the peers (rmsnorm_variants_gpu.py)
#   cudavariants the CUDA rmsnorm_gate solution's plan variants (cache hints, launch bounds, threads
#                per row, persistent rows) beside FLA, Liger and torch.compile on the lab's shapes and
#                HarnessGym's four: the plan to ship per shape class (rmsnorm_cuda_variants_gpu.py;
#                CV_S the limit, 210 s; CV_ARGS e.g. "--repeats 3", "--no-torch-compile",
#                "--variants t512,words"); the table is the last 45 lines, the rest in its JSON
#   kernelbench  three imported KernelBench problems through eval and verify (kernelbench_gpu.sh)
#   cuda         CUDA C++ solutions against the Triton ones, NVRTC compile times (cuda_gpu.py)
#   hg           rmsnorm_gate on HarnessGym's four final cases (hg_final_cases.sh)
#   autopilot    the autopilot from HarnessGym's baseline kernel for AP_BUDGET s (autopilot_hg.sh)
#   apstep       the autopilot on decode_step for AP_BUDGET s (autopilot_step.sh)
#   lab          the lab matrix of LAB_TASKS (CUDA column, peers, ncu) into $OUT/lab (lab_gpu.py)
#   profile      profile_kernel on rmsnorm_gate's Triton and CUDA templates (profile_gpu.py: PROF_ARGS)
#   ncuprobe     ncu on one strategy over chosen cases (ncu_strategy_gpu.py: NCU_ARGS)
#   hgproto      HarnessGym's verifier per case over HG_CONFIGS (hg_verifier_configs.sh)
#   stepdiag     the timed pass as the candidate's process sees it (step_timed_diag.py; patches the
#                session's own install, so run it last)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/session.log") 2>&1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
W=/tmp/hlsession; rm -rf "$W" /root/.local/state/harnesslab; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$W/hl" . >/dev/null 2>&1 || { echo "package install failed"; exit 1; }
export PYTHONPATH=$W/hl:$W/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
el "installed"
PARTS=${PARTS:-gputests,corpus,honest}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has gputests; then
  el "== pytest -m gpu tests/gpu"
  timeout "${TESTS_S:-150}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu ${TESTS_K:+-k "$TESTS_K"} \
    --durations=15 ${TESTS_ARGS:-} 2>&1 | tail -45
  echo "gputests rc=${PIPESTATUS[0]}"
fi
for part in corpus honest repeat fresh concurrent; do
  if has $part; then
    el "== integrity: $part"
    limit_var="${part^^}_S"; limit=${!limit_var:-300}
    timeout "$limit" python3 benchmarks/integrity_gpu.py --parts $part --repeats "${REPEATS:-8}" --cheats "${CHEATS:-}" --task "${TASK:-rmsnorm_gate}" \
      --budget-s $(( limit - 40 )) --json "$OUT/integrity_$part.json" 2>"$OUT/integrity_$part.err" | tail -60
    echo "$part rc=${PIPESTATUS[0]}"; tail -3 "$OUT/integrity_$part.err"
  fi
done
if has sweep; then
  for lang in ${SWEEP_LANGS:-triton}; do  # one language after the other, same machine
    el "== sweep ($lang)"
    timeout "${SWEEP_S:-170}" python3 benchmarks/bench_ssh_e2e.py --parts sweep --configs 32 --serial-configs 8 \
      --language "$lang" --json "$OUT/sweep_$lang.json" 2>"$OUT/sweep_$lang.err" | tail -30
    echo "sweep ($lang) rc=${PIPESTATUS[0]}"; tail -3 "$OUT/sweep_$lang.err"
  done
fi
if has objective; then
  el "== objective"
  timeout "${OBJ_S:-80}" python3 benchmarks/bench_ssh_e2e.py --parts objective --calls 8 --breakdown \
    --json "$OUT/objective.json" 2>"$OUT/objective.err" | tail -30; echo "objective rc=${PIPESTATUS[0]}"
fi
if has timingab; then  # TAB_VARIANTS (benchmarks/timing_variants.py), each in turn on the same machine
  cp "$W/hl/harnesslab/tools/gpu/timing.py" /tmp/timing_pristine.py
  for v in ${TAB_VARIANTS:-base}; do vf=${v//+/_}
    el "== timing variant $v"
    python3 benchmarks/timing_variants.py "$v" /tmp/timing_pristine.py "$W/hl/harnesslab/tools/gpu/timing.py" || continue
    rm -rf /tmp/flatgpu && mkdir /tmp/flatgpu && cp tools/gpu/*.py /tmp/flatgpu/ \
      && cp "$W/hl/harnesslab/tools/gpu/timing.py" /tmp/flatgpu/timing.py
    timeout "${TAB_PH_S:-60}" python3 benchmarks/timing_phases_gpu.py --rounds 3 --gpu-dir /tmp/flatgpu 2>&1 | tail -12
    timeout "${OBJ_S:-80}" python3 benchmarks/bench_ssh_e2e.py --parts objective --calls "${TAB_CALLS:-8}" --breakdown \
      --json "$OUT/objective_$vf.json" 2>"$OUT/objective_$vf.err" | grep -E "run_objective round trip|worst|runner_timing|runner_other|  sync |runner_correctness"; echo "objective ($v) rc=${PIPESTATUS[0]}"
  done
  cp /tmp/timing_pristine.py "$W/hl/harnesslab/tools/gpu/timing.py"
fi
if has agreement; then
  el "== agreement of the isolated cases"
  timeout "${AGR_S:-240}" python3 benchmarks/agreement_gpu.py ${AGR_ARGS:-} 2>&1 | tail -40
fi
if has stepreplay; then
  el "== the step verify's record and replay"
  timeout "${SR_S:-180}" python3 benchmarks/step_replay_gpu.py ${SR_ARGS:-} 2>&1 | tail -30
fi
if has stepverify; then
  el "== the step verify with and without its replay"
  timeout "${SV_S:-480}" python3 benchmarks/step_verify_gpu.py ${SV_ARGS:-} 2>&1 | tail -30
fi
if has objab; then  # OBJ_VARIANTS (benchmarks/package_variants.py), each in turn on the same machine
  for v in ${OBJ_VARIANTS:-base}; do vf=${v//+/_}
    el "== package variant $v"
    python3 benchmarks/package_variants.py "$v" "$W/hl/harnesslab" /tmp/pkg_pristine || continue
    timeout "${OBJ_S:-80}" python3 benchmarks/bench_ssh_e2e.py --parts objective --calls "${TAB_CALLS:-8}" --breakdown \
      --json "$OUT/objective_$vf.json" 2>"$OUT/objective_$vf.err" | grep -E "run_objective round trip|worst|runner_|  sync |  stage "; echo "objective ($v) rc=${PIPESTATUS[0]}"
  done
  python3 benchmarks/package_variants.py base "$W/hl/harnesslab" /tmp/pkg_pristine
fi
if has variants; then
  el "== rmsnorm_gate variants"
  timeout "${VAR_S:-230}" python3 benchmarks/rmsnorm_variants_gpu.py --out "$OUT" --budget-s $(( ${VAR_S:-230} - 15 )) \
    2>"$OUT/variants.err" | tail -45; echo "variants rc=${PIPESTATUS[0]}"
fi
if has cudavariants; then
  el "== rmsnorm_gate CUDA plan variants"
  timeout "${CV_S:-210}" python3 benchmarks/rmsnorm_cuda_variants_gpu.py --out "$OUT" --budget-s $(( ${CV_S:-210} - 15 )) \
    ${CV_ARGS:-} 2>"$OUT/cudavariants.err" | tail -45; echo "cudavariants rc=${PIPESTATUS[0]}"; tail -3 "$OUT/cudavariants.err"
fi
if has kernelbench; then
  el "== KernelBench"
  HL="python3 -m harnesslab.servers" timeout "${KB_S:-300}" bash benchmarks/kernelbench_gpu.sh 2>&1 | tail -40
fi
if has cuda; then
  el "== CUDA C++"
  timeout "${CUDA_S:-150}" python3 benchmarks/cuda_gpu.py --repeats 20 ${CUDA_ARGS:-} 2>"$OUT/cuda.err" | tail -40
  echo "cuda rc=${PIPESTATUS[0]}"; tail -3 "$OUT/cuda.err"
fi
if has hg; then
  el "== HarnessGym final cases"
  OUT_DIR="$OUT/hg" timeout "${HG_S:-90}" bash benchmarks/hg_final_cases.sh 2>&1 | tail -15
fi
if has autopilot; then
  el "== autopilot from HarnessGym's baseline"
  AP_S=${AP_S:-420} timeout $(( ${AP_S:-420} + 100 )) bash benchmarks/autopilot_hg.sh 2>&1 | tail -40
fi
if has apstep; then
  el "== autopilot on decode_step"
  AP_S=${AP_S:-420} timeout $(( ${AP_S:-420} + 60 )) bash benchmarks/autopilot_step.sh 2>&1 | tail -30
fi
if has lab; then
  el "== lab"
  timeout "${LAB_S:-400}" python3 benchmarks/lab_gpu.py --out "$OUT/lab" --tasks "${LAB_TASKS:-rmsnorm_gate,softmax,swiglu}" \
    --budget-s $(( ${LAB_S:-400} - 30 )) 2>"$OUT/lab.err" | tail -40; echo "lab rc=${PIPESTATUS[0]}"; tail -3 "$OUT/lab.err"
fi
if has profile; then
  el "== profile_kernel (ncu through the tool's path)"
  timeout "${PROF_S:-150}" python3 benchmarks/profile_gpu.py ${PROF_ARGS:-} 2>&1 | tail -10
fi
if has ncuprobe; then
  el "== ncu probe"
  timeout "${NCU_S:-150}" python3 benchmarks/ncu_strategy_gpu.py ${NCU_ARGS:-} 2>&1 | tail -40
fi
if has hgproto; then
  el "== HarnessGym's protocol per case"
  timeout "${HGP_S:-120}" bash benchmarks/hg_verifier_configs.sh '{"num_warps": 4, "rows_per_program": 1}' \
    '{"num_warps": 8, "rows_per_program": 1}' 2>&1 | tail -20
fi
if has stepdiag; then
  el "== timed pass, the child's side"
  cp -r "$W/hl/harnesslab/tools/gpu" /tmp/gpu_pristine
  for variant in ${SD_VARIANTS:-none}; do  # SWITCH_S[,SPIN_S]; "none": nothing changed
    rm -rf "$W/hl/harnesslab/tools/gpu" && cp -r /tmp/gpu_pristine "$W/hl/harnesslab/tools/gpu"
    rm -f /tmp/kid_stderr.log /tmp/kid_stderr.log.parent; echo "variant $variant"
    python3 benchmarks/step_timed_diag.py patch "$W/hl/harnesslab" /tmp/kid_stderr.log ${variant//,/ }
    timeout "${SD_S:-330}" python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_decode_step_gpu.py \
      -k "${SD_K:-lower_p50}" 2>&1 | grep -E "^(eager|solution)|passed|failed" | tail -6
    python3 benchmarks/step_timed_diag.py report /tmp/kid_stderr.log
  done
fi
el "done"

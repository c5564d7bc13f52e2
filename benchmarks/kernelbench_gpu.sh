#!/usr/bin/env bash
# GPU evidence for issue 26: three KernelBench problems imported from tests/tasks/kernelbench/
# (an elementwise op, a conv as a KernelBench `ModelNew` class, a pooling as a `model_new`
# function), each with our Triton solution through eval (dev case: the file's full size) and the
# guarded verify (hidden sizes, sandboxed candidate, recorded and replayed launches).
#   OUT=/tmp/out bash benchmarks/kernelbench_gpu.sh        (~5 min on an H100; harnesslab
#                                                           importable, as in gpu_final.sh)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/kernelbench_gpu.log") 2>&1
HL=${HL:-python3 -m harnesslab.servers}
export HARNESSLAB_STATE_DIR=${HARNESSLAB_STATE_DIR:-/tmp/kb_gpu_state} HARNESSLAB_INTERPRET=never
SAMPLE=tests/tasks/kernelbench
rm -rf /tmp/kb_gpu && mkdir -p /tmp/kb_gpu/src
cp $SAMPLE/level1/19_ReLU.py $SAMPLE/level1/67_conv_standard_1D.py \
   $SAMPLE/level1/44_Average_Pooling_1D.py /tmp/kb_gpu/src/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$HL task import-kernelbench /tmp/kb_gpu/src --out /tmp/kb_gpu/tasks; echo "import rc=$?"
for t in kb_19_relu kb_67_conv_standard_1d kb_44_average_pooling_1d; do
  echo "== $t"
  $HL init --task /tmp/kb_gpu/tasks/$t -w /tmp/kb_gpu/ws_$t > /dev/null || continue
  cp $SAMPLE/solutions/$t.py /tmp/kb_gpu/ws_$t/kernel.py
  timeout 240 $HL eval -w /tmp/kb_gpu/ws_$t; echo "eval rc=$?"
  timeout 300 $HL verify -w /tmp/kb_gpu/ws_$t; echo "verify rc=$?"
done

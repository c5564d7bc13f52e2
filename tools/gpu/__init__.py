"""The files staged to the GPU host: standard library, torch and triton only, never harnesslab.

The launcher copies STAGED into `<stage>/harness/` (hash-checked against this package on every
call); they import each other by plain module name from that folder (the sibling import rule in
runner.py's docstring: the host imports them as this package's modules, mypy too). The lab
stages LAB beside the task folders, and TASK as a declared task's reference. The host imports a
few of them as modules too (wire for framing, ncu for the one ncu parser, scores for the one
score definition); tests/tools/gpu/test_staged.py checks that none imports harnesslab.

Side of the trust boundary: sandbox.py (with sandbox_policy.py, the typed policy and the one
way to start it, sandbox_confine.py, sandbox_limits.py and sandbox_mounts.py) is trusted up to
the exec of its target; runner.py (dev modes; with timing.py, scores.py, correctness.py, failures.py) runs
inside sandbox.py with the candidate; guard.py, guard_kid.py, guard_gpu.py, guard_schema.py and replay.py are the
guarded verify's trusted side; guard_child.py is the candidate's process; step_trace.py is a
step task's dev objective (the runner's step mode), run inside sandbox.py with the candidate's
step like the runner, so what it reports is dev feedback, never a verdict; modelnew.py (a
KernelBench `ModelNew` class as the entry) and harnesslab_cuda.py (with nvrtc.py and
cuda_source.py, imported by a CUDA kernel.py) run where the candidate runs.
"""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent  # the host runs sandbox.py from here, wire.py by path
STAGED = (
    "runner.py",
    "timing.py",
    "scores.py",
    "correctness.py",
    "failures.py",
    "sandbox.py",
    "sandbox_policy.py",
    "sandbox_confine.py",
    "sandbox_limits.py",
    "sandbox_mounts.py",
    "wire.py",
    "cudadrv.py",
    "guard.py",
    "guard_kid.py",
    "guard_gpu.py",
    "guard_schema.py",
    "guard_child.py",
    "guard_record.py",
    "phase_lock.py",
    "replay.py",
    "numerics.py",
    "modelnew.py",
    "step_trace.py",  # a step task's dev traces (the runner's step mode)
    "step_guard.py",  # a step task's guarded verify: the trusted parent ...
    "step_child.py",  # ... and the candidate's sandboxed process
    # CUDA C++ candidates: the launcher kernel.py imports, NVRTC, the source reader.
    "harnesslab_cuda.py",
    "nvrtc.py",
    "cuda_source.py",
)
LAB = ("runner.py", "timing.py", "scores.py", "correctness.py", "failures.py", "step_trace.py",
       "lab.py", "lab_step.py", "ncu.py", "modelnew.py", "harnesslab_cuda.py", "nvrtc.py", "cuda_source.py",
       "cudadrv.py")  # fmt: skip
# Staged as a declared task's reference.py (beside its declaration.json), trusted like any
# task reference: tools/task/declaration.py.
TASK = ("declared.py",)

__all__ = ["FOLDER", "LAB", "STAGED", "TASK"]

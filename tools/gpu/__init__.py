"""The files staged to the GPU host: standard library, torch and triton only, never harnesslab.

The source tree shows the design; the staged folder is flat. This folder holds the dev path and
the pieces every side shares; isolation/ the sandbox, verify/ the guarded verify, cuda_cpp/ what
runs a CUDA C++ candidate, kernel_lab/ the lab's GPU side (each folder's docstring says more).
STAGED, LAB and TASK name files by their path under this folder; each is staged by its basename
(`staged_name`, `copy_flat`; basenames are unique), so on the GPU host they sit in one folder.

The launcher copies STAGED into `<stage>/harness/` (hash-checked against this package on every
call); there they import each other by plain module name (the sibling import rule in
runner.py's docstring: the host imports them as this package's modules, mypy too). The lab
stages LAB beside the task folders, and TASK as a declared task's reference. The host imports a
few of them as modules too (wire for framing, ncu for the one ncu parser, scores for the one
score definition); tests/tools/gpu/test_staged.py checks that none imports harnesslab.

Side of the trust boundary: isolation/sandbox.py (with sandbox_policy.py, the typed policy and
the one way to start it, sandbox_confine.py, sandbox_limits.py and sandbox_mounts.py) is
trusted up to the exec of its target; runner.py (dev modes; with timing.py, scores.py, correctness.py,
failures.py, and diagnostics.py for its probe and profile modes) runs inside sandbox.py with the candidate; verify/ is the guarded verify (its
docstring says which of its files are trusted: all but the candidate's process guard_child.py,
guard_observer.py, guard_record.py and step_child.py); step_trace.py is a step task's dev objective (the runner's
step mode; step_probe.py its probes, step_profile.py its profile), run inside sandbox.py with the candidate's step like the runner, so what it reports
is dev feedback, never a verdict; modelnew.py (a KernelBench `ModelNew` class as the entry) and
cuda_cpp/harnesslab_cuda.py (with nvrtc.py and cuda_source.py, imported by a CUDA kernel.py)
run where the candidate runs.
"""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent  # the host runs isolation/sandbox.py, wire.py by path
STAGED = (
    # The dev path: the protocol loop and its modes, and the pieces every side shares.
    "runner.py",
    "timing.py",
    "scores.py",
    "correctness.py",
    "failures.py",
    "numerics.py",
    "modelnew.py",
    "step_trace.py",  # a step task's dev traces (the runner's step mode)
    "step_probe.py",  # a step task's numerical probes (the runner's probe mode)
    "step_profile.py",  # a step task's per-kernel breakdown (the runner's step_profile mode)
    "diagnostics.py",  # the runner's modes without a score: probe, profile_target, step_profile
    "wire.py",
    "cudadrv.py",  # the CUDA driver API (ctypes): the replay, the recorder, harnesslab_cuda
    # The sandbox every agent-code process runs in (isolation/__init__.py).
    "isolation/sandbox.py",
    "isolation/sandbox_policy.py",
    "isolation/sandbox_confine.py",
    "isolation/sandbox_limits.py",
    "isolation/sandbox_mounts.py",
    # The guarded verify (verify/__init__.py says which file does what).
    "verify/guard.py",
    "verify/guard_kid.py",
    "verify/guard_spawn.py",
    "verify/guard_cpu.py",
    "verify/guard_gpu.py",
    "verify/guard_schema.py",
    "verify/guard_child.py",
    "verify/guard_observer.py",
    "verify/guard_record.py",
    "verify/phase_lock.py",
    "verify/devmem.py",  # device memory the parent allocates and a sandboxed process maps
    "verify/replay.py",
    "verify/step_guard.py",  # a step task's guarded verify: the trusted parent ...
    "verify/step_child.py",  # ... and the candidate's sandboxed process
    "verify/step_timed.py",  # ... and the parent's timed pass
    "verify/step_arena.py",  # ... and the candidate's State, shared by the two processes
    "verify/step_record.py",  # ... and the candidate's step recorded (in its process) ...
    "verify/step_schema.py",  # ... checked by the parent ...
    "verify/step_replay.py",  # ... and replayed in a sandboxed process of its own
    # CUDA C++ candidates: the launcher kernel.py imports, NVRTC, the source reader.
    "cuda_cpp/harnesslab_cuda.py",
    "cuda_cpp/nvrtc.py",
    "cuda_cpp/cuda_source.py",
)
LAB = ("runner.py", "timing.py", "scores.py", "correctness.py", "failures.py", "step_trace.py",
       "step_probe.py", "step_profile.py", "diagnostics.py",
       "modelnew.py", "cudadrv.py", "ncu.py", "kernel_lab/lab.py", "kernel_lab/lab_step.py",
       "cuda_cpp/harnesslab_cuda.py", "cuda_cpp/nvrtc.py", "cuda_cpp/cuda_source.py")  # fmt: skip
# Staged as a declared task's reference.py (beside its declaration.json), trusted like any
# task reference: tools/task/declaration.py.
TASK = ("declared.py",)


def staged_name(path: str) -> str:
    """The name an entry of STAGED, LAB or TASK has on the GPU host (its basename)."""
    return path.rsplit("/", 1)[-1]


def copy_flat(dest: Path, files: tuple[str, ...] = STAGED) -> Path:
    """`files` copied into `dest`, each by its basename: the folder as the GPU host gets it
    (a test, a benchmark or the lab runs the staged scripts from there)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in files:
        (dest / staged_name(name)).write_bytes((FOLDER / name).read_bytes())
    return dest


__all__ = ["FOLDER", "LAB", "STAGED", "TASK", "copy_flat", "staged_name"]

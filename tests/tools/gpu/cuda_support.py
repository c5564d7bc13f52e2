"""What the CUDA C++ tests share: the staged modules by their plain names (as the runner and the
candidate's process import them), and NVRTC or a skip that says how to get it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harnesslab.tools import gpu

SKIP_REASON = (
    "NVRTC is not installed here: `pip install harnesslab[cuda-cpu-tests]` (the CUDA 13 "
    "nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels, Linux x86_64) or install the CUDA toolkit"
)


def staged(name: str) -> ModuleType:
    """A staged module (harnesslab_cuda, nvrtc, cuda_source, the verify's) imported by its plain
    name. The GPU folder and its subfolders (flat on the GPU host) are appended to sys.path, so
    they never shadow anything else."""
    for folder in (gpu.FOLDER, *sorted(p.parent for p in gpu.FOLDER.glob("*/__init__.py"))):
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    return importlib.import_module(name)


def compiler():
    """The process's NVRTC, or a skip with the reason."""
    nvrtc = staged("nvrtc")
    try:
        return nvrtc.get()
    except nvrtc.NvrtcNotFound:
        pytest.skip(SKIP_REASON)


def rmsnorm_gate_cuda(which: str) -> tuple[Any, dict[str, Path]]:
    """The CUDA rmsnorm_gate task and the files of its `which` candidate ("baseline": the
    workspace template, "solution": the shipped solution with its .cu)."""
    from harnesslab.tools.task.spec import load_task  # noqa: PLC0415 (only the CUDA tests)

    spec = load_task("rmsnorm_gate").for_language("cuda")
    if which == "baseline":
        return spec, {p.name: p for p in spec.workspace_template.iterdir() if p.is_file()}
    sol = spec.solutions("cuda")["cuda_rmsnorm_gate"]
    return spec, {"kernel.py": sol, sol.with_suffix(".cu").name: sol.with_suffix(".cu")}

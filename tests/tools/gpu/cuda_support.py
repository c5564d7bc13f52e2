"""What the CUDA C++ tests share: the staged modules by their plain names (as the runner and the
candidate's process import them), and NVRTC or a skip that says how to get it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
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


def fake_kernel(
    signature: str, *, arch: str = "sm_90", expression: str = "k", image: bytes = b""
) -> Any:
    """A harnesslab_cuda Kernel with the parameters `signature` gives (load's `signature=` form)
    and a stand-in compile result: the launch checks and the recorder need no NVRTC."""
    hc, nvrtc, cuda_source = staged("harnesslab_cuda"), staged("nvrtc"), staged("cuda_source")
    compiled = nvrtc.Compiled(
        key=expression, arch=arch, target="cubin", image=image or b"\x7fELF" + expression.encode(),
        ptx="", lowered={expression: f"_Z1{expression}v"}, log="", nvrtc_version=(13, 0),
        compile_s=0.0, options=("--gpu-architecture=sm_90", "-std=c++17", "--include-path=/i", "-DV=8"),
    )  # fmt: skip
    params = cuda_source.parse_signature_text(signature)
    return hc.Kernel(compiled, expression, "k.cu", params, {}, "/src/k.cu")


class GpuTensor:
    """What the launcher asks of a CUDA tensor (it tells tensors by their type's module), for
    the launch checks on a machine without a GPU."""

    __module__ = "torch.fake"
    is_cuda = True

    def __init__(self, ptr: int, index: int = 0, dtype: Any = None) -> None:
        import torch  # noqa: PLC0415 (only the CUDA tests)

        self.ptr, self.device = ptr, SimpleNamespace(index=index)
        self.dtype = torch.float16 if dtype is None else dtype

    def data_ptr(self) -> int:
        return self.ptr

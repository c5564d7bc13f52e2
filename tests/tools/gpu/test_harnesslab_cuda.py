"""The CUDA launcher a candidate's kernel.py imports (tools/gpu/cuda_cpp/harnesslab_cuda.py), on a machine
without a GPU: load compiles with NVRTC, every launch is checked against the kernel's declared
parameters before anything runs, the one hook (`_launch`) sees every launch and `record_launch`
turns it into the recorder's format, and running says plainly that it needs a GPU."""

from __future__ import annotations

import base64
import importlib.util
import os
import struct
import uuid
from pathlib import Path

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import compiler, staged

hc = staged("harnesslab_cuda")

KERNEL = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scale(const __half* __restrict__ x, __half* y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(__half2float(x[i]) * s);
}
extern "C" __global__ void scalars(float* y, __half h, __nv_bfloat16 b, unsigned u, long long big,
                                   double d) {
  y[0] = __half2float(h) + __bfloat162float(b) + u + big + d;
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler()  # skips without NVRTC
    monkeypatch.setitem(hc._SETTINGS, "cache_dir", str(tmp_path / "nvrtc-cache"))


def caller(folder: Path, files: dict[str, str] | None = None):
    """`load` as a kernel.py in `folder` calls it (the source is found beside the caller)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {"kernel.cu": KERNEL, **(files or {})}.items():
        (folder / name).write_text(text)
    (folder / "kernel.py").write_text(
        "from harnesslab_cuda import load\n\n\ndef go(*a, **k):\n    return load(*a, **k)\n"
    )
    spec = importlib.util.spec_from_file_location(f"k_{uuid.uuid4().hex}", folder / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.go


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every launch that reaches the hook, which then does nothing (no GPU needed)."""
    seen: list = []
    monkeypatch.setattr(hc, "_launch", seen.append)
    return seen


def test_load_compiles_the_kernel_beside_the_calling_file(tmp_path: Path) -> None:
    k = caller(tmp_path)("kernel.cu", "scale")
    assert k.name == "scale" and k.compiled.arch == "sm_90" and k.compiled.image[:4] == b"\x7fELF"
    assert [(p.name, p.type) for p in k.params] == [("x", "ptr"), ("y", "ptr"), ("s", "fp32"),
                                                    ("n", "i32")]  # fmt: skip
    a, b = caller(tmp_path)("kernel.cu", ["scale", "scalars"])
    assert a.compiled is b.compiled  # one NVRTC program for both


def test_a_source_that_is_not_a_cu_file_beside_the_caller_is_refused(tmp_path: Path) -> None:
    go = caller(tmp_path / "cand")
    (tmp_path / "outside.cu").write_text(KERNEL)
    os.symlink(tmp_path / "outside.cu", tmp_path / "cand" / "link.cu")
    (tmp_path / "cand" / "notes.txt").write_text(KERNEL)
    for source in ("../outside.cu", str(tmp_path / "outside.cu"), "link.cu", "notes.txt",
                   "missing.cu"):  # fmt: skip
        with pytest.raises(hc.LaunchError, match="beside"):
            go(source, "scale")


def test_local_headers_beside_the_source_are_handed_to_nvrtc(tmp_path: Path) -> None:
    inc = '#include "common.cuh"\nextern "C" __global__ void k(float* y) { y[0] = TWO; }\n'
    go = caller(tmp_path, {"uses.cu": inc, "common.cuh": "#define TWO 2.f\n"})
    assert go("uses.cu", "k").name == "k"
    for bad in ('"sub/common.cuh"', '"common.h"', '"absent.cuh"'):
        (tmp_path / "bad.cu").write_text(inc.replace('"common.cuh"', bad))
        with pytest.raises(hc.LaunchError):
            go("bad.cu", "k")


def test_a_kernel_that_reads_a_timer_is_refused_at_load_and_printf_is_not(tmp_path: Path) -> None:
    timer = 'extern "C" __global__ void k(long long* y) { y[0] = clock64(); }\n'
    debug = 'extern "C" __global__ void k(int n) { printf("%d", n); }\n'
    go = caller(tmp_path, {"timer.cu": timer, "debug.cu": debug})
    with pytest.raises(hc.KernelPolicyError, match="clock64"):
        go("timer.cu", "k")
    assert go("debug.cu", "k").name == "k"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the launch would run")
def test_without_a_gpu_a_launch_is_checked_then_says_running_needs_a_gpu(tmp_path: Path) -> None:
    k = caller(tmp_path)("kernel.cu", "scale")
    x = torch.randn(100).half()
    with pytest.raises(hc.GpuRequired) as err:
        k[(1,), 128](x, torch.empty_like(x), 2.0, 100)
    text = str(err.value)
    assert text.startswith("running kernel.cu:scale needs a CUDA GPU")
    assert "grid (1, 1, 1), block (128, 1, 1), 0 B shared memory, 4 arguments" in text
    assert "sm_90" in text


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("x", "y", 2.0), "takes 4 arguments"),
        (("x", "bf16", 2.0, 10), r"a bfloat16 tensor for a __half\*"),
        (("x", "y", "two", 10), "pass a float"),
        (("x", "y", 2.0, 10.0), "pass an int"),
        (("x", "y", 2.0, 1 << 31), "does not fit int"),
        (("x", "y", 2.0, "x"), "not a tensor"),
        ((12345, "y", 2.0, 10), "pass a torch tensor"),
        (("x", "y", 1e39, 10), "does not fit float"),
    ],
)
def test_arguments_are_checked_against_the_declaration_before_anything_runs(
    tmp_path: Path, launches: list, args: tuple, match: str
) -> None:
    k = caller(tmp_path)("kernel.cu", "scale")
    x = torch.randn(10).half()
    named = {"x": x, "y": torch.empty_like(x), "bf16": x.bfloat16()}
    with pytest.raises(hc.LaunchError, match=match):
        k[1, 32](*[named.get(a, a) if isinstance(a, str) else a for a in args])
    assert launches == []


@pytest.mark.parametrize(
    ("grid", "block", "shared", "match"),
    [
        (1, 2048, 0, "block.x = 2048"),
        (1, (32, 32, 2), 0, "2048 threads"),
        ((1, 70000), 32, 0, "grid.y = 70000"),
        (-1, 32, 0, "grid.x = -1"),
        (1, 0, 0, "block.x = 0"),
        (1.5, 32, 0, "an int or a tuple"),
        (1, 32, 300_000, "dynamic shared memory"),
    ],
)
def test_grid_block_and_shared_memory_are_checked(
    tmp_path: Path, launches: list, grid, block, shared, match: str
) -> None:
    k = caller(tmp_path)("kernel.cu", "scale")
    x = torch.randn(10).half()
    with pytest.raises(hc.LaunchError, match=match):
        k[grid, block, shared](x, torch.empty_like(x), 1.0, 10)
    assert launches == []


def test_an_empty_grid_launches_nothing(tmp_path: Path, launches: list) -> None:
    k = caller(tmp_path)("kernel.cu", "scale")
    x = torch.randn(0).half()
    k[0, 128](x, torch.empty_like(x), 1.0, 0)
    assert launches == []


def test_the_hook_sees_every_launch_and_records_its_cubin_grid_block_and_arguments(
    tmp_path: Path, launches: list
) -> None:
    k, s = caller(tmp_path)("kernel.cu", ["scale", "scalars"])
    x = torch.randn(64).half()
    y = torch.empty_like(x)
    k[(2, 1), (32, 4), 1024](x, y, 2.5, 64)
    k[(2, 1), (32, 4), 4096](x, y, 0.5, 64)
    s[1, 1](torch.empty(1), 1.5, -2.0, 7, -(1 << 40), 0.1)
    assert [(ln.grid, ln.block, ln.shared) for ln in launches] == [
        ((2, 1, 1), (32, 4, 1), 1024), ((2, 1, 1), (32, 4, 1), 4096), ((1, 1, 1), (1, 1, 1), 0)
    ]  # fmt: skip
    buffers = {x.data_ptr(): "in0", y.data_ptr(): "a0"}

    def ref(t):
        return {"null": True} if t is None else {"buf": buffers.get(t.data_ptr(), "?"), "offset": 0}

    kernels: dict = {}
    steps = [hc.record_launch(ln, kernels, ref) for ln in launches]
    entry = kernels[steps[0]["kernel"]]
    assert steps[1]["kernel"] == steps[0]["kernel"] and steps[2]["kernel"] != steps[0]["kernel"]
    assert base64.b64decode(entry["cubin"]) == k.compiled.image and entry["name"] == "scale"
    assert entry["shared"] == 4096 and entry["block"] == [32, 4, 1] and entry["num_warps"] == 4
    assert entry["nvrtc"] == {"source": "kernel.cu", "expression": "scale", "arch": "sm_90",
                              "options": ["-std=c++17"]}  # fmt: skip
    assert steps[0] == {
        "op": "launch", "kernel": steps[0]["kernel"], "grid": [2, 1, 1], "block": [32, 4, 1],
        "shared": 1024,
        "params": [{"k": "ptr", "buf": "in0", "offset": 0}, {"k": "ptr", "buf": "a0", "offset": 0},
                   {"k": "scalar", "type": "u32", "value": struct.unpack("<I", struct.pack("<f", 2.5))[0]},
                   {"k": "scalar", "type": "i32", "value": 64}],
    }  # fmt: skip
    h, b, u, big, d = steps[2]["params"][1:]
    assert h == {"k": "scalar", "type": "u16", "value": 0x3E00}  # 1.5 in fp16
    assert b == {"k": "scalar", "type": "u16", "value": 0xC000}  # -2.0 in bf16
    assert (u["type"], u["value"], big["type"], big["value"]) == ("u32", 7, "i64", -(1 << 40))
    assert d == {
        "k": "scalar",
        "type": "u64",
        "value": struct.unpack("<Q", struct.pack("<d", 0.1))[0],
    }


def test_bf16_scalars_round_to_nearest_even() -> None:
    # 1 + 2^-8 is halfway between two bf16 values: even (1.0) wins; 1 + 3 * 2^-8 rounds up.
    assert hc._float_bits("bf16", 1.0 + 2**-8) == ("u16", 0x3F80)
    assert hc._float_bits("bf16", 1.0 + 3 * 2**-8) == ("u16", 0x3F82)

"""The CUDA launcher's load, cache and launch (tools/gpu/cuda_cpp/harnesslab_cuda.py), one rule
at a time: settings and the cache folder, which architecture and NVRTC, what load reads (the
source beside the caller, its local headers, their limits), when it compiles again, what it
refuses, how a launch reaches the driver (bytes of each argument, the shared-memory opt-in),
and the recorder's format. No NVRTC and no GPU: the compiler, torch.cuda and the driver are
stand-ins that record what they are asked."""

from __future__ import annotations

import base64
import ctypes
import importlib.util
import os
import struct
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import GpuTensor, fake_kernel, staged

hc = staged("harnesslab_cuda")

SRC = r"""#include <cuda_fp16.h>
extern "C" __global__ void scale(const __half* x, float s, int n) {}
extern "C" __global__ void other(double* y) {}
"""


class FakeCompiler:
    ptx = ""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def compile(self, text: str, **kw):  # noqa: ANN003
        hc.nvrtc.define_options(kw["defines"])  # refuses what NVRTC's wrapper refuses
        self.calls.append({"text": text, **kw})
        return hc.nvrtc.Compiled(
            key="k", arch=kw["arch"], target="cubin", image=b"\x7fELF", ptx=self.ptx,
            lowered={e: f"_Z{e}" for e in kw["name_expressions"]}, log="", nvrtc_version=(13, 0),
            compile_s=0.0,
        )  # fmt: skip


@pytest.fixture
def nvrtc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeCompiler:
    fake = FakeCompiler()
    monkeypatch.setattr(hc, "_compiler", lambda: fake)
    monkeypatch.setattr(hc, "_COMPILED", {})
    monkeypatch.setattr(hc, "_SETTINGS", {"cache_dir": str(tmp_path / "cache"), "arch": None})
    monkeypatch.setattr(hc, "_has_gpu", lambda: False)
    return fake


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    seen: list = []
    monkeypatch.setattr(hc, "_launch", seen.append)
    return seen


def load_in(folder: Path, *args, files: dict[str, str | bytes] | None = None, **kw):
    """`load` as called from a kernel.py in `folder` (it finds sources beside its caller)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {"kernel.cu": SRC, **(files or {})}.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    scope = {"__file__": str(folder / "kernel.py"), "load": hc.load, "a": args, "k": kw}
    return eval("load(*a, **k)", scope)


# -- settings ----------------------------------------------------------------------------------


def test_configure_sets_only_what_it_is_given(monkeypatch) -> None:
    monkeypatch.setattr(hc, "_SETTINGS", {"cache_dir": None, "arch": None})
    hc.configure(arch="sm_80")
    hc.configure(cache_dir="/c")
    hc.configure()
    assert hc._SETTINGS == {"cache_dir": "/c", "arch": "sm_80"}


def test_the_cache_is_the_configured_then_harnesslabs_then_tritons_then_the_home_folder(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(hc, "_SETTINGS", {"cache_dir": None, "arch": None})
    monkeypatch.delenv("HARNESSLAB_CUDA_CACHE", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hc.cache_dir() == os.path.join(str(tmp_path), ".cache", "harnesslab", "nvrtc")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/t")
    monkeypatch.setenv("HARNESSLAB_CUDA_CACHE", "")
    assert hc.cache_dir() == "/t/nvrtc"
    monkeypatch.setenv("HARNESSLAB_CUDA_CACHE", "/h")
    assert hc.cache_dir() == "/h"
    hc.configure(cache_dir="/s")
    assert hc.cache_dir() == "/s"


def test_nothing_is_configured_when_the_module_is_imported(monkeypatch, tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("hc_fresh", hc.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "hc_fresh", fresh)  # its dataclasses look it up there
    spec.loader.exec_module(fresh)
    monkeypatch.setenv("HARNESSLAB_CUDA_CACHE", str(tmp_path))
    monkeypatch.setattr(fresh, "_has_gpu", lambda: False)
    assert fresh.cache_dir() == str(tmp_path) and fresh.target_arch() == "sm_90"


def test_the_arch_is_the_configured_then_this_gpus_then_sm_90(monkeypatch) -> None:
    monkeypatch.setattr(hc, "_SETTINGS", {"cache_dir": None, "arch": None})
    cuda = SimpleNamespace(is_available=lambda: 0, get_device_capability=lambda: (8, 9))
    monkeypatch.setattr(hc, "_torch", lambda: SimpleNamespace(cuda=cuda))
    assert hc._has_gpu() is False and hc.target_arch() == "sm_90"
    cuda.is_available = lambda: 1
    assert hc._has_gpu() is True and hc.target_arch() == "sm_89"
    hc.configure(arch="sm_75")
    assert hc.target_arch() == "sm_75"


@pytest.mark.parametrize(
    ("version", "major"),
    [("12.4", 12), ("13.0", 13), ("9.2", 9), (None, None), ("", None), ("x", None)],
)
def test_nvrtc_is_asked_for_torchs_cuda_major(monkeypatch, version, major) -> None:
    asked: list = []
    monkeypatch.setattr(hc.nvrtc, "get", lambda prefer_major: asked.append(prefer_major) or "n")
    monkeypatch.setattr(
        hc, "_torch", lambda: SimpleNamespace(version=SimpleNamespace(cuda=version))
    )
    assert hc._compiler() == "n" and asked == [major]


# -- load --------------------------------------------------------------------------------------


def test_load_compiles_the_source_beside_its_caller_for_the_target_arch(tmp_path, nvrtc) -> None:
    k = load_in(tmp_path, "kernel.cu", "scale", defines={"VEC": 8}, options=["-lineinfo"])
    (call,) = nvrtc.calls
    assert call == {"text": SRC, "name": "kernel.cu", "arch": "sm_90", "defines": {"VEC": 8},
                    "options": ["-lineinfo"], "name_expressions": ["scale"], "headers": {},
                    "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    assert (k.expression, k.source_name, k.defines, k.path) == (
        "scale", "kernel.cu", {"VEC": 8}, os.path.realpath(tmp_path / "kernel.cu"))  # fmt: skip
    assert [(p.name, p.type) for p in k.params] == [("x", "ptr"), ("s", "fp32"), ("n", "i32")]
    assert k.name == "_Zscale" and load_in(tmp_path, "kernel.cu", "other").defines == {}
    a, b = load_in(tmp_path, "kernel.cu", ["scale", "other"])
    assert a.compiled is b.compiled and [a.expression, b.expression] == ["scale", "other"]
    assert nvrtc.calls[-1]["name_expressions"] == ["scale", "other"]
    hc.configure(arch="sm_80")
    assert load_in(tmp_path, "kernel.cu", "scale").compiled.arch == "sm_80"
    assert load_in(tmp_path, "kernel.cu", "scale", arch="sm_86").compiled.arch == "sm_86"


def test_without_a_calling_file_the_source_is_found_in_the_working_folder(
    tmp_path, nvrtc, monkeypatch
) -> None:
    (tmp_path / "kernel.cu").write_text(SRC)
    monkeypatch.chdir(tmp_path)
    assert eval("load('kernel.cu', 'scale')", {"load": hc.load}).source_name == "kernel.cu"


def test_the_same_compile_is_done_once_and_any_change_compiles_again(tmp_path, nvrtc) -> None:
    def go(**kw):
        return load_in(tmp_path, kw.pop("src", "kernel.cu"), "scale", **kw).compiled

    first = go(defines={"A": 1, "B": "x"})
    assert go(defines={"B": "x", "A": 1}) is first and len(nvrtc.calls) == 1
    load_in(tmp_path, "same.cu", "scale", files={"same.cu": SRC})
    variants = [{"defines": {"A": 2, "B": "x"}}, {"options": ["-lineinfo"]}, {"arch": "sm_80"},
                {"src": "same.cu"}]  # fmt: skip
    assert len({id(go(**v)) for v in variants} | {id(first)}) == 5 and len(nvrtc.calls) == 5
    load_in(tmp_path, "kernel.cu", "scale", files={"kernel.cu": SRC + "// changed\n"})
    load_in(tmp_path, "kernel.cu", ["scale", "other"])
    inc = '#include "h.cuh"\n' + SRC
    load_in(tmp_path, "inc.cu", "scale", files={"inc.cu": inc, "h.cuh": "// one\n"})
    load_in(tmp_path, "inc.cu", "scale", files={"h.cuh": "// two\n"})
    assert len(nvrtc.calls) == 9


def test_a_bad_define_or_option_is_a_launch_error(tmp_path, nvrtc) -> None:
    with pytest.raises(hc.LaunchError, match="a -D value is an int"):
        load_in(tmp_path, "kernel.cu", "scale", defines={"X": {1, 2}})  # not JSON: still keyed
    with pytest.raises(hc.LaunchError, match="a -D name is a C identifier"):
        load_in(tmp_path, "kernel.cu", "scale", defines={"1X": 1})


@pytest.mark.parametrize("names", [[], [""], ["  "], ["scale", 3]])
def test_load_must_name_a_kernel(tmp_path, nvrtc, names) -> None:
    with pytest.raises(hc.LaunchError, match=r"load\(\): name the kernel"):
        load_in(tmp_path, "kernel.cu", names)
    assert nvrtc.calls == []


def test_a_signature_overrides_the_declaration_and_either_may_be_refused(tmp_path, nvrtc) -> None:
    k = load_in(tmp_path, "kernel.cu", "scale", signature="ptr, u64")
    assert [(p.type, p.c_type) for p in k.params] == [("ptr", "ptr"), ("u64", "u64")]
    with pytest.raises(hc.LaunchError, match="signature: 'wat'"):
        load_in(tmp_path, "kernel.cu", "scale", signature="ptr, wat")
    struct_src = 'struct P { int a; };\nextern "C" __global__ void k(P p) {}\n'
    with pytest.raises(
        hc.LaunchError, match="^s.cu:2: parameter 0 .* which the launcher cannot pass"
    ):
        load_in(tmp_path, "s.cu", "k", files={"s.cu": struct_src})
    assert load_in(tmp_path, "s.cu", "k", signature="i32").params[0].type == "i32"


def test_a_kernel_the_verify_would_refuse_is_refused_at_load_with_the_first_reason(
    tmp_path, nvrtc
) -> None:
    nvrtc.ptx = "\n.extern .func malloc\n{ mov.u64 %rd1, %clock64; }\n"
    with pytest.raises(
        hc.KernelPolicyError, match=r"^kernel.cu: reads %clock64 .*: not allowed in a kernel"
    ) as err:
        load_in(tmp_path, "kernel.cu", "scale")
    assert err.value.code == "cuda_timer"
    nvrtc.ptx = "\n.extern .func (.param .b32 r) vprintf\n"  # printf: allowed in eval's launcher
    assert load_in(tmp_path, "kernel.cu", "other").name == "_Zother"


def test_the_source_is_a_regular_cu_or_cuh_file_in_the_callers_own_folder(tmp_path, nvrtc) -> None:
    (tmp_path / "cand2").mkdir()
    (tmp_path / "cand2" / "k.cu").write_text(SRC)
    assert (
        load_in(tmp_path / "cand", "lib.cuh", "scale", files={"lib.cuh": SRC}).source_name
        == "lib.cuh"
    )
    with pytest.raises(hc.LaunchError, match="must be a file beside the calling kernel.py"):
        load_in(tmp_path / "cand", "../cand2/k.cu", "scale")
    os.symlink("kernel.cu", tmp_path / "cand" / "link.cu")  # inside, but a link
    (tmp_path / "cand" / "dir.cu").mkdir()
    for name in ("link.cu", "dir.cu", "notes.txt"):
        with pytest.raises(
            hc.LaunchError, match=f"^{name}: not a regular .cu/.cuh file beside kernel.py"
        ):
            load_in(tmp_path / "cand", name, "scale", files={"notes.txt": SRC})


def test_a_source_may_be_up_to_one_mib(tmp_path) -> None:
    (tmp_path / "big.cu").write_bytes(b" " * (1 << 20))
    assert len(hc._read(str(tmp_path / "big.cu"))) == 1 << 20
    (tmp_path / "big.cu").write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(hc.LaunchError, match="big.cu is larger than 1048576 bytes"):
        hc._read(str(tmp_path / "big.cu"))


def test_a_source_is_read_up_to_its_size_limit_as_text(tmp_path, nvrtc, monkeypatch) -> None:
    body = b'extern "C" __global__ void k(int n) {}\n'
    monkeypatch.setattr(hc, "MAX_SOURCE_BYTES", len(body) + 1)
    assert load_in(tmp_path, "k.cu", "k", files={"k.cu": body + b"\xff"}).name == "_Zk"
    assert nvrtc.calls[0]["text"].endswith("\n\ufffd")
    with pytest.raises(hc.LaunchError, match=f"^k.cu is larger than {len(body) + 1} bytes"):
        load_in(tmp_path, "k.cu", "k", files={"k.cu": body + b"//"})


def test_local_headers_are_read_recursively_once_each_and_handed_over(tmp_path, nvrtc) -> None:
    files = {
        "k.cu": '#include <cuda_fp16.h>\n#include "a.cuh"\n#include "a.cuh"\n' + SRC,
        "a.cuh": '#include "b.cuh"\n#define A 1\n',
        "b.cuh": '#include "a.cuh"\n#define B 2\n',  # a cycle ends: each header is read once
    }
    load_in(tmp_path, "k.cu", "scale", files=files)
    assert nvrtc.calls[0]["headers"] == {"a.cuh": files["a.cuh"], "b.cuh": files["b.cuh"]}


def test_a_local_header_is_a_cuh_file_beside_the_source_named_without_a_folder(
    tmp_path, nvrtc
) -> None:
    nested = {"k.cu": '#include "a.cuh"\n' + SRC, "a.cuh": '// a\n#include "sub/b.cuh"\n'}
    with pytest.raises(
        hc.LaunchError, match=r'^a.cuh:2: #include "sub/b.cuh": a local include is a .cuh file'
    ):
        load_in(tmp_path, "k.cu", "scale", files=nested)
    with pytest.raises(hc.LaunchError, match=r'^h.cu:1: #include "c.h"'):
        load_in(tmp_path, "h.cu", "scale", files={"h.cu": '#include "c.h"\n' + SRC, "c.h": ""})


def test_a_source_has_at_most_32_local_headers(tmp_path, nvrtc) -> None:
    def chain(n: int) -> dict[str, str]:
        files = {f"h{i}.cuh": f'#include "h{i + 1}.cuh"\n' for i in range(n - 1)}
        return {**files, f"h{n - 1}.cuh": "", "k.cu": '#include "h0.cuh"\n' + SRC}

    load_in(tmp_path / "ok", "k.cu", "scale", files=chain(32))
    assert len(nvrtc.calls[0]["headers"]) == 32
    with pytest.raises(hc.LaunchError, match="^k.cu: more than 32 local headers"):
        load_in(tmp_path / "many", "k.cu", "scale", files=chain(33))


# -- the launch itself -------------------------------------------------------------------------


class FakeDriver:
    """The driver calls a launch makes; `launch` reads back the bytes each parameter points to."""

    def __init__(self, sizes=None) -> None:
        self.calls: list = []
        self.sizes = sizes
        self.nbytes: list[int] = []

    def init_primary(self, ordinal: int) -> None:
        self.calls.append(("init", ordinal))

    def load_function(self, image: bytes, name: str, flags: int) -> tuple[int, int]:
        self.calls.append(("load", image, name, flags))
        return 11, 22

    def param_sizes(self, fn: int):
        return self.sizes

    def allow_shared(self, fn: int, n: int) -> None:
        self.calls.append(("allow", fn, n))

    def launch(self, fn, grid, block, shared, stream, params) -> None:
        args = [ctypes.string_at(params[i], n) for i, n in enumerate(self.nbytes)]
        self.calls.append(("launch", fn, grid, block, shared, stream, len(params), args))


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """torch.cuda on a host with a GPU (device `ordinal`, stream 777), and the driver module."""
    state = SimpleNamespace(ordinal=0, made=[])
    cuda = SimpleNamespace(is_available=lambda: True, current_device=lambda: state.ordinal,
                           current_stream=lambda: SimpleNamespace(cuda_stream=777))  # fmt: skip
    monkeypatch.setattr(hc, "_torch", lambda: SimpleNamespace(cuda=cuda))
    module = types.ModuleType("cudadrv")
    module.Driver = lambda: state.made.append(FakeDriver()) or state.made[-1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cudadrv", module)
    monkeypatch.setattr(hc, "_DRIVERS", {})
    return state


def test_one_driver_per_device_in_its_primary_context(gpu) -> None:
    d0 = hc._driver(0)
    assert hc._driver(0) is d0 and hc._driver(1) is not d0
    assert [d.calls for d in gpu.made] == [[("init", 0)], [("init", 1)]]


def test_a_cpu_launch_says_what_was_checked_and_that_running_needs_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(hc, "_has_gpu", lambda: False)
    with pytest.raises(hc.GpuRequired) as err:
        fake_kernel("ptr, i32")[(2, 3), 32, 64](torch.zeros(1), 5)
    assert str(err.value) == (
        "running k.cu:k needs a CUDA GPU (this call's tensors are on the CPU). Checked: compiled "
        "for sm_90 by NVRTC 13.0; grid (2, 3, 1), block (32, 1, 1), 64 B shared memory, 2 "
        "arguments. Results and timings come from a GPU host (an SSH or Slurm executor)"
    )


def test_a_gpu_launch_passes_each_arguments_exact_bytes_on_the_current_stream(gpu) -> None:
    k = fake_kernel("ptr, ptr, bool, i8, u8, i16, u16, i32, u32, i64, u64, float, __half")
    args = (GpuTensor(0x1000), None, True, -1, 200, -300, 65535, -5, 7, -(1 << 40), 2**64 - 1,
            2.5, 1.5)  # fmt: skip
    hc._driver(0).nbytes = [8, 8, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 2]
    k[(4, 2), (128, 2)](*args)
    assert gpu.made[0].calls[-1] == ("launch", 22, (4, 2, 1), (128, 2, 1), 0, 777, 13, [
        struct.pack("<Q", 0x1000), bytes(8), b"\x01", b"\xff", b"\xc8", struct.pack("<h", -300),
        b"\xff\xff", struct.pack("<i", -5), struct.pack("<I", 7), struct.pack("<q", -(1 << 40)),
        b"\xff" * 8, struct.pack("<f", 2.5), struct.pack("<e", 1.5),
    ])  # fmt: skip


def test_a_kernel_is_loaded_once_per_device_and_its_parameter_sizes_checked(gpu) -> None:
    k = fake_kernel("ptr, i32")
    k[1, 32](None, 1)
    k[1, 32](None, 2)
    gpu.ordinal = 1
    k[1, 32](None, 3)
    loads = [[c for c in d.calls if c[0] == "load"] for d in gpu.made]
    assert loads == [[("load", k.compiled.image, "_Z1kv", 0)]] * 2
    assert k._functions == {0: (11, 22, 48 << 10), 1: (11, 22, 48 << 10)}
    gpu.ordinal = 2
    hc._driver(2).sizes = [8, 8]
    with pytest.raises(hc.LaunchError, match=r"k.cu:k: the compiled kernel's parameter sizes are \[8, 8\], "
                       r"the declaration read gives \[8, 4\]: give load\(..., signature=...\)"):  # fmt: skip
        k[1, 32](None, 4)
    gpu.ordinal = 3
    hc._driver(3).sizes = [8, 4]
    k[1, 32](None, 5)
    assert 3 in k._functions and 2 not in k._functions


def test_shared_memory_over_48k_is_opted_in_once_per_size(gpu) -> None:
    k = fake_kernel("ptr")
    for shared in (48 << 10, (48 << 10) + 1, (48 << 10) + 1, 4096, 100_000):
        k[1, 32, shared](None)
    drv = gpu.made[0]
    assert [c for c in drv.calls if c[0] == "allow"] == [
        ("allow", 22, (48 << 10) + 1),
        ("allow", 22, 100_000),
    ]
    assert [c[4] for c in drv.calls if c[0] == "launch"] == [
        48 << 10,
        (48 << 10) + 1,
        (48 << 10) + 1,
        4096,
        100_000,
    ]
    assert k._functions[0] == (11, 22, 100_000)


# -- the recorder's format ---------------------------------------------------------------------


def test_each_cubin_and_function_is_one_kernel_entry_with_what_the_replay_needs(launches) -> None:
    a = fake_kernel("ptr, float", expression="a")
    b = fake_kernel("i32", expression="b" * 130)
    same_name = fake_kernel("ptr, float", expression="a", image=b"\x7fELF" + b"other")
    x = torch.zeros(4)
    a[2, (33, 1), 64](x, 0.5)
    a[3, 1024, 16](None, 1.0)
    b[1, 1](7)
    same_name[1, 32](x, 2.0)
    kernels: dict = {}
    steps = [hc.record_launch(ln, kernels, lambda t: {"null": True} if t is None else {"buf": "x"})
             for ln in launches]  # fmt: skip
    assert [s["kernel"] for s in steps] == ["cu0__Z1av", "cu0__Z1av", ("cu1__Z1" + "b" * 130)[:120],
                                            "cu2__Z1av"]  # fmt: skip
    entry = kernels["cu0__Z1av"]
    assert {k: v for k, v in entry.items() if k != "_cubin"} == {
        "id": "cu0__Z1av", "name": "_Z1av", "cubin": base64.b64encode(a.compiled.image).decode(),
        "shared": 64, "block": [33, 1, 1], "num_warps": 2, "num_ctas": 1, "coop": False,
        "pdl": False, "lang": "cuda",
        "nvrtc": {"source": "k.cu", "expression": "a", "arch": "sm_90", "options": ["-std=c++17", "-DV=8"]},
    }  # fmt: skip
    assert entry["_cubin"] is a.compiled.image
    assert [kernels[s["kernel"]]["num_warps"] for s in steps[2:]] == [1, 1]
    assert [kernels[s["kernel"]]["shared"] for s in steps[2:]] == [0, 0]  # no launch asked for any
    assert steps[1] == {"op": "launch", "kernel": "cu0__Z1av", "grid": [3, 1, 1], "block": [1024, 1, 1],
                        "shared": 16, "params": [{"k": "ptr", "null": True},
                                                 {"k": "scalar", "type": "u32", "value": 0x3F800000}]}  # fmt: skip
    assert steps[2]["params"] == [{"k": "scalar", "type": "i32", "value": 7}]
    assert steps[0]["params"][0] == {"k": "ptr", "buf": "x"}
    hc.record_launch(launches[1], kernels, lambda t: {})
    assert kernels["cu0__Z1av"]["shared"] == 64 and "_functions" not in repr(a)

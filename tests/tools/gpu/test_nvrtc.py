"""NVRTC through ctypes (tools/gpu/cuda_cpp/nvrtc.py): real compiles to cubin and PTX on a machine with
no GPU, the option allowlist, errors with file:line, the content-hash cache, and the PTX check
that macros cannot hide from."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tests.tools.gpu.cuda_support import compiler, staged

nvrtc = staged("nvrtc")

SCALE = """extern "C" __global__ void scale(const float* x, float* y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * s;
}
"""


@pytest.fixture(scope="module")
def cc():
    return compiler()


def test_a_kernel_compiles_to_a_cubin_for_sm_90_without_a_gpu(cc) -> None:
    out = cc.compile(SCALE, name="scale.cu", arch="sm_90", name_expressions=["scale"])
    assert out.image[:4] == b"\x7fELF" and out.target == "cubin" and out.arch == "sm_90"
    assert ".target sm_90" in out.ptx and ".entry scale" in out.ptx
    assert out.lowered == {"scale": "scale"}


def test_the_fp16_and_bf16_headers_are_found(cc) -> None:
    src = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void cast(const __half* x, __nv_bfloat16* y) {
  y[threadIdx.x] = __float2bfloat16(__half2float(x[threadIdx.x]));
}
"""
    assert cc.include_dir and cc.compile(src).image[:4] == b"\x7fELF"


def test_a_kernel_compiles_to_ptx_for_the_virtual_architecture(cc) -> None:
    out = cc.compile(SCALE, arch="sm_90", target="ptx", name_expressions=["scale"])
    assert out.arch == "compute_90" and out.image == out.ptx.encode()
    assert ".entry scale" in out.ptx


def test_defines_reach_the_source_and_change_what_compiles(cc) -> None:
    src = '#if VEC != 8\n#error "VEC must be 8"\n#endif\nextern "C" __global__ void k() {}\n'
    cc.compile(src, defines={"VEC": 8})
    with pytest.raises(nvrtc.CompileError, match="VEC must be 8"):
        cc.compile(src, defines={"VEC": 4})
    assert nvrtc.define_options({"A": 1, "B": True, "C": 0.5, "T": "__half"}) == [
        "-DA=1", "-DB=1", "-DC=0.5", "-DT=__half"
    ]  # fmt: skip
    for bad in ({"A B": 1}, {"A": [1, 2]}, {"A": "two\nlines"}):
        with pytest.raises(nvrtc.OptionError):
            nvrtc.define_options(bad)


def test_name_expressions_give_the_lowered_names_of_template_instances(cc) -> None:
    src = "template <typename T, int N> __global__ void fill(T* y) { y[0] = (T)N; }\n"
    out = cc.compile(src, name_expressions=["fill<float, 4>", "fill<int, 2>"])
    assert out.lowered["fill<float, 4>"].startswith("_Z4fillIfLi4EE")
    assert out.lowered["fill<float, 4>"] != out.lowered["fill<int, 2>"]
    assert all(f".entry {name}(" in out.ptx for name in out.lowered.values())


def test_a_compile_error_names_the_file_and_line_on_its_first_line(cc) -> None:
    src = 'extern "C" __global__ void k(float* y) {\n  y[0] = 1;\n  y[1] = undefined_name;\n}\n'
    with pytest.raises(nvrtc.CompileError) as err:
        cc.compile(src, name="kernel.cu")
    first = str(err.value).splitlines()[0]
    assert first.startswith('kernel.cu:3: error: identifier "undefined_name" is undefined')
    assert "sm_90" in first and err.value.errors[0] == first.split(" (NVRTC")[0]


@pytest.mark.parametrize(
    "option",
    ["-I/etc", "--include-path=/", "--pre-include=/etc/passwd", "-arch=sm_80",
     "--gpu-architecture=sm_80", "--relocatable-device-code=true", "-rdc=true",
     "--fdevice-time-trace=/tmp/x.json", "--create-pch=/tmp/p", "-D\nX"],
)  # fmt: skip
def test_options_outside_the_allowlist_are_refused(cc, option: str) -> None:
    with pytest.raises(nvrtc.OptionError, match="not allowed"):
        cc.compile(SCALE, options=[option])


def test_options_on_the_allowlist_compile(cc) -> None:
    out = cc.compile(SCALE, options=["--use_fast_math", "-DX=1", "--maxrregcount=64", "-lineinfo"])
    assert "--use_fast_math" in out.options and out.image[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ["sm_10", "sm_9x", "compute_90", "sm_90; rm"])
def test_an_architecture_nvrtc_cannot_build_is_refused(cc, arch: str) -> None:
    with pytest.raises(nvrtc.OptionError):
        cc.compile(SCALE, arch=arch)


def test_the_c_integer_headers_come_from_memory(cc) -> None:
    src = (
        "#include <stdint.h>\n#include <cstdint>\n"
        'extern "C" __global__ void k(uint32_t* y, std::int64_t n) { y[0] = (uint32_t)n; }\n'
    )
    assert cc.compile(src).image[:4] == b"\x7fELF"


def test_an_identical_compile_is_read_from_the_cache(cc, tmp_path: Path) -> None:
    first = cc.compile(SCALE, name_expressions=["scale"], cache_dir=str(tmp_path))
    again = cc.compile(SCALE, name_expressions=["scale"], cache_dir=str(tmp_path))
    assert not first.cached and again.cached
    assert (again.image, again.ptx, again.lowered) == (first.image, first.ptx, first.lowered)
    other = cc.compile(SCALE, name_expressions=["scale"], defines={"X": 1}, cache_dir=str(tmp_path))
    assert not other.cached and other.key != first.key


def test_a_damaged_cache_entry_is_compiled_again(cc, tmp_path: Path) -> None:
    first = cc.compile(SCALE, cache_dir=str(tmp_path))
    (tmp_path / f"{first.key}.bin").write_bytes(b"\x7fELF doctored")
    again = cc.compile(SCALE, cache_dir=str(tmp_path))
    assert not again.cached and again.image == first.image


def test_cubins_are_deterministic(cc) -> None:
    """What lets the trusted side recompile a recorded kernel and compare it byte for byte."""
    assert cc.compile(SCALE).image == cc.compile(SCALE, options=[]).image


def test_without_a_library_the_error_says_how_to_install_one(monkeypatch) -> None:
    monkeypatch.setattr(nvrtc, "library_candidates", lambda: [])
    assert nvrtc.find_library() is None
    with pytest.raises(nvrtc.NvrtcNotFound, match="pip install nvidia-cuda-nvrtc"):
        nvrtc.Nvrtc()


CHEATS = {
    "clock64": ("cuda_timer", "long long t = clock64(); y[0] = (float)t;"),
    "globaltimer": (
        "cuda_timer",
        'unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); y[0] = t;',
    ),
    "smid": ("cuda_timer", 'unsigned s; asm("mov.u32 %0, %%smid;" : "=r"(s)); y[0] = s;'),
    "macro_hidden_timer": ("cuda_timer", "long long t = TICK(); y[0] = (float)t;"),
    "device_global": ("device_state", "y[0] = counter++;"),
    "static_local": ("device_state", "static int calls; y[0] = calls++;"),
    "heap": ("device_state", "float* p = (float*)malloc(4); y[0] = p[0]; free(p);"),
    "printf": ("cuda_host_code", 'printf("%f", y[0]);'),
}
PRELUDE = "#define TICK cl##ock64\n__device__ int counter;\n"


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_the_ptx_check_finds_what_a_kernel_may_not_do(cc, name: str) -> None:
    code, body = CHEATS[name]
    src = PRELUDE + f'extern "C" __global__ void k(float* y) {{ {body} }}\n'
    found = nvrtc.ptx_findings(cc.compile(src).ptx)
    assert code in {c for c, _ in found}, found


def test_an_honest_kernel_has_no_ptx_findings(cc) -> None:
    src = """__constant__ float table[4] = {1.f, 2.f, 3.f, 4.f};
extern "C" __global__ void k(float* y, int n) {
  __shared__ float s[32];
  extern __shared__ float dyn[];
  s[threadIdx.x & 31] = table[n & 3];
  __syncthreads();
  y[threadIdx.x] = s[0] + __shfl_xor_sync(0xffffffffu, s[1], 1) + atomicAdd(y, 1.f) + dyn[0];
}
"""
    assert nvrtc.ptx_findings(cc.compile(src).ptx) == []


def test_printf_and_assert_pass_in_debug_only(cc) -> None:
    src = 'extern "C" __global__ void k(int n) { assert(n >= 0); printf("%d", n); }'
    ptx = cc.compile(src).ptx
    assert nvrtc.ptx_findings(ptx, debug=True) == []
    assert {c for c, _ in nvrtc.ptx_findings(ptx)} == {"cuda_host_code", "device_state"}

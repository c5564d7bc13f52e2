"""The static scan of CUDA C++ (tools/integrity/scan_cuda.py) and the Python rules that refuse
native code outside the harness's launcher (tools/integrity/scan.py): each rule rejects what it
names, with file:line, and the shipped CUDA kernels pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tools.integrity.scan import scan_sources
from harnesslab.tools.integrity.scan_cuda import scan_cuda
from harnesslab.tools.task.spec import list_tasks, load_task

HONEST = """#include <cuda_fp16.h>
#include <stdint.h>
#include "helpers.cuh"
#define NEG_INF (-__int_as_float(0x7f800000))
__constant__ float table[4] = {1.f, 2.f, 3.f, 4.f};
struct Pair { float a, b; Pair(const Pair&) = delete; __device__ float sum() const { return a + b; } };
template <typename T> __device__ __forceinline__ float to_f(T v) { return (float)v; }
__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }
namespace detail { __device__ float twice(float x) { return 2.f * x; } }
extern "C" __global__ void __launch_bounds__(256) k(float* __restrict__ y, int n) {
  static __shared__ float s[32];
  static constexpr int K = 4;
  extern __shared__ float dyn[];
  const char* note = "uses %tid only";  // a comment with clock64() and %globaltimer in it
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(s[0]) : "l"(y));
#pragma unroll
  for (int i = 0; i < K; ++i) atomicAdd(y + i, table[i] + detail::twice(dyn[i]) + note[0]);
}
"""


def codes(src: str, files=("kernel.cu", "helpers.cuh")) -> set[tuple[str, int]]:
    return {(c, line) for c, line, _ in scan_cuda("kernel.cu", src.encode(), files)}


def test_an_honest_kernel_passes() -> None:
    assert scan_cuda("kernel.cu", HONEST.encode(), ["kernel.cu", "helpers.cuh"]) == []


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("#include <cuda_runtime.h>", "cuda_include"),
        ("#include <fstream>", "cuda_include"),
        ('#include "../secrets.cuh"', "cuda_include"),
        ('#include "notmine.cuh"', "cuda_include"),
        ("#include HEADER", "cuda_include"),
        ("#if __has_include(<x.h>)\n#endif", "cuda_include"),
        ("#include_next <cuda_fp16.h>", "cuda_include"),
        ("__device__ int counter;", "device_state"),
        ("__device__ __align__(16) float last[4];", "device_state"),
        ("__device__ const float lut[2] = {1.f, 2.f};", "device_state"),
        ("namespace { __device__ float hidden; }", "device_state"),
        ("__managed__ int shared_with_host;", "device_state"),
        ("__host__ void on_the_cpu() {}", "cuda_host_code"),
        ('__device__ void f(long long* t) { asm("mov.u64 %0, %%global" "timer;" : "=l"(*t)); }',
         "cuda_timer"),
        ('__device__ void f(unsigned* t) { asm("mov.u32 %0, %%smid;" : "=r"(*t)); }', "cuda_timer"),
        ("__device__ long long f() { return clock64(); }", "cuda_timer"),
        ("__device__ long long f() { return clock(); }", "cuda_timer"),
        ("__device__ int f() { static int calls; return calls++; }", "device_state"),
        ("__device__ float* f() { return (float*)malloc(16); }", "device_state"),
        ("__device__ float* f() { return new float[4]; }", "device_state"),
        ('__device__ void f() { printf("x"); }', "cuda_host_code"),
        ("__device__ void f(int* p) { cudaMalloc((void**)&p, 4); }", "cuda_host_code"),
        ('extern "C" __global__ void g(float* y) { g<<<1, 1>>>(y); }', "cuda_host_code"),
    ],
)  # fmt: skip
def test_each_rule_rejects_what_it_names_on_its_line(line: str, code: str) -> None:
    src = HONEST + "\n" + line + "\n"
    found = codes(src)
    first = HONEST.count("\n") + 2
    assert code in {c for c, n in found if n >= first}, found
    assert all(n >= first for _, n in found), found  # the honest part stays clean


def test_the_shipped_cuda_kernels_pass_the_scan() -> None:
    files = [p for t in list_tasks() for p in Path(load_task(t).root).glob("*/*.cu")]
    assert len(files) >= 6
    for path in files:
        assert scan_cuda(path.name, path.read_bytes(), [path.name]) == [], path


def test_a_candidates_cu_files_are_scanned_with_its_python() -> None:
    report = scan_sources({"kernel.py": b"import torch\n", "kernel.cu": b"__device__ int c;\n",
                           "kernel.cuh": b"__device__ long long t() { return clock64(); }\n"})  # fmt: skip
    assert {(f.code, f.file, f.line, f.severity) for f in report.findings} == {
        ("device_state", "kernel.cu", 1, "reject"), ("cuda_timer", "kernel.cuh", 1, "reject")
    }  # fmt: skip
    assert report.files == ["kernel.cu", "kernel.cuh", "kernel.py"]


@pytest.mark.parametrize(
    ("src", "code"),
    [
        ("from torch.utils.cpp_extension import load_inline", "host_extension"),
        ("import torch.utils.cpp_extension as ext", "host_extension"),
        ("import torch\nf = torch.cuda.jiterator._create_jit_fn('x')", "host_extension"),
        ("import numba", "host_extension"),
        ("from cuda.bindings import driver", "host_extension"),
        ("import pycuda.autoinit", "host_extension"),
        ("import ctypes\nlib = ctypes.CDLL('libk.so')", "introspection"),
        ("import cupy\nk = cupy.RawKernel('', 'k')", "host_compute"),
        ("from harnesslab_cuda import _launch", "private_api"),
        ("import harnesslab_cuda\nharnesslab_cuda._launch(None)", "private_api"),
        ("import harnesslab_cuda\nharnesslab_cuda.load = print", "monkey_patch"),
        ("import cudadrv", "harness_access"),
        ("from nvrtc import get", "harness_access"),
    ],
)
def test_python_that_runs_native_code_outside_the_launcher_is_refused(src: str, code: str) -> None:
    report = scan_sources({"kernel.py": src.encode()})
    assert code in {f.code for f in report.rejects}, report.findings


def test_the_launcher_itself_is_allowed() -> None:
    src = b"from harnesslab_cuda import aligned, load\nk = load('kernel.cu', 'k')\n"
    assert scan_sources({"kernel.py": src}).rejects == []


@pytest.mark.parametrize(
    "header",
    ["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "stdint.h", "cstdint", "mma.h",
     "cuda_pipeline_primitives.h", "cooperative_groups.h", "cooperative_groups/reduce.h"],
)  # fmt: skip
def test_each_device_header_a_kernel_needs_may_be_included(header: str) -> None:
    assert codes(f"#include <{header}>\n") == set()


def test_a_quoted_include_names_one_of_the_candidates_own_cuh_files_by_its_name() -> None:
    """Rule: only a .cuh of the candidate's (matched by file name, wherever it lies); a .cu of
    its own is code compiled twice, not a header."""
    assert codes('#include "kernel.cu"\n') == {("cuda_include", 1)}
    assert codes('#include "helpers.cuh"\n', files=["kernel.cu", "src/helpers.cuh"]) == set()


def test_text_inside_string_literals_is_not_code() -> None:
    src = 'const char* s = "malloc( new delete printf( cudaMalloc( clock64( <<< __managed__";\n'
    assert codes(src) == set()


def test_a_file_that_is_not_utf8_is_still_scanned() -> None:
    found = scan_cuda("kernel.cu", b"__device__ int c;\xff\xfe\n", ["kernel.cu"])
    assert [(c, n) for c, n, _ in found] == [("device_state", 1)]


def test_the_device_heap_is_refused_whatever_the_statement_around_it() -> None:
    """Rule: only `= delete` (a deleted function) is no heap: `new` after `=` and a `delete`
    statement are."""
    assert codes("__device__ void f() { float* p = new float[4];\n}\n") == {("device_state", 1)}
    assert codes("__device__ void f(float* p) {\n delete p; }\n") == {("device_state", 2)}
    assert codes("struct P { P(const P&) = delete; };\n") == set()


def test_each_host_call_says_what_it_is() -> None:
    src = b'__device__ void f(int* p) { printf("x"); puts("y"); cudaMalloc((void**)&p, 4); }'
    details = {d for c, _, d in scan_cuda("kernel.cu", src) if c == "cuda_host_code"}
    assert details == {
        "calls printf(): device printf; a .cu holds device code only",
        "calls puts(): device printf; a .cu holds device code only",
        "calls cudaMalloc(): a runtime/driver API; a .cu holds device code only",
    }


def test_a_timer_register_is_found_on_its_line_after_a_quote_character_literal() -> None:
    """Rule: a `'"'` character literal opens no string (the asm string after it is still
    read), and a register is reported on the line of its own character."""
    src = (
        "__device__ char quote() { return '\"'; }\n"
        "__device__ void f(unsigned* t) {\n"
        ' asm("mov.u32 %0, %%smid;" : "=r"(*t)); }\n'
    )
    assert codes(src) == {("cuda_timer", 3)}


@pytest.mark.parametrize(
    ("src", "found"),
    [
        ("__device__ long long f() { return clo\\\nck64(); }\n", {("cuda_timer", 1)}),
        ("__dev\\\nice__ int counter;\n", {("device_state", 1)}),
        ('__device__ void f(unsigned* t) { asm("mov.u32 %0, %%s\\\nmid;" : "=r"(*t)); }\n',
         {("cuda_timer", 1)}),
        ('__device__ void f(unsigned* t) { asm("mov.u32 %0, %\\\n%smid;" : "=r"(*t)); }\n',
         {("cuda_timer", 2)}),
        ("#incl\\\nude <cuda_runtime.h>\n", {("cuda_include", 1)}),
        ("__device__ void f() { mal\\  \nloc(4); }\n", {("device_state", 1)}),
        ("#define SUM(a, b) \\\n  ((a) + \\\n   (b))\n__device__ int x;\n", {("device_state", 4)}),
        ("__device__ int f() {\\\n static int n; return n; }\n", {("device_state", 2)}),
    ],
)  # fmt: skip
def test_a_backslash_newline_splice_hides_no_name_and_keeps_lines(src: str, found: set) -> None:
    """Rule: lines joined by a backslash-newline are read joined, as the preprocessor reads
    them (`clo\\` + `ck64()` is clock64(); a space before the newline, which GCC still joins,
    too), and a finding reports the line its text starts on in the file."""
    assert codes(src) == found


def test_an_honest_macro_continued_over_lines_passes() -> None:
    src = (
        "#define ADD(a, b) \\\n  ((a) + \\\n   (b))\n"
        "__device__ float f(float x) { return ADD(x, 1.f); }\n" + HONEST
    )
    assert codes(src) == set()

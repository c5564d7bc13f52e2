"""Reading CUDA C++ without compiling it (tools/gpu/cuda_cpp/cuda_source.py): comments and literals
blanked in place, includes, and a kernel's parameter types (what the launcher passes and the
recorder records)."""

from __future__ import annotations

import pytest

from harnesslab.tests.tools.gpu.cuda_support import staged

cs = staged("cuda_source")


def test_comments_and_strings_are_blanked_in_place() -> None:
    src = 'int a; // "x"\n/* two\nlines */ char* s = "a//b"; char c = \'"\';\n'
    out = cs.strip_comments(src)
    assert len(out) == len(src) and out.count("\n") == src.count("\n")
    assert '"x"' not in out and "two" not in out and '"a//b"' in out
    assert "a//b" not in cs.strip_comments(src, strings=True)


def test_includes_say_what_kind_they_are() -> None:
    src = '#include <cuda_fp16.h>\n  # include "mine.cuh"\n#include MACRO\n// #include <x.h>\n'
    assert cs.includes(src) == [
        (1, "cuda_fp16.h", "angle"), (2, "mine.cuh", "quote"), (3, "MACRO", "computed")
    ]  # fmt: skip


def types(src: str, expr: str, defines=None) -> list[tuple[str, str, str]]:
    return [(p.name, p.c_type, p.type) for p in cs.signature(src, expr, defines)]


def test_an_extern_c_kernels_parameters_are_read_with_their_qualifiers() -> None:
    src = """extern "C" __global__ void __launch_bounds__(256, 2)
    rms(const __half* __restrict__ x, __nv_bfloat16 *y, float eps, unsigned int n,
        int64_t big, size_t count, bool flag, double d, unsigned, const float w[]) {}"""
    assert types(src, "rms") == [
        ("x", "__half*", "ptr"), ("y", "__nv_bfloat16*", "ptr"), ("eps", "float", "fp32"),
        ("n", "unsigned int", "u32"), ("big", "int64_t", "i64"), ("count", "size_t", "u64"),
        ("flag", "bool", "i1"), ("d", "double", "fp64"), ("", "unsigned", "u32"),
        ("w", "float*", "ptr"),
    ]  # fmt: skip


def test_template_arguments_defines_and_typedefs_are_substituted() -> None:
    src = """typedef float acc_t;
using idx_t = long long;
namespace k { template <typename T, int VEC = 8, typename S = T>
__global__ void f(const T* x, S scale, acc_t a, idx_t n, SCALAR s) {} }"""
    got = types(src, "k::f<__half>", {"SCALAR": "__nv_bfloat16", "UNUSED": 3})
    assert got == [("x", "__half*", "ptr"), ("scale", "__half", "fp16"), ("a", "float", "fp32"),
                   ("n", "long long", "i64"), ("s", "__nv_bfloat16", "bf16")]  # fmt: skip


@pytest.mark.parametrize(
    ("src", "expr", "match"),
    [
        ('extern "C" __global__ void k(float4 v) {}', "k", "struct or vector type by value"),
        ('extern "C" __global__ void k(int& r) {}', "k", "is a reference"),
        ("__global__ void k(int a) {}\n__global__ void k(float a) {}", "k", "overloaded"),
        ('extern "C" __global__ void k(int a) {}', "other", "declares no __global__ function"),
        ("template <typename T> __global__ void k(T a) {}", "k", "type 'T'"),
    ],
)
def test_what_the_launcher_cannot_pass_is_an_error_that_says_why(src, expr, match) -> None:
    with pytest.raises(ValueError, match=match):
        cs.signature(src, expr)


def test_an_explicit_signature_takes_launcher_types_or_c_types() -> None:
    got = [(p.type, p.nbytes) for p in cs.parse_signature_text("ptr, const __half*, int, fp32")]
    assert got == [("ptr", 8), ("ptr", 8), ("i32", 4), ("fp32", 4)]
    with pytest.raises(ValueError, match="not ptr"):
        cs.parse_signature_text("ptr, float4")

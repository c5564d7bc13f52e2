"""Each rule of reading CUDA C++ without compiling it (tools/gpu/cuda_cpp/cuda_source.py), one
test per rule: what is blanked and where it ends, which `__global__` declarations count and
what their template heads are, how names are substituted, and which C type the launcher passes
as which scalar (checked against this machine's C ABI through ctypes)."""

from __future__ import annotations

import ctypes

import pytest

from harnesslab.tests.tools.gpu.cuda_support import staged

cs = staged("cuda_source")


def params(src: str, expr: str = "k", defines=None) -> list[tuple[str, str, str, str]]:
    return [(p.name, p.c_type, p.type, p.pointee) for p in cs.signature(src, expr, defines)]


def one(decl: str) -> tuple[str, str, str, str]:
    (got,) = params(f"__global__ void k({decl}) {{}}")
    return got


# -- blanking ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "code", "strings"),
    [
        ("a // c\nb", "a     \nb", "a     \nb"),
        ("a // to the end", "a              ", "a              "),
        ("a /* x\ny */ b", "a     \n     b", "a     \n     b"),
        ("/**/x", "    x", "    x"),
        ("a /* never closed\nb", "a" + " " * 16 + "\n ", "a" + " " * 16 + "\n "),
        ('s = "a\\"b"; c', 's = "a\\"b"; c', 's = "    "; c'),
        ('c = \'"\'; d = "//"', 'c = \'"\'; d = "//"', "c = ' '; d = \"  \""),
        ('s = "torn\nx', 's = "torn\nx', 's = "    \nx'),
        ('s = "at the end', 's = "at the end', 's = "' + " " * 9 + "d"),  # as if "d" closed it
        ('a = ""; b = "x"', 'a = ""; b = "x"', 'a = ""; b = " "'),
        ('s = "\\\\"; t = "x"', 's = "\\\\"; t = "x"', 's = "  "; t = " "'),
        ('s = "torn\nint y; "z"', 's = "torn\nint y; "z"', 's = "    \nint y; " "'),
    ],
)
def test_comments_and_literals_are_blanked_to_where_they_end(src, code, strings) -> None:
    assert cs.strip_comments(src) == code
    assert cs.strip_comments(src, strings=True) == strings


def test_lines_count_from_one() -> None:
    assert cs.line_of("a", 0) == 1
    assert cs.line_of("\nx", 1) == 2
    assert cs.line_of("a\nb\nc", 4) == 3


def test_an_include_target_is_stripped_and_its_line_kept_past_comments() -> None:
    src = "/* a\nb */\n#include < x.h >\n#include\n"
    assert cs.includes(src) == [(3, "x.h", "angle"), (4, "", "computed")]


# -- kernels --------------------------------------------------------------------------------------
def test_a_kernel_inside_a_string_or_comment_is_no_kernel() -> None:
    src = 'const char* s = "__global__ void fake(int a)";\n// __global__ void gone(int)\n'
    assert cs.kernels(src + "__global__ void k(int a) {}") == [cs.KernelDecl("k", 3, ["int a"], [])]


@pytest.mark.parametrize("attribute", sorted(["__launch_bounds__", "__cluster_dims__",
                                               "__maxnreg__", "__attribute__", "__declspec",
                                               "alignas"]))  # fmt: skip
def test_attributes_before_the_name_are_skipped(attribute: str) -> None:
    src = f"__global__ void {attribute}((256), 2) k(int a, float b) {{}}"
    (decl,) = cs.kernels(src)
    assert (decl.name, decl.params) == ("k", ["int a", "float b"])


def test_a_parenthesised_group_before_the_name_is_skipped() -> None:
    assert [d.name for d in cs.kernels("__global__ (x) void k(int a) {}")] == ["k"]


def test_a_parameters_label_names_its_index_type_and_name() -> None:
    a, b = cs.signature("__global__ void k(const float* x, int) {}", "k")
    assert (a.label(), b.label()) == ("parameter 0 (float* x)", "parameter 1 (int)")


def test_declarations_that_are_not_kernels_are_skipped() -> None:
    assert cs.kernels("__global__") == []
    assert cs.kernels("__global__ void k") == []
    assert cs.kernels("__global__ void k;") == []
    assert cs.kernels("__global__ { }") == []
    assert [d.name for d in cs.kernels("__global__ void ns::k(int a) {}")] == ["k"]
    assert [d.params for d in cs.kernels("__global__ void k(void) {}\n__global__ void j() {}")
            ] == [[], []]  # fmt: skip
    with pytest.raises(ValueError, match="unbalanced"):
        cs.kernels("__global__ void k(int a, (b) {}")


def test_a_kernels_template_head_is_its_own_not_an_earlier_functions() -> None:
    src = """template <typename T> __device__ T f(T x);
__global__ void plain(int a) {}
template <typename T, int VEC = 8, typename S = Pair<T, int>, >
__global__ void tpl(T a) {}
struct A {}; template <class U = float> __global__ void after_brace(U a) {}"""
    got = {d.name: d.template for d in cs.kernels(src)}
    assert got == {
        "plain": [],
        "tpl": [("T", ""), ("VEC", "8"), ("S", "Pair<T, int>")],
        "after_brace": [("U", "float")],
    }


def test_parameters_split_at_top_level_commas_only() -> None:
    assert cs.split_top("a<b, c>, f(d, e), g[h, i], {j, k}, l") == [
        "a<b, c>", "f(d, e)", "g[h, i]", "{j, k}", "l"]  # fmt: skip
    assert cs.split_top("a, b, ") == ["a", "b"]
    assert cs.split_top("") == []


# -- signatures -----------------------------------------------------------------------------------
def test_a_declaration_and_its_definition_are_one_kernel_its_defaults_from_the_first() -> None:
    src = """template <typename T = float> __global__ void k(T a);
template <typename T> __global__ void k(T a) {}"""
    assert params(src, "k<>") == [("a", "float", "fp32", "")]
    assert params(src, "k<double>") == [("a", "double", "fp64", "")]


def test_the_kernel_named_is_the_one_read() -> None:
    src = "__global__ void a(int x) {}\n__global__ void k(float y) {}"
    assert params(src, "ns::k") == [("y", "float", "fp32", "")]
    with pytest.raises(ValueError, match=r"kernel\.cu:3: k\(\) is overloaded"):
        params(src + "\n__global__ void k(int y) {}")


def test_template_arguments_past_the_given_take_their_defaults() -> None:
    src = (
        "template <typename A, typename B = double, typename C> __global__ void k(A a, B b, C c) {}"
    )
    assert params(src, "k<float>", {"C": "int"}) == [
        ("a", "float", "fp32", ""), ("b", "double", "fp64", ""), ("c", "int", "i32", "")]  # fmt: skip
    with pytest.raises(ValueError, match="type 'C'"):
        params(src, "k<float>", {"C": 4})  # only string defines are types


def test_typedefs_and_defines_resolve_through_chains_of_at_most_eight() -> None:
    chain = "".join(f"typedef t{i + 1} t{i};\n" for i in range(8))  # t0 -> t1 ... -> t8
    src = chain + "typedef const float t8;\n__global__ void k(t0 x, t1 y) {}"
    with pytest.raises(ValueError, match="type 't8'"):  # nine steps: one too many
        params(src)
    eight = "".join(f"typedef t{i + 1} t{i};\n" for i in range(1, 8))  # t1 -> ... -> t8
    assert params(eight + "typedef const float t8;\n__global__ void k(t1 y) {}") == [
        ("y", "float", "fp32", "")]  # fmt: skip
    assert params("using idx_t = unsigned long long;\n__global__ void k(idx_t n) {}") == [
        ("n", "unsigned long long", "u64", "")]  # fmt: skip


def test_a_typedef_inside_a_string_is_no_typedef() -> None:
    src = 'typedef float acc_t;\nconst char* s = "typedef double acc_t;";\n'
    assert params(src + "__global__ void k(acc_t a) {}") == [("a", "float", "fp32", "")]


def test_a_default_value_is_not_part_of_a_parameter() -> None:
    assert one("int n = DEFAULT_N") == ("n", "int", "i32", "")
    assert one("float* p = nullptr") == ("p", "float*", "ptr", "float")


def test_a_single_word_is_a_type_never_a_name() -> None:
    assert one("size_t") == ("", "size_t", "u64", "")
    assert one("const __half") == ("", "__half", "fp16", "")


def test_a_define_of_a_pointer_type_is_a_pointer() -> None:
    assert params("__global__ void k(P x) {}", "k", {"P": "float *"}) == [
        ("x", "float*", "ptr", "float")]  # fmt: skip


def test_qualifiers_are_not_part_of_a_type() -> None:
    for q in ["const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
              "struct", "typename"]:  # fmt: skip
        assert one(f"{q} float* x") == ("x", "float*", "ptr", "float")
        assert one(f"{q} int n") == ("n", "int", "i32", "")


def test_a_pointer_is_a_star_or_an_array() -> None:
    assert one("float w[4]") == ("w", "float*", "ptr", "float")
    assert one("float* w") == ("w", "float*", "ptr", "float")
    assert one("int n = 4") == ("n", "int", "i32", "")
    with pytest.raises(ValueError, match="is a reference"):
        one("float& r")


@pytest.mark.parametrize("word", ["int", "char", "short", "long", "unsigned", "signed", "float",
                                  "double", "bool"])  # fmt: skip
def test_a_type_word_is_never_a_parameters_name(word: str) -> None:
    try:
        got = one(f"long {word}")
    except ValueError as exc:  # `long double`, `long float`, ...: a type the launcher refuses
        assert f"'long {word}'" in str(exc)
    else:
        assert got[:2] == ("", f"long {word}")


# The launcher's scalar for each C type: signedness and width as this machine's C compiler has
# them (LP64 Linux: long is 64-bit, char signed).
def _int(ct) -> str:
    return ("i" if ct(-1).value < 0 else "u") + str(8 * ctypes.sizeof(ct))


ABI = {
    "bool": "i1", "char": _int(ctypes.c_byte), "signed char": _int(ctypes.c_byte),
    "int8_t": _int(ctypes.c_int8), "unsigned char": _int(ctypes.c_ubyte),
    "uint8_t": _int(ctypes.c_uint8), "short": _int(ctypes.c_short),
    "short int": _int(ctypes.c_short), "signed short": _int(ctypes.c_short),
    "int16_t": _int(ctypes.c_int16), "unsigned short": _int(ctypes.c_ushort),
    "unsigned short int": _int(ctypes.c_ushort), "uint16_t": _int(ctypes.c_uint16),
    "int": _int(ctypes.c_int), "signed": _int(ctypes.c_int), "signed int": _int(ctypes.c_int),
    "int32_t": _int(ctypes.c_int32), "unsigned": _int(ctypes.c_uint),
    "unsigned int": _int(ctypes.c_uint), "uint32_t": _int(ctypes.c_uint32),
    "long": _int(ctypes.c_long), "long int": _int(ctypes.c_long),
    "long long": _int(ctypes.c_longlong), "long long int": _int(ctypes.c_longlong),
    "signed long long": _int(ctypes.c_longlong), "int64_t": _int(ctypes.c_int64),
    "ptrdiff_t": _int(ctypes.c_ssize_t), "intptr_t": _int(ctypes.c_ssize_t),
    "unsigned long": _int(ctypes.c_ulong), "unsigned long int": _int(ctypes.c_ulong),
    "unsigned long long": _int(ctypes.c_ulonglong),
    "unsigned long long int": _int(ctypes.c_ulonglong), "uint64_t": _int(ctypes.c_uint64),
    "size_t": _int(ctypes.c_size_t), "uintptr_t": _int(ctypes.c_size_t),
    "float": "fp32", "double": "fp64", "__half": "fp16", "half": "fp16",
    "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16",
}  # fmt: skip
WIDTH = {"i1": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}


@pytest.mark.parametrize("c_type", sorted(ABI))
def test_each_c_scalar_is_passed_at_its_abi_width_and_sign(c_type: str) -> None:
    (p,) = cs.signature(f"__global__ void k({c_type} v) {{}}", "k")
    assert (p.name, p.c_type, p.type) == ("v", c_type, ABI[c_type])
    expected = WIDTH.get(p.type) or int(p.type[1:]) // 8
    assert p.nbytes == expected
    assert cs.parse_signature_text(p.type)[0].nbytes == expected
    assert cs.parse_signature_text(c_type)[0].type == ABI[c_type]


def test_every_floating_element_type_has_its_torch_dtype() -> None:
    floats = {t for t, s in ABI.items() if s.startswith(("fp", "bf"))}
    assert set(cs.POINTEE_DTYPES) == floats
    widths = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
    assert all(widths[cs.POINTEE_DTYPES[t]] == WIDTH[ABI[t]] for t in floats)
    assert cs.parse_signature_text("ptr")[0].nbytes == 8


def test_an_explicit_signature_keeps_the_pointee_without_qualifiers() -> None:
    got = [(p.c_type, p.type, p.pointee) for p in cs.parse_signature_text(
        "ptr, const __restrict__ __half*, u8, unsigned int")]  # fmt: skip
    assert got == [("ptr", "ptr", ""), ("const __restrict__ __half*", "ptr", "__half"),
                   ("u8", "u8", ""), ("unsigned int", "u32", "")]  # fmt: skip
    with pytest.raises(ValueError, match="'float4' is not ptr"):
        cs.parse_signature_text("float4")

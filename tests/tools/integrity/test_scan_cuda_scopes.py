"""The scope-aware rules of the CUDA scan (scan_cuda._declarations), rule by rule: a `static`
is flagged only inside a function's block, never a class member; a preprocessor line (with its
continuations) is no statement; a stray brace never breaks the scan."""

from __future__ import annotations

from harnesslab.tools.integrity.scan_cuda import scan_cuda

STATIC = ("device_state", "a function-local static outlives the launch")


def found(src: str) -> list[tuple[str, int]]:
    return [(c, line) for c, line, _ in scan_cuda("kernel.cu", src.encode(), ["kernel.cu"])]


def test_a_class_members_static_is_not_a_function_local() -> None:
    """Rule: a struct/class/union body is no block: its `static` members are not flagged."""
    assert found("struct S { static int count; };\nunion U { static int n; };\n") == []


def test_a_function_returning_a_struct_opens_a_block() -> None:
    """Rule: a head with a parameter list is a function, even when it names a struct."""
    assert found("__device__ struct S make(int a) {\n static int n; return S(); }\n") == [
        ("device_state", 2)]  # fmt: skip


def test_a_nested_block_is_still_a_block() -> None:
    """Rule: a brace without a head inside a function is a block too (static flagged)."""
    assert found("__device__ void f() {\n {\n static int n; } }\n") == [("device_state", 3)]


def test_a_statement_inside_a_block_does_not_close_it() -> None:
    """Rule: only `}` closes a scope: a static after other statements is still local, and the
    statement's first character is read."""
    assert found("__device__ void f() { int a;\nstatic int n; }\n") == [("device_state", 2)]
    assert found("__device__ void f() {static int n; }\n") == [("device_state", 1)]


def test_a_stray_closing_brace_never_breaks_the_scan() -> None:
    """Rule: a `}` with no open scope is read, not a crash, and the rules after it still hold."""
    assert found("}\n__device__ int x;\n") == [("device_state", 2)]


def test_a_preprocessor_line_and_its_continuations_are_no_statement() -> None:
    """Rule: a `#` line and the lines its backslashes continue are skipped, and only those."""
    assert found("#define M(a) \\\n  { static int n; }\n__device__ int ok() { return 1; }\n") == []
    assert found("#define M \\\n\n{ static int n; }\n") == [("device_state", 3)]


def test_an_attribute_with_nested_parentheses_is_dropped_whole() -> None:
    """Rule: `__align__((8))` and `__attribute__((noinline))` are not parameter lists: a
    variable after one is still a __device__ variable, a function after one is not."""
    assert found("__device__ __align__((8)) float last[4] = {0};\n") == [("device_state", 1)]
    assert found("__device__ __attribute__((noinline)) float f(float x) { return x; }\n") == []
    assert found("__device__ __attribute__((aligned(8))) int v;\n") == [("device_state", 1)]


def test_operators_default_template_arguments_and_aligned_structs_are_no_device_state() -> None:
    """Rule: an operator's symbols (`operator[]`, `operator=`), a template's default arguments
    and an attribute before a struct's name do not make a function look like a variable or a
    struct's member look like a function-local static (honest kernels that NVRTC compiles)."""
    assert (
        found(
            "struct V { float a[4];\n"
            "  __device__ float& operator[](int i) { return a[i]; }\n"
            "  __device__ V& operator=(const V& o) { a[0] = o.a[0]; return *this; }\n"
            "  __device__ bool operator==(const V& o) const { return a[0] == o.a[0]; }\n"
            "  __device__ float operator()(int i) const { return a[i]; } };\n"
            "template <int N = 4> __device__ float scale(float x) { return x * N; }\n"
            "template <typename T = float, int M = (1 > 0)> __device__ T zero() { return T(0); }\n"
            "struct __align__(16) W { float x; static __device__ W make() { return W{0.f}; } };\n"
        )
        == []
    )


def test_a_templated_or_operator_initialised_device_variable_is_still_refused() -> None:
    """Rule: what the declarator reading drops never hides a variable: a variable template, a
    `>` inside a default argument's parentheses, an initialiser that calls an operator."""
    assert found("template <typename T> __device__ T counter = T(0);\n") == [("device_state", 1)]
    assert found("template <int N = (1 > (0))> __device__ int v = N;\n") == [("device_state", 1)]
    assert found("__device__ float v = operator+(1.f, 2.f);\n") == [("device_state", 1)]


def test_a_directive_that_ends_the_file_without_a_newline_ends_the_scan() -> None:
    """Rule: a last directive with a backslash before its last character (no newline after it)
    ends the scan; it does not send the reader back into the file."""
    assert found("__device__ int counter;\n#define A \\x") == [("device_state", 1)]


def test_a_local_struct_closes_its_own_scope_only() -> None:
    """Rule: a struct's closing brace pops the struct, not the function around it: a static
    after a local struct is still function-local."""
    src = "__device__ int f() { struct L { int a; };\n static int n; return n++; }\n"
    assert found(src) == [("device_state", 2)]


def test_a_template_struct_is_a_struct_however_the_list_is_spaced() -> None:
    """Rule: the text right after a template parameter list is read: `template <typename
    T>struct` opens a struct (its static member function is no function-local static)."""
    src = "template <typename T>struct Box { static __device__ T make() { return T(0); } };\n"
    assert found(src) == []


def test_a_function_whose_trailing_return_type_names_a_struct_is_a_function() -> None:
    """Rule: a head with a parameter list opens a block even when a struct keyword follows."""
    src = "struct S { int v; };\n__device__ auto make(int a) -> struct S {\n static int n; }\n"
    assert found(src) == [("device_state", 3)]


def test_inside_a_function_only_a_static_is_device_state() -> None:
    """Rule: a block's statements are judged by the static rule alone: a block-scope `extern`
    declaration names the file-scope variable (refused where it is defined), it is none."""
    src = "__device__ int g = 0;\n__device__ int get() {\n extern __device__ int g; return g; }\n"
    assert found(src) == [("device_state", 1)]


def test_device_constant_memory_is_a_table_not_state() -> None:
    assert found("__device__ __constant__ float lut[2] = {1.f, 2.f};\n") == []


def test_a_statement_closed_by_a_brace_without_a_semicolon_does_not_break_the_scan() -> None:
    assert found("namespace a { __device__ int x }\n__device__ int y;\n") == [("device_state", 2)]


def test_attribute_arguments_are_dropped_whole_whatever_they_hold() -> None:
    """Rule: an attribute's parentheses end at their own closing one: a call inside
    (`sizeof(float4)`) or nested parentheses hide no variable and make no function one, and
    the text right after the attribute is read."""
    assert found("__device__ __align__(sizeof(float4)) float buf[4];\n") == [("device_state", 1)]
    assert found("__device__ __attribute__((optimize(3))) float f(float x) { return x; }\n") == []
    assert found("__device__ int last __attribute__((unused))=int(0);\n") == [("device_state", 1)]


def test_a_device_variable_with_a_parenthesised_initialiser_is_refused() -> None:
    """Rule: `__device__ int counter(0);` is a variable (an expression in the parentheses), not
    a function declaration; so is a function pointer `(*fp)(int)` and an initialiser naming a
    value (`(N)`, `(a + 1)`): each one outlives the launch."""
    for src in ("__device__ int counter(0);\n", "__device__ int (*fp)(int);\n",
                "__device__ unsigned long long c(N);\n", "__device__ int c(-1), d;\n",
                "__device__ float v(float(2) + x);\n", "__device__ int c(0), e(1);\n"):  # fmt: skip
        assert found(src) == [("device_state", 1)], src


def test_a_device_function_declaration_is_no_variable() -> None:
    """Rule: a prototype is a function whatever its parameter list: empty, `void`, types
    alone, named parameters, pointers, references, arrays, qualified and template types,
    default arguments, variadic."""
    src = (
        "__device__ float f(float);\n__device__ void g();\n__device__ int h(void);\n"
        "__device__ float dot(const float* __restrict__ a, const float& b, int n = 4);\n"
        "__device__ void k(unsigned int, long long x[4], int8_t, __half);\n"
        "__device__ void t(Tile<float, 4> tile, ns::Vec v, int m = (1 + 2));\n"
        "__device__ int printlike(const char* fmt, ...);\n__device__ void z(void*);\n"
        "__device__ float f(float x) { return x; }\n"
        "template <typename T> __device__ float zero(T) { return 0.f; }\n"  # a definition
    )
    assert found(src) == []


def test_a_brace_in_a_dead_if_0_branch_moves_no_scope() -> None:
    """Rule: text in an `#if 0` branch is not compiled, so its braces open and close nothing:
    a `{` there hides no later __device__ variable, a `}` there ends no function (nested
    conditionals counted; the `#else` of an `#if 0` is live)."""
    assert found("#if 0\n{\n#endif\n__device__ int counter;\n") == [("device_state", 4)]
    src = "__device__ int f() {\n#if 0\n}\n#endif\n static int n; return n++; }\n"
    assert found(src) == [("device_state", 5)]
    src = "#if 0\n#if 1\n}\n#endif\n{\n#endif\n__device__ int c;\n"
    assert found(src) == [("device_state", 7)]
    assert found("#if 0\n{\n#else\n__device__ int c;\n#endif\n") == [("device_state", 4)]
    assert found("#if 0\n#else\n{\n#endif\n__device__ int c;\n") == []  # the live `{` counts
    assert found("#ifdef X\n#if 0\n{\n#endif\n#else\n#endif\n__device__ int c;\n") == [
        ("device_state", 7)]  # fmt: skip


def test_a_declaration_in_a_dead_if_0_branch_is_not_compiled() -> None:
    assert found("#if 0\n__device__ int debug_counter;\n#endif\n#if 1\n#endif\n") == []


def test_only_if_0_is_dead_and_a_stray_or_nested_directive_keeps_its_place() -> None:
    """Rule: any other condition is read; a branch nested in a dead one is dead whatever its
    condition, and its #else too; a #endif pops its own conditional only; a stray #else or
    #endif breaks nothing."""
    assert found("#if N > 0\n__device__ int c;\n#endif\n") == [("device_state", 2)]
    assert found("#if 0\n#if 1\n{\n#endif\n#endif\n__device__ int c;\n") == [("device_state", 6)]
    src = "#if 0\n#if 0\n#else\n{\n#endif\n#endif\n__device__ int c;\n"
    assert found(src) == [("device_state", 7)]
    src = "#if 0\n#ifdef A\n#else\n#endif\n{\n#endif\n__device__ int c;\n"
    assert found(src) == [("device_state", 7)]
    assert found("#endif\n#else\n__device__ int c;\n") == [("device_state", 3)]


def test_what_the_declarator_reading_drops_ends_where_it_should() -> None:
    """Rule: a template list ends at its own `>` (a `>` in parentheses compares), and an
    attribute ends at its own `)`: the `=` right after either is still read."""
    src = "template <int M = (1 > 0), int K = 2> __device__ float g(float x) { return x; }\n"
    assert found(src) == []
    assert found("__device__ int last __attribute__((unused))=(int)2.5f;\n") == [
        ("device_state", 1)
    ]

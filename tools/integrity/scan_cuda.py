"""Static scan of a candidate's CUDA C++ (.cu, .cuh) before it runs: device code only.

Side of the trust boundary: trusted (reads the candidate's files as text; compiles nothing).

A .cu file is compiled by NVRTC through harnesslab_cuda and only its device code ever runs: the
launcher in kernel.py is the host. What a kernel needs is allowed: `__global__`/`__device__`
functions, templates, `__constant__` tables (read-only), `__shared__` memory (gone with the
block), warp intrinsics, atomics (on memory passed in: there is no other), inline `asm` for
instructions, the preprocessor, and the headers in ALLOWED_INCLUDES (device types and
intrinsics). What only a gamed kernel needs is refused, each with file:line:

- cuda_include: any other `#include` (a header is code the scan did not read; host headers
  are host APIs), a computed `#include MACRO`, `__has_include` (probes the file system), a
  `"x.cuh"` that is not one of the candidate's own files.
- cuda_timer: `clock()`, `clock64()`, and PTX special registers that read a timer or say which
  SM, warp or graph runs the code (%globaltimer, %clock64, %smid, %current_graph_exec, ...),
  in any string of the file (adjacent literals joined: `"%%global" "timer"` is caught). A kernel
  that can tell time can tell a timed run from a checked one.
- device_state: `__device__`/`__managed__` variables outside a function and function-local
  `static`s (memory that outlives a launch: device-side memoisation across calls), and the
  device heap (`malloc`, `free`, `new`, `delete`).
- cuda_host_code: `__host__`-only functions (NVRTC never runs them; they only mislead),
  `printf` (allowed in eval for debugging, refused here), runtime API calls (`cudaMalloc`,
  ...), and `<<<...>>>` launches from device code.

The text is read as the preprocessor's phase 2 leaves it: a backslash-newline joins two lines
(`clo\\` + `ck64()` is a timer), and findings name the line in the file; the scope rules skip
`#if 0` branches (a brace there is never compiled). Macros can hide a
name from a text scan; the PTX check of what NVRTC actually built
(tools/gpu/cuda_cpp/nvrtc.ptx_findings: timers, device globals, external calls) cannot be hidden from,
and the launcher runs it at every load.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ..gpu.cuda_cpp import cuda_source
from ..gpu.cuda_cpp.nvrtc import SPECIAL_REGISTERS

ALLOWED_INCLUDES = {
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "stdint.h", "cstdint", "mma.h",
    "cuda_pipeline_primitives.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
}  # fmt: skip
TIMER_CALL = re.compile(r"\b(clock|clock64|__clock|__globaltimer|globaltimer)\s*\(")
HEAP_CALL = re.compile(r"\b(malloc|free|__nv_aligned_device_malloc|cudaMalloc|cudaFree)\s*\(")
HEAP_WORD = re.compile(r"\b(new|delete)\b")
HOST_CALL = re.compile(r"\b(printf|fprintf|puts|cuda[A-Z]\w*|cu[A-Z][a-z]\w*)\s*\(")
FILE_PROBE = re.compile(r"\b(__has_include|__has_include_next)\b|^[ \t]*#[ \t]*(include_next|import|embed)\b", re.M)  # fmt: skip
ATTRIBUTE_CALL = re.compile(r"\b(__align__|alignas|__attribute__|__launch_bounds__|__declspec)\s*\(")  # fmt: skip
SPLICE = re.compile(r"\\[ \t]*\r?\n")
CONDITIONAL = re.compile(r"[ \t]*#[ \t]*(ifdef|ifndef|if|elif|else|endif)\b(.*)")
CHAR_LITERAL = re.compile(r"'(?:[^'\\\n]|\\.)+'")
SCOPE_NAMESPACE = re.compile(r'^\s*(?:inline\s+)?(?:namespace\b[\w\s:]*|extern\s*"\s*"\s*)$')
SCOPE_CLASS = re.compile(r"\b(?:struct|class|union)\b[^()]*$")
PARAMETER = re.compile(r"(?:[A-Za-z_][\w:]*(?:\s*<[^()]*>)?|[*&\s]|\[[^\]]*\])+")
TYPE_NAMES = {*cuda_source.SCALAR_TYPES, "void"}  # `int`, `unsigned`, ...: one word of a type
OPERATOR_NAME = re.compile(r"\boperator\b\s*(?:\(\s*\)|[^\w\s(]+|\w+)")  # `operator[]`: one name

Finding = tuple[str, int, str]  # (code, line, detail)


def scan_cuda(rel: str, data: bytes, own_files: Iterable[str] = ()) -> list[Finding]:
    """(code, line, detail) for each rule `rel` breaks. `own_files`: the candidate's files
    (a quoted include must name one of them)."""
    text = data.decode("utf-8", errors="replace")
    src, where = _splice(text)  # read as the preprocessor reads it; `where` maps back to `text`
    code = cuda_source.strip_comments(src, strings=True)  # no comment or literal text
    own = {f.rsplit("/", 1)[-1] for f in own_files}
    out: list[Finding] = []

    def line_of(offset: int) -> int:  # the line in the file where src[offset] stands
        return cuda_source.line_of(text, where[offset])

    def add(c: str, offset: int, detail: str) -> None:
        out.append((c, line_of(offset), detail))

    line_starts = [0] + [m.end() for m in re.finditer("\n", src)]
    for spliced_line, target, kind in cuda_source.includes(src):
        line = line_of(line_starts[spliced_line - 1])
        if kind == "computed":
            out.append(("cuda_include", line, f"#include {target}: a computed include"))
        elif kind == "quote" and (target not in own or not target.endswith(".cuh")):
            out.append(("cuda_include", line,
                        f'#include "{target}": not one of the candidate\'s .cuh files'))  # fmt: skip
        elif kind == "angle" and target not in ALLOWED_INCLUDES:
            out.append(("cuda_include", line,
                        f"#include <{target}>: allowed are {', '.join(sorted(ALLOWED_INCLUDES))}"))  # fmt: skip
    for m in FILE_PROBE.finditer(code):
        add("cuda_include", m.start(), f"{m.group(0).strip()}: probes or reads files")
    for m in TIMER_CALL.finditer(code):
        add("cuda_timer", m.start(), f"calls {m.group(1)}(): kernels may not read timers")
    joined, starts = _string_text(src)
    for m in SPECIAL_REGISTERS.finditer(joined):
        add("cuda_timer", starts[m.start()], f"reads %{m.group(1)} (a timer or hardware identity)")
    for m in HEAP_CALL.finditer(code):
        add("device_state", m.start(), f"{m.group(1)}(): the device heap outlives a launch")
    for m in HEAP_WORD.finditer(code):
        if m.group(1) == "delete" and code[: m.start()].rstrip().endswith("="):
            continue  # `= delete`: a deleted function, not the heap
        add("device_state", m.start(), f"{m.group(1)}: the device heap outlives a launch")
    for m in re.finditer(r"\b__managed__\b", code):
        add("device_state", m.start(), "__managed__ memory outlives a launch")
    for m in HOST_CALL.finditer(code):
        name = m.group(1)
        what = "device printf" if "put" in name or "printf" in name else "a runtime/driver API"
        add("cuda_host_code", m.start(), f"calls {name}(): {what}; a .cu holds device code only")
    for m in re.finditer(r"<<<", code):
        add("cuda_host_code", m.start(), "<<<...>>>: a launch from device code")
    out += _declarations(_live(code), line_of)
    return list(dict.fromkeys(out))  # one finding per code, line and detail


def _splice(text: str) -> tuple[str, list[int]]:
    """`text` with every backslash-newline removed (translation phase 2: `clo\\` + newline +
    `ck64()` is `clock64()`; GCC also joins across spaces before the newline, so this does), and
    for each character of the result its offset in `text`."""
    parts: list[str] = []
    where: list[int] = []
    at = 0
    for m in SPLICE.finditer(text):
        parts.append(text[at : m.start()])
        where += range(at, m.start())
        at = m.end()
    parts.append(text[at:])
    where += range(at, len(text))
    return "".join(parts), where


def _string_text(src: str) -> tuple[str, list[int]]:
    """Every string literal's contents, concatenated without spaces, and for each character the
    offset it came from (so split literals are read as the compiler joins them)."""
    text, starts = [], []
    text_src = CHAR_LITERAL.sub(lambda m: " " * len(m.group(0)), cuda_source.strip_comments(src))
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', text_src):
        for i, ch in enumerate(m.group(1)):
            if not ch.isspace():
                text.append(ch)
                starts.append(m.start(1) + i)
    return "".join(text), starts


def _live(code: str) -> str:
    """`code` with the text of `#if 0` branches blanked (offsets and lines kept): it is never
    compiled, and a brace there must not move the scope the declaration rules read. Other
    conditionals are read whole (which branch is taken is not known here)."""
    out: list[str] = []
    stack: list[bool] = []  # per open conditional: whether the text around it is dead
    dead = False
    for line in code.splitlines(keepends=True):
        m = CONDITIONAL.match(line)
        if m is None:
            out.append(re.sub(r"[^\n]", " ", line) if dead else line)
            continue
        out.append(line)
        word, cond = m.group(1), m.group(2).strip()
        if word.startswith("if"):  # `#ifdef 0` is no valid directive: only `#if 0` is dead
            stack.append(dead)
            dead = dead or cond == "0"
        elif stack and word == "endif":
            dead = stack.pop()
        elif stack:  # `#else`/`#elif`: live as far as known, unless the text around is dead
            dead = stack[-1]
    return "".join(out)


def _declarations(code: str, line_of: Callable[[int], int]) -> list[Finding]:
    """Scope-aware rules: `__device__` variables outside functions, `static` locals inside
    them, `__host__`-only functions."""
    out: list[Finding] = []
    scopes: list[str] = []  # "namespace", "class" or "block" per open brace
    stmt_start = 0
    i = 0
    while i < len(code):
        ch = code[i]
        if ch == "#":  # a preprocessor line: not a statement
            end = code.find("\n", i)  # continuation lines are spliced already
            i = len(code) if end < 0 else end
            stmt_start = i
            continue
        if ch in "{;}":
            stmt = code[stmt_start:i]
            in_block = "block" in scopes
            _statement(stmt, stmt_start, in_block, ch, line_of, out)
            if ch == "{":
                head = _declarator(stmt).strip()
                if SCOPE_NAMESPACE.match(head):
                    scopes.append("namespace")
                elif SCOPE_CLASS.search(head) and "(" not in head:
                    scopes.append("class")
                else:
                    scopes.append("block")
            elif ch == "}" and scopes:
                scopes.pop()
            stmt_start = i + 1
        i += 1
    return out


def _statement(
    stmt: str, offset: int, in_block: bool, end: str, line_of: Callable[[int], int],
    out: list[Finding],
) -> None:  # fmt: skip
    words = set(re.findall(r"[A-Za-z_]\w*", stmt))
    line = line_of(offset + len(stmt) - len(stmt.lstrip()))
    if "__host__" in words and "__device__" not in words:
        out.append(("cuda_host_code", line, "a __host__ function: a .cu holds device code only"))
    if in_block:
        if "static" in words and not words & {"__shared__", "const", "constexpr"}:
            out.append(("device_state", line, "a function-local static outlives the launch"))
        return
    if "__device__" not in words or "__constant__" in words:
        return
    head = _declarator(stmt) + end
    first = re.search(r"[(;=\[{]", head)
    if first is None:
        return
    if first.group(0) != "(" or (end == ";" and not _is_parameter_list(head, first.start())):
        out.append(("device_state", line,
                    "a __device__ variable outlives the launch (tables go in __constant__)"))  # fmt: skip


def _is_parameter_list(head: str, start: int) -> bool:
    """Whether the parentheses at `head[start]` hold a parameter list (a function declaration)
    rather than an initialiser (`int counter(0);`, `int (*fp)(int);`): each parameter, its
    default argument dropped, is types and names only, with a type word or two names (a single
    unknown name, `c(N)`, is read as a value: name the parameter, `f(T x)`, to declare one)."""
    depth, end = 0, len(head)
    for j in range(start, len(head)):
        depth += {"(": 1, ")": -1}.get(head[j], 0)
        if depth == 0:
            end = j
            break
    parts = cuda_source.split_top(head[start + 1 : end])  # `()`: none
    return all(_is_parameter(part.partition("=")[0].strip()) for part in parts)


def _is_parameter(decl: str) -> bool:
    names = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"<.*>", "", decl)))
    return decl == "..." or (
        PARAMETER.fullmatch(decl) is not None and (bool(names & TYPE_NAMES) or len(names) >= 2)
    )


def _declarator(stmt: str) -> str:
    """`stmt` without what hides its declarator's shape: attributes (`__align__(16)`: their
    parentheses are no parameter list), template parameter lists (`template <int N = 4>`: no
    initializer) and operator symbols (`operator[]`, `operator=`: a function's name)."""
    stmt = OPERATOR_NAME.sub(" op ", _drop_attributes(stmt))
    while (m := re.search(r"\btemplate\s*<", stmt)) is not None:
        angles = parens = 0
        for j in range(m.end() - 1, len(stmt)):
            parens += {"(": 1, ")": -1}.get(stmt[j], 0)
            if parens == 0:  # `<` and `>` inside parentheses compare: `N = (1 > 0)`
                angles += {"<": 1, ">": -1}.get(stmt[j], 0)
            if angles == 0:
                break
        stmt = stmt[: m.start()] + " " + stmt[j + 1 :]
    return stmt


def _drop_attributes(stmt: str) -> str:
    """`stmt` without `__align__(16)`, `__launch_bounds__(256)` and the like (their parentheses
    are not a function's parameter list)."""
    while (m := ATTRIBUTE_CALL.search(stmt)) is not None:
        depth = 0
        for j in range(m.end() - 1, len(stmt)):
            depth += {"(": 1, ")": -1}.get(stmt[j], 0)
            if depth == 0:
                break
        stmt = stmt[: m.start()] + " " + stmt[j + 1 :]
    return stmt


__all__ = ["ALLOWED_INCLUDES", "scan_cuda"]

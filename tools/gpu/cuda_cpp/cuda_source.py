"""Reading CUDA C++ source without compiling it: comments and literals blanked with offsets and
lines kept, `#include` lines, and a kernel's parameter list (the launcher needs each
parameter's type to pass Python values; the recorder records them with these types).

Staged to the GPU host (harnesslab_cuda.py uses it in the candidate's process) and imported by
the host's static scan (tools/integrity/scan_cuda.py); standard library only. It reads
agent-written text: every failure is a ValueError that names the file, line and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# C parameter type -> the scalar type the replay packs (replay.SCALARS / guard_schema.SCALAR_TYPES)
SCALAR_TYPES: dict[str, str] = {
    "bool": "i1", "char": "i8", "signed char": "i8", "int8_t": "i8", "unsigned char": "u8",
    "uint8_t": "u8", "short": "i16", "short int": "i16", "signed short": "i16",
    "int16_t": "i16", "unsigned short": "u16", "unsigned short int": "u16", "uint16_t": "u16",
    "int": "i32", "signed": "i32", "signed int": "i32", "int32_t": "i32", "unsigned": "u32",
    "unsigned int": "u32", "uint32_t": "u32", "long": "i64", "long int": "i64",
    "long long": "i64", "long long int": "i64", "signed long long": "i64", "int64_t": "i64",
    "ptrdiff_t": "i64", "intptr_t": "i64", "unsigned long": "u64", "unsigned long int": "u64",
    "unsigned long long": "u64", "unsigned long long int": "u64", "uint64_t": "u64",
    "size_t": "u64", "uintptr_t": "u64", "float": "fp32", "double": "fp64", "__half": "fp16",
    "half": "fp16", "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16",
}  # fmt: skip
SCALAR_BYTES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2, "i32": 4,
                "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8, "ptr": 8}  # fmt: skip
# Element types a pointer parameter may name, and the torch dtype each means (others unchecked).
POINTEE_DTYPES = {"__half": "float16", "half": "float16", "__nv_bfloat16": "bfloat16",
                  "nv_bfloat16": "bfloat16", "float": "float32", "double": "float64"}  # fmt: skip
QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
              "struct", "typename"}  # fmt: skip
TYPE_WORDS = {"int", "char", "short", "long", "unsigned", "signed", "float", "double", "bool"}
ATTRIBUTES = {"__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__attribute__",
              "__declspec", "alignas"}  # fmt: skip
TOKEN = re.compile(r"[A-Za-z_]\w*|::|\*|&|\[|\]|\d+|\S")
DECL_TOKEN = re.compile(r"\s*([A-Za-z_]\w*|\(|::)")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:<([^>\n]*)>|"([^"\n]*)"|(.*))$', re.M)


@dataclass(frozen=True)
class Param:
    index: int
    name: str  # "" when the declaration names none
    c_type: str  # as written, template parameters and defines substituted
    type: str  # "ptr", or a key of SCALAR_BYTES
    pointee: str = ""  # a pointer's element type as written

    @property
    def nbytes(self) -> int:
        return SCALAR_BYTES[self.type]

    def label(self) -> str:
        return f"parameter {self.index} ({self.c_type} {self.name})".replace(" )", ")")


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def strip_comments(src: str, *, strings: bool = False) -> str:
    """`src` with comments (and with `strings`, the contents of string and character literals)
    replaced by spaces: same length, same lines, so offsets and line numbers still hold."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(_blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(_blank(src[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + _blank(src[i + 1 : j - 1]) + src[j - 1] if strings else src[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(src: str, offset: int) -> int:
    return src.count("\n", 0, offset) + 1


def includes(src: str) -> list[tuple[int, str, str]]:
    """(line, target, kind) of every `#include`: kind "angle" (<x>), "quote" ("x") or
    "computed" (a macro: what it reads is decided elsewhere)."""
    text = strip_comments(src)
    out = []
    for m in INCLUDE.finditer(text):
        angle, quote, other = m.groups()
        kind, target = (
            ("angle", angle) if angle is not None else ("quote", quote) if quote is not None
            else ("computed", (other or "").strip())
        )  # fmt: skip
        out.append((line_of(text, m.start()), target.strip(), kind))
    return out


# ----------------------------------------------------------------------------------------------
# kernel signatures


def _balanced(text: str, start: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError("unbalanced brackets")


def split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


@dataclass(frozen=True)
class KernelDecl:
    name: str  # unqualified
    line: int
    params: list[str]  # as written
    template: list[tuple[str, str]]  # (name, default) of each template parameter


def kernels(src: str) -> list[KernelDecl]:
    """Every `__global__` function declared in `src`."""
    text = strip_comments(src, strings=True)
    found = []
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        name, j = "", i
        while j < len(text):
            tm = DECL_TOKEN.match(text, j)
            if tm is None:
                break
            tok = tm.group(1)
            if tok == "(":
                if not name or name in ATTRIBUTES:  # __launch_bounds__(256) and the like
                    j = _balanced(text, tm.start(1), "(", ")")
                    name = ""
                    continue
                break
            name = tok if tok != "::" else ""
            j = tm.end()
        if not name or j >= len(text) or text[j:].lstrip()[:1] != "(":
            continue
        open_at = text.index("(", j)
        close_at = _balanced(text, open_at, "(", ")")
        params = split_top(text[open_at + 1 : close_at - 1])
        if params in (["void"], [""]):
            params = []
        start = max(text.rfind(";", 0, m.start()), text.rfind("}", 0, m.start()),
                    text.rfind("{", 0, m.start()))  # fmt: skip
        head = text[start + 1 : m.start()]
        template: list[tuple[str, str]] = []
        tm2 = re.search(r"\btemplate\s*<", head)
        if tm2:
            lt = head.index("<", tm2.start())
            inner = head[lt + 1 : _balanced(head, lt, "<", ">") - 1]
            for p in split_top(inner):
                decl, _, default = p.partition("=")
                words = re.findall(r"[A-Za-z_]\w*", decl)
                if words:
                    template.append((words[-1], default.strip()))
        found.append(KernelDecl(name, line_of(text, m.start()), params, template))
    return found


def _typedefs(src: str) -> dict[str, str]:
    """File-scope `typedef X Y;` and `using Y = X;` (simple ones: what a kernel file uses to
    name its element type)."""
    text = strip_comments(src, strings=True)
    out = {}
    for m in re.finditer(r"\btypedef\s+([A-Za-z_][\w\s]*?)\s+([A-Za-z_]\w*)\s*;", text):
        out[m.group(2)] = " ".join(m.group(1).split())
    for m in re.finditer(r"\busing\s+([A-Za-z_]\w*)\s*=\s*([A-Za-z_][\w\s:]*?)\s*;", text):
        out[m.group(1)] = " ".join(m.group(2).split())
    return out


def signature(
    src: str, expression: str, defines: Mapping[str, Any] | None = None, *, file: str = "kernel.cu"
) -> list[Param]:
    """The parameters of the kernel `expression` names (`rms_gate`, `ns::softmax<__half, 8>`),
    with template parameters, string defines and simple typedefs substituted."""
    base = expression.split("<", 1)[0].split("::")[-1].strip()
    decls = [k for k in kernels(src) if k.name == base]
    if not decls:
        raise ValueError(
            f"{file} declares no __global__ function {base}(): declare it as "
            f'`extern "C" __global__ void {base}(...)` (or a template, named with its arguments)'
        )
    if len({tuple(d.params) for d in decls}) > 1:
        raise ValueError(
            f"{file}:{decls[1].line}: {base}() is overloaded: give load(..., signature=...) "
            "the parameter types"
        )
    decl = decls[0]
    subs: dict[str, str] = {**_typedefs(src)}
    subs.update({k: str(v) for k, v in (defines or {}).items() if isinstance(v, str)})
    if "<" in expression:
        args = split_top(expression[expression.index("<") + 1 : expression.rindex(">")])
        for i, (pname, default) in enumerate(decl.template):
            value = args[i] if i < len(args) else default
            if value:
                subs[pname] = value
    return [_param(i, p, subs, f"{file}:{decl.line}") for i, p in enumerate(decl.params)]


def _resolve(words: list[str], subs: Mapping[str, str]) -> list[str]:
    for _ in range(8):
        joined = " ".join(words)
        if joined not in subs:
            break
        words = [w for w in re.findall(r"[A-Za-z_]\w*|\*", subs[joined]) if w not in QUALIFIERS]
    return words


def _param(index: int, text: str, subs: Mapping[str, str], where: str) -> Param:
    decl = text.split("=", 1)[0]
    tokens = [t for t in TOKEN.findall(decl) if t not in QUALIFIERS]
    if "&" in tokens:
        raise ValueError(f"{where}: parameter {index} ({decl.strip()}) is a reference: pass "
                         "pointers and scalars")  # fmt: skip
    pointer = "*" in tokens or "[" in tokens
    words = [t for t in tokens if re.match(r"[A-Za-z_]", t)]
    name = ""
    if len(words) >= 2 and words[-1] not in TYPE_WORDS:
        name = words.pop()
    if pointer:
        pointee = " ".join(_resolve([w for w in words if w != "*"], subs))
        return Param(index, name, f"{pointee}*", "ptr", pointee)
    resolved = _resolve(words, subs)
    if "*" in resolved:  # a typedef or define of a pointer type
        pointee = " ".join(w for w in resolved if w != "*")
        return Param(index, name, f"{pointee}*", "ptr", pointee)
    c_type = " ".join(resolved)
    if c_type not in SCALAR_TYPES:
        raise ValueError(
            f"{where}: parameter {index} ({decl.strip()}) has type {c_type!r}, which the "
            "launcher cannot pass: use pointers and int/unsigned/int64_t/float/double/__half/"
            "__nv_bfloat16 scalars (a struct or vector type by value is not supported), or give "
            "load(..., signature=...)"
        )
    return Param(index, name, c_type, SCALAR_TYPES[c_type])


def parse_signature_text(text: str) -> list[Param]:
    """An explicit signature: comma-separated `ptr` or scalar types (`ptr, ptr, i32, fp32`), or
    C types (`const __half*, int`)."""
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if part == "ptr" or part.endswith("*"):
            pointee = " ".join(w for w in part.rstrip("*").split() if w not in QUALIFIERS)
            out.append(Param(i, "", part, "ptr", "" if part == "ptr" else pointee))
        elif part in SCALAR_BYTES:
            out.append(Param(i, "", part, part))
        elif part in SCALAR_TYPES:
            out.append(Param(i, "", part, SCALAR_TYPES[part]))
        else:
            raise ValueError(f"signature: {part!r} is not ptr, a C type or one of "
                             f"{', '.join(sorted(SCALAR_BYTES))}")  # fmt: skip
    return out


__all__ = [
    "POINTEE_DTYPES",
    "SCALAR_BYTES",
    "SCALAR_TYPES",
    "KernelDecl",
    "Param",
    "includes",
    "kernels",
    "line_of",
    "parse_signature_text",
    "signature",
    "strip_comments",
]

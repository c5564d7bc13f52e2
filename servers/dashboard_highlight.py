"""A small syntax highlighter for the dashboard's kernel diffs (no CDN, no dependency): Python
through the standard library's tokenizer, C/C++/CUDA and JSON through a few patterns. The text
is the agent's code: every character is HTML-escaped, only our own `<span class="hl-...">`
tags are added.
"""

from __future__ import annotations

import html
import io
import keyword
import re
import token
import tokenize

C_KEYWORDS = (
    "auto break case char const constexpr continue default do double else enum extern float for "
    "goto if inline int long register restrict return short signed sizeof static struct switch "
    "typedef union unsigned void volatile while bool true false nullptr template typename class "
    "namespace using public private protected virtual __global__ __device__ __host__ __shared__ "
    "__restrict__ __forceinline__ __syncthreads half float4 int4 size_t"
).split()
C_PATTERN = re.compile(
    r"(?P<com>//[^\n]*|/\*.*?\*/)"
    r"|(?P<str>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')"
    r"|(?P<pre>^[ \t]*\#[ \t]*\w+)"
    r"|(?P<num>\b\d[\w.]*\b)"
    r"|(?P<kw>\b(?:" + "|".join(map(re.escape, C_KEYWORDS)) + r")\b)",
    re.S | re.M,
)
JSON_PATTERN = re.compile(
    r"(?P<str>\"(?:\\.|[^\"\\\n])*\")|(?P<num>-?\b\d[\d.eE+-]*\b)|(?P<kw>\b(?:true|false|null)\b)"
)
PY_BUILTINS = frozenset({"self", "cls", "None", "True", "False", "print", "range", "len"})
_STRINGS = (
    {token.STRING}
    | {t for t in (getattr(token, n, None) for n in ("FSTRING_START", "FSTRING_MIDDLE")) if t}
    | {t for t in (getattr(token, "FSTRING_END", None),) if t}
)


def _python_classes(text: str) -> list[str | None]:
    """A class name (or None) per character of `text`, from Python's tokenizer; what it cannot
    tokenize (an unfinished string) stays plain."""
    classes: list[str | None] = [None] * len(text)
    starts = [0]  # offset of each line as the tokenizer reads them (split at \n only)
    for line in io.StringIO(text):
        starts.append(starts[-1] + len(line))
    previous = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == token.COMMENT:
                cls = "com"
            elif tok.type in _STRINGS:
                cls = "str"
            elif tok.type == token.NUMBER:
                cls = "num"
            elif tok.type == token.NAME and keyword.iskeyword(tok.string):
                cls = "kw"
            elif tok.type == token.NAME and previous in ("def", "class"):
                cls = "def"
            elif tok.type == token.NAME and tok.string in PY_BUILTINS:
                cls = "bi"
            else:
                cls = None
            if tok.type == token.NAME or tok.type == token.OP:
                previous = tok.string
            if cls is None:
                continue
            (r1, c1), (r2, c2) = tok.start, tok.end
            if r1 - 1 >= len(starts) or r2 - 1 >= len(starts):
                continue
            a, b = starts[r1 - 1] + c1, min(len(text), starts[r2 - 1] + c2)
            classes[a:b] = [cls] * (b - a)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return classes


def _pattern_classes(text: str, pattern: re.Pattern[str]) -> list[str | None]:
    classes: list[str | None] = [None] * len(text)
    for m in pattern.finditer(text):
        cls = m.lastgroup
        classes[m.start() : m.end()] = [cls] * (m.end() - m.start())
    return classes


def language(path: str) -> str:
    if path.endswith(".py"):
        return "python"
    if path.endswith(".json"):
        return "json"
    if path.endswith((".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")):
        return "c"
    return "text"


def highlight_lines(path: str, text: str) -> list[str]:
    """`text` as HTML, one string per line (no newline), highlighted by `path`'s language."""
    lang = language(path)
    if lang == "python":
        classes = _python_classes(text)
    elif lang == "json":
        classes = _pattern_classes(text, JSON_PATTERN)
    elif lang == "c":
        classes = _pattern_classes(text, C_PATTERN)
    else:
        classes = [None] * len(text)
    out: list[str] = []
    pos = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        parts, i = [], 0
        while i < len(body):
            cls, j = classes[pos + i], i
            while j < len(body) and classes[pos + j] == cls:
                j += 1
            chunk = html.escape(body[i:j])
            parts.append(f'<span class="hl-{cls}">{chunk}</span>' if cls else chunk)
            i = j
        out.append("".join(parts))
        pos += len(line)
    return out


__all__ = ["highlight_lines", "language"]

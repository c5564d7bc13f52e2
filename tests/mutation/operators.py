"""The mutants of one module: small changes to its source, one at a time, found on its `ast`.

Each mutant replaces the text of one node (an expression or a statement) of the original source
and keeps every other character, so line numbers and the rest of the file stay as they are.
A mutant's id names the function, the code before and after and the line it is on, never a line
number: equivalent mutants recorded in config.toml by id stay recorded while code around them
moves.

Operators (what a rule's regression looks like):
- comparisons negated (`<` -> `>=`, `==` -> `!=`, `in` -> `not in`, `is` -> `is not`), and the
  ordering ones moved across their boundary (`<` <-> `<=`, `>` <-> `>=`);
- `and` <-> `or`, one operand of `and`/`or` dropped, `not x` -> `x`, `-x` -> `x`, a condition
  that is not a comparison negated (`if x:` -> `if not (x):`);
- numbers changed (0 -> 1, 1 -> 0 and 2, n -> n + 1, x.y -> 2 * x.y, 0.0 -> 1.0), True <-> False;
- arithmetic swapped (`+` <-> `-`, `*` <-> `/`, `//` -> `/`, `+=` <-> `-=`), one flag of an
  `a | b | c` set dropped, `x & ~y` -> `x`;
- `min` <-> `max`, `any` <-> `all`, a call's keyword argument dropped, `xs[0]` -> `xs[-1]`;
- a comprehension's filter dropped, one item of a literal tuple/list/set/dict dropped;
- statements dropped: `raise`, an early `return`, `continue`, `break`, a call statement
  (`check(x)`, `out.append(...)`), an assignment into a subscript or attribute; a returned
  value replaced by None.
Docstrings, strings, f-strings, annotations, imports, `__all__`, `if TYPE_CHECKING:` and the
arguments of a raised exception (its message) are left alone.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass

NEGATE: dict[type, type] = {
    ast.Lt: ast.GtE,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.GtE: ast.Lt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
BOUNDARY: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
ARITH: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
}
# Keywords that only carry text for a reader (a message, a description): never dropped.
KEEP_KEYWORDS = frozenset({"description", "next_step"})
SWAP_CALLS = {"min": "max", "max": "min", "any": "all", "all": "any"}


@dataclass(frozen=True)
class Mutant:
    id: str  # "<function>: `<before>` -> `<after>` in `<line>`" (+ " #n" when repeated)
    lineno: int
    end_lineno: int
    source: str  # the whole module with this one change


def _collapse(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _change(before: str, after: str, limit: int = 90, context: int = 24) -> tuple[str, str]:
    """`before` and `after` as an id shows them: whole when short, else the part that differs
    with a little context (so two changes of one long call never share an id)."""
    b, a = " ".join(before.split()), " ".join(after.split())
    if len(b) <= limit and len(a) <= limit:
        return b, a
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    lo = max(0, start - context)

    def cut(text: str) -> str:
        hi = len(text) - max(0, end - context)
        mid = text[lo:hi]
        if len(mid) > limit:
            mid = mid[: limit - 1] + "…"
        return ("…" if lo else "") + mid + ("…" if hi < len(text) else "")

    return cut(b), cut(a)


class _Source:
    """The module's text, addressed by the ast's (line, byte column) positions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.blines = [line.encode() for line in self.lines]

    def line(self, lineno: int) -> str:
        return self.lines[lineno - 1].strip()

    def replace(self, node: ast.AST, new: str) -> str:
        first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
        head = self.blines[first][: node.col_offset].decode()
        tail = self.blines[last][node.end_col_offset :].decode()  # type: ignore[attr-defined]
        return "".join([*self.lines[:first], head, new, tail, *self.lines[last + 1 :]])


def _with(node: ast.AST, **changes: object) -> ast.AST:
    new = copy.deepcopy(node)
    for k, v in changes.items():
        setattr(new, k, v)
    return new


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _skipped_stmt(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
        return True
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return True
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    )


class _Finder:
    """Walks the tree, keeping the qualified name of the enclosing function, and yields
    (qualname, node, replacement text) for every mutation of every node."""

    def __init__(self) -> None:
        self.found: list[tuple[str, ast.AST, str, str]] = []  # qualname, node, before, after
        self.inner_or: set[int] = set()  # `|` nodes inside a chain already mutated as a whole

    def add(self, where: str, node: ast.AST, new: ast.AST | str) -> None:
        after = new if isinstance(new, str) else ast.unparse(new)
        self.found.append((where, node, ast.unparse(node), after))

    # -- statements --------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt], where: str, *, function: bool = False) -> None:
        for i, stmt in enumerate(stmts):
            last_of_function = function and i == len(stmts) - 1
            self.stmt(stmt, where, last_of_function=last_of_function)

    def stmt(self, node: ast.stmt, where: str, *, last_of_function: bool = False) -> None:
        if _skipped_stmt(node):
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = node.name if where == "<module>" else f"{where}.{node.name}"
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    self.expr(default, name)
            self.body(node.body, name, function=True)
            return
        if isinstance(node, ast.ClassDef):
            name = node.name if where == "<module>" else f"{where}.{node.name}"
            self.body(node.body, name)
            return
        if isinstance(node, ast.Raise):
            self.add(where, node, "pass")
            return  # its arguments are the message
        if isinstance(node, ast.Return):
            if not last_of_function:
                self.add(where, node, "pass")
            if node.value is not None and not _is_const(node.value, None):
                self.add(where, node, "return None")
            if node.value is not None:
                self.expr(node.value, where)
            return
        if isinstance(node, ast.Continue | ast.Break):
            self.add(where, node, "pass")
            return
        if isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Call | ast.Await):
                self.add(where, node, "pass")
            self.expr(node.value, where)
            return
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Subscript | ast.Attribute) for t in targets):
                self.add(where, node, "pass")
            if isinstance(node, ast.AugAssign) and type(node.op) in ARITH:
                self.add(where, node, ast.unparse(_with(node, op=ARITH[type(node.op)]())))
            for t in targets:
                if isinstance(t, ast.Subscript):
                    self.expr(t.slice, where)
            if node.value is not None:
                single = len(targets) == 1 and isinstance(targets[0], ast.Name | ast.Attribute)
                self.expr(node.value, where, literal_ok=single)
            return
        if isinstance(node, ast.If | ast.While):
            self.condition(node.test, where)
            self.expr(node.test, where)
            self.body(node.body, where)
            self.body(node.orelse, where)
            return
        if isinstance(node, ast.For | ast.AsyncFor):
            self.expr(node.iter, where, literal_ok=True)
            self.body(node.body, where)
            self.body(node.orelse, where)
            return
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.expr(item.context_expr, where)
            self.body(node.body, where)
            return
        if isinstance(node, ast.Try):
            self.body(node.body, where)
            for handler in node.handlers:
                self.body(handler.body, where)
            self.body(node.orelse, where)
            self.body(node.finalbody, where)
            return
        if isinstance(node, ast.Assert):
            self.add(where, node, "pass")
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, where)

    def condition(self, test: ast.expr, where: str) -> None:
        if not isinstance(test, ast.Compare | ast.UnaryOp | ast.Constant):
            self.add(where, test, ast.UnaryOp(op=ast.Not(), operand=copy.deepcopy(test)))

    # -- expressions -------------------------------------------------------------------------
    def expr(self, node: ast.expr, where: str, *, literal_ok: bool = False) -> None:
        if isinstance(node, ast.JoinedStr):
            return
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for table in (NEGATE, BOUNDARY):
                    if type(op) in table:
                        ops = list(node.ops)
                        ops[i] = table[type(op)]()
                        self.add(where, node, _with(node, ops=ops))
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self.add(where, node, _with(node, op=other))
            for i in range(len(node.values)):
                rest = node.values[:i] + node.values[i + 1 :]
                kept = rest[0] if len(rest) == 1 else _with(node, values=rest)
                self.add(where, node, copy.deepcopy(kept))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
            if isinstance(node.op, ast.Not) or not isinstance(node.operand, ast.Constant):
                self.add(where, node, copy.deepcopy(node.operand))
        elif isinstance(node, ast.IfExp):
            self.condition(node.test, where)
        elif isinstance(node, ast.Constant):
            for value in _numbers(node.value):
                self.add(where, node, ast.Constant(value))
        elif isinstance(node, ast.BinOp):
            self.binop(node, where)
        elif isinstance(node, ast.Call):
            self.call(node, where)
        elif isinstance(node, ast.Subscript):
            if _is_const(node.slice, 0):
                neg = ast.UnaryOp(op=ast.USub(), operand=ast.Constant(1))
                self.add(where, node, _with(node, slice=neg))
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for gi, gen in enumerate(node.generators):
                for k in range(len(gen.ifs)):
                    new = copy.deepcopy(node)
                    del new.generators[gi].ifs[k]
                    self.add(where, node, new)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and literal_ok:
            if len(node.elts) >= 2 and all(_plain_item(e) for e in node.elts):
                for i in range(len(node.elts)):
                    self.add(where, node, _with(node, elts=node.elts[:i] + node.elts[i + 1 :]))
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            for i, key in enumerate(node.keys):
                if isinstance(key, ast.Constant):
                    keys, values = node.keys[:i] + node.keys[i + 1 :], node.values
                    self.add(
                        where, node, _with(node, keys=keys, values=values[:i] + values[i + 1 :])
                    )
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, where, literal_ok=_literal_child(node, child))
            elif isinstance(child, ast.comprehension):
                self.expr(child.iter, where, literal_ok=True)
                for cond in child.ifs:
                    self.expr(cond, where)
            elif isinstance(child, ast.keyword):
                self.expr(child.value, where, literal_ok=True)

    def binop(self, node: ast.BinOp, where: str) -> None:
        if _stringy(node.left) or _stringy(node.right):
            return
        if type(node.op) in ARITH:
            self.add(where, node, _with(node, op=ARITH[type(node.op)]()))
        elif isinstance(node.op, ast.BitOr) and id(node) not in self.inner_or:
            flags = _or_chain(node)
            self.inner_or.update(id(n) for n in ast.walk(node) if isinstance(n, ast.BinOp))
            for i in range(len(flags)):
                rest = [copy.deepcopy(f) for f in flags[:i] + flags[i + 1 :]]
                self.add(where, node, _join_or(rest))
        elif isinstance(node.op, ast.BitAnd):
            self.add(where, node, copy.deepcopy(node.left))

    def call(self, node: ast.Call, where: str) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in SWAP_CALLS:
            name = ast.Name(id=SWAP_CALLS[node.func.id], ctx=ast.Load())
            self.add(where, node, _with(node, func=name))
        for i, kw in enumerate(node.keywords):
            if kw.arg is not None and kw.arg not in KEEP_KEYWORDS:
                self.add(
                    where, node, _with(node, keywords=node.keywords[:i] + node.keywords[i + 1 :])
                )


def _or_chain(node: ast.expr) -> list[ast.expr]:
    """The operands of `a | b | c` (a left-nested chain of BinOp)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_or_chain(node.left), node.right]
    return [node]


def _join_or(items: list[ast.expr]) -> ast.expr:
    out = items[0]
    for item in items[1:]:
        out = ast.BinOp(left=out, op=ast.BitOr(), right=item)
    return out


def _literal_child(parent: ast.expr, child: ast.expr) -> bool:
    """Whether a literal tuple/list/set directly under `parent` is a set of items (`x in (...)`,
    `isinstance(x, (...))`, `frozenset({...})`) rather than a value's structure."""
    if isinstance(parent, ast.Compare):
        return child in parent.comparators
    return isinstance(parent, ast.Call)


def _plain_item(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant | ast.Name | ast.Attribute)


def _stringy(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def _is_const(node: ast.expr, value: object) -> bool:
    return (
        isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value
    )


def _numbers(value: object) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return {0: [1], 1: [0, 2]}.get(value, [value + 1])
    if isinstance(value, float):
        return [1.0] if value == 0.0 else [value * 2]
    return []


def _annotations(tree: ast.AST) -> set[int]:
    """ids of the nodes inside annotations (never mutated)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        roots: list[ast.AST | None] = []
        if isinstance(node, ast.arg):
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            roots.append(node.returns)
            roots.extend(node.decorator_list)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.ClassDef):
            roots.extend([*node.bases, *node.decorator_list])
        for root in roots:
            if root is not None:
                out.update(id(n) for n in ast.walk(root))
    return out


def mutants(text: str, functions: list[str] | None = None) -> Iterator[Mutant]:
    """Every mutant of the module `text`, in source order. `functions`: only those inside
    these functions (qualified names: `Ledger.best`; a name covers what is nested in it)."""
    src = _Source(text)
    finder = _Finder()
    tree = ast.parse(text)
    finder.body(tree.body, "<module>")
    skip = _annotations(tree)
    seen: dict[str, int] = {}
    sources: set[str] = set()
    found = sorted(
        finder.found,
        key=lambda f: (f[1].lineno, f[1].col_offset, f[1].end_lineno, f[1].end_col_offset),  # type: ignore[attr-defined]
    )
    for where, node, before, after in found:
        if id(node) in skip:
            continue
        if functions is not None and not any(
            where == f or where.startswith(f + ".") for f in functions
        ):
            continue
        text = f"({after})" if isinstance(node, ast.expr) else after
        new = src.replace(node, text)
        if new in sources:  # two operators, one change
            continue
        sources.add(new)
        line = src.line(node.lineno)  # type: ignore[attr-defined]
        shown_before, shown_after = _change(before, after)
        ident = f"{where}: `{shown_before}` -> `{shown_after}`"
        if shown_before != _collapse(line):
            ident += f" in `{_collapse(line)}`"
        seen[ident] = seen.get(ident, 0) + 1
        if seen[ident] > 1:
            ident += f" #{seen[ident]}"
        yield Mutant(ident, node.lineno, node.end_lineno, new)  # type: ignore[attr-defined]


__all__ = ["Mutant", "mutants"]

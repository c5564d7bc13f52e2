"""Which top-level functions of a candidate's file can run when the verifier imports it and calls
its entry function: a static call graph, conservative (any use of a name counts as a call).

The static scan (tools/scan.py) uses it for one thing: a torch reference helper that nothing
reachable uses (HarnessGym kernels keep `torch_reference` beside the kernel for their own
benchmark) is a warning, not a hard reject. What decides is then the sandboxed runtime guard,
which rejects torch compute that does run during verification.
"""

from __future__ import annotations

import ast

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _names(node: ast.AST) -> set[str]:
    """Every name a subtree uses: bare names and attribute names (`mod.f`, `self.f`)."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.add(sub.value)  # getattr(module, "f") and __all__ entries
    return out


def unreachable_functions(tree: ast.Module, entry: str) -> dict[str, tuple[int, int]]:
    """Top-level functions of `tree` that neither module-level code (imports run it all) nor
    `entry` reaches: name -> (first and last line of its body). Empty when `entry` is not
    defined here: then anything may be called from elsewhere."""
    defs: dict[str, FunctionNode] = {
        n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if entry not in defs:
        return {}
    used: set[str] = {entry}
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            # Decorators, defaults and annotations run at import.
            for part in [*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults]:
                if part is not None:
                    used |= _names(part)
        else:
            used |= _names(stmt)
    reached: set[str] = set()
    todo = [n for n in defs if n in used]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [n for n in _names(defs[name]) if n in defs and n not in reached]
    # The body's lines only: the def line (and any line before the body) holds defaults and
    # annotations, which run at import whether or not the function is ever called.
    return {
        name: (node.body[0].lineno, node.end_lineno or node.lineno)
        for name, node in defs.items()
        if name not in reached
    }


__all__ = ["unreachable_functions"]

"""The layers hold: tools/ never imports mcp or servers/, its modules import each other without
cycles (no lazy import to dodge one), and the staged GPU side is checked apart
(tests/tools/gpu/test_staged.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import harnesslab.tools as tools

TOOLS = Path(tools.__path__[0])
# Imports inside functions that are there for cost, not to dodge a cycle.
LAZY_FOR_COST = {
    "execution.backends": {"execution.ssh", "execution.ssh_pool"},  # asyncssh: only for SSH
    "evaluation.overview": {"gpu.sandbox"},  # its probe forks once, on first inspect_context
}


def module_name(path: Path) -> str:
    rel = path.relative_to(TOOLS).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in TOOLS.rglob("*.py")
        if "cheats" not in p.parts and p.parent.name != "gpu"
    }


def resolve(current: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The tools modules an ImportFrom names (relative or harnesslab.tools.*)."""
    if node.level:
        base = current.split(".") if is_package else current.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        prefix = ".".join([*base, node.module] if node.module else base)
    elif node.module and node.module.startswith("harnesslab.tools"):
        prefix = node.module.removeprefix("harnesslab.tools").lstrip(".")
    else:
        return []
    modules = library_modules()
    out = []
    for alias in node.names:
        sub = f"{prefix}.{alias.name}".lstrip(".")
        out.append(sub if sub in modules else prefix)
    return [m for m in out if m in modules]


def imports(path: Path, current: str) -> tuple[set[str], set[str]]:
    """(top-level imports, imports inside functions) of tools modules, TYPE_CHECKING left out."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    lazy: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            (lazy if in_function else top).update(resolve(current, is_package, node))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return top - {current}, lazy - {current}


def test_tools_never_imports_mcp_or_the_servers():
    for name, path in library_modules().items():
        text = path.read_text()
        if name == "meta.gentemplates":  # the generated server's source, as text
            continue
        for banned in (
            "import mcp",
            "from mcp",
            "harnesslab.servers import",
            "from harnesslab.servers",
        ):
            assert banned not in text, f"{name} uses {banned!r}"


def test_no_import_cycles_and_no_lazy_import_that_dodges_one():
    graph: dict[str, set[str]] = {}
    for name, path in library_modules().items():
        top, lazy = imports(path, name)
        graph[name] = top
        dodges = lazy - LAZY_FOR_COST.get(name, set())
        assert not dodges, f"{name} imports {sorted(dodges)} inside a function"
    # A package's __init__ re-exports its modules: edges into a package count as edges into
    # the modules it imports, which the walk below follows.
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if seen.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*path, nxt])}")
            if nxt not in seen:
                walk(nxt, [*path, nxt])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            walk(name, [name])

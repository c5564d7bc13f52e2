"""The layers hold: tools/ never imports mcp or servers/; its packages import only packages ranked
below them (RANKS, docs/architecture.md "Subpackages of tools/"); its modules import each other
without cycles (no lazy import to dodge one); the type-only imports that close a loop are the
listed ones and no more; and the imports that bypass a package's `__all__` do not grow. The
staged GPU side is checked apart (tests/tools/gpu/test_staged.py)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import harnesslab.servers as servers
import harnesslab.tools as tools

TOOLS = Path(tools.__path__[0])
SERVERS = Path(servers.__path__[0])

# A package (or top-level module) of tools/ imports only what ranks strictly below it: peers of
# one rank are independent of each other. Every import counts, type-only and lazy ones too.
RANKS = {
    "errors": 0,  # the leaves every package may use
    "settings": 0,
    "catalog": 0,
    "_lazy": 0,
    "progress": 0,
    "gpu": 1,  # staged to the GPU host, imports nothing of harnesslab (test_staged)
    "task": 2,
    "state": 3,
    "execution": 4,
    "evaluation": 5,
    "integrity": 6,
    "meta": 6,
    "lab": 6,
    "authoring": 6,  # task new and the importers: they bind, read through state, run baselines
    "loop": 7,
    "dashboard": 8,
    "doctor": 8,
}
# Imports inside functions that are there for cost, not to dodge a cycle.
LAZY_FOR_COST = {
    "execution.backends": {"execution.ssh", "execution.ssh_pool"},  # asyncssh: only for SSH
    "evaluation.overview": {
        "gpu.isolation.sandbox"
    },  # its probe forks once, on first inspect_context
}
# Imports under `if TYPE_CHECKING:` that close an import loop (the imported module reaches the
# importer back). They hide a cycle from the runtime, not from the reader: this list only
# shrinks. Break one by moving the shared type below both modules.
TYPE_ONLY_LOOPS: set[tuple[str, str]] = set()
# Imports (tools/ outside gpu/, and servers/) of a package of tools/ from outside it that name
# one of its modules or a name outside its `__all__`. Only ever lower this number: import
# from the package itself, adding a name to its `__all__` where it is part of the surface.
# gpu/ is left out: its modules are the host's surface (framing, scores, ncu, the sandbox).
SURFACE_BYPASSES = 126


def module_name(path: Path) -> str:
    rel = path.relative_to(TOOLS).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in TOOLS.rglob("*.py")
        if "cheats" not in p.parts and p.relative_to(TOOLS).parts[0] != "gpu"
    }


MODULES = library_modules()
GPU_MODULES = {module_name(p) for p in (TOOLS / "gpu").rglob("*.py")}


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def package_of(module: str) -> str:
    return module.split(".")[0]


def target(node: ast.ImportFrom, current: str, is_package: bool) -> str | None:
    """The tools module path an ImportFrom reads from (relative or harnesslab.tools.*), or None."""
    if node.level:
        base = current.split(".") if is_package else current.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join([*base, node.module] if node.module else base)
    if node.module and (node.module + ".").startswith("harnesslab.tools."):
        return node.module.removeprefix("harnesslab.tools").lstrip(".")
    return None


def resolve(current: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The tools modules an ImportFrom names (a module when it names one, else the package)."""
    prefix = target(node, current, is_package)
    if prefix is None:
        return []
    known = MODULES.keys() | GPU_MODULES | {"gpu"}
    out = []
    for alias in node.names:
        sub = f"{prefix}.{alias.name}".lstrip(".")
        out.append(sub if sub in known else prefix)
    return [m for m in out if m in known]


def imports(path: Path, current: str) -> dict[str, set[str]]:
    """The tools modules `path` imports: {"top": ..., "lazy": (inside functions), "type": (under
    `if TYPE_CHECKING:`)}."""
    out: dict[str, set[str]] = {"top": set(), "lazy": set(), "type": set()}
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, "type")
            for child in node.orelse:
                visit(child, kind)
            return
        if isinstance(node, ast.ImportFrom):
            out[kind].update(resolve(current, is_package, node))
        if kind == "top" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind = "lazy"
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(parse(path), "top")
    return {k: v - {current} for k, v in out.items()}


IMPORTS = {name: imports(path, name) for name, path in MODULES.items()}


def own(a: str, b: str) -> bool:
    """A package and its own modules (its __init__ re-exports them)."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def test_tools_never_imports_mcp_or_the_servers():
    for name, path in MODULES.items():
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


def test_every_package_imports_only_packages_ranked_below_it():
    packages = {package_of(m) for m in MODULES if m} | {"gpu"}
    assert packages == set(RANKS), f"rank every package of tools/: {packages ^ set(RANKS)}"
    for name, found in IMPORTS.items():
        if not name:
            continue  # harnesslab.tools itself: the README's surface, imported on first use
        for kind, modules in found.items():
            for module in modules:
                src, dst = package_of(name), package_of(module)
                assert src == dst or RANKS[dst] < RANKS[src], (
                    f"{name} imports {module} ({kind}): {src} (rank {RANKS[src]}) may import "
                    f"only what ranks below it; {dst} ranks {RANKS[dst]}"
                )


@pytest.mark.parametrize(
    ("importer", "kind", "module", "message"),
    [
        ("task.kinds", "type", "state.workspace", "task (rank 2) may import"),  # upward
        ("meta.registry", "lazy", "integrity.scan", "meta (rank 6) may import"),  # a peer
    ],
)
def test_an_upward_or_sideways_import_is_seen(monkeypatch, importer, kind, module, message):
    fake = {**IMPORTS, importer: {**IMPORTS[importer], kind: {module}}}
    monkeypatch.setitem(globals(), "IMPORTS", fake)
    with pytest.raises(
        AssertionError, match=re.escape(f"{importer} imports {module} ({kind}): {message}")
    ):
        test_every_package_imports_only_packages_ranked_below_it()


def test_no_import_cycles_and_no_lazy_import_that_dodges_one():
    graph = {name: found["top"] for name, found in IMPORTS.items()}
    for name, found in IMPORTS.items():
        dodges = found["lazy"] - LAZY_FOR_COST.get(name, set())
        assert not dodges, f"{name} imports {sorted(dodges)} inside a function"
    # A package's __init__ re-exports its modules: edges into a package count as edges into
    # the modules it imports, which the walk below follows.
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if own(node, nxt):
                continue
            if seen.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*path, nxt])}")
            if nxt not in seen:
                walk(nxt, [*path, nxt])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            walk(name, [name])


def type_only_loops(found: dict[str, dict[str, set[str]]]) -> set[tuple[str, str]]:
    """The type-only imports (a, b) where b reaches a back through any imports."""
    graph = {name: set().union(*kinds.values()) for name, kinds in found.items()}

    def reaches(start: str, goal: str) -> bool:
        todo, seen = [start], {start}
        while todo:
            node = todo.pop()
            for nxt in graph.get(node, ()):
                if own(node, nxt) or nxt in seen:
                    continue
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    return {
        (name, module)
        for name, kinds in found.items()
        for module in kinds["type"] - kinds["top"]
        if name and not own(name, module) and reaches(module, name)
    }


def test_type_only_import_loops_are_the_listed_ones():
    loops = type_only_loops(IMPORTS)
    new = loops - TYPE_ONLY_LOOPS
    assert not new, (
        f"new import loops through `if TYPE_CHECKING:` imports: {sorted(new)}; move the type "
        "below both modules instead"
    )
    gone = TYPE_ONLY_LOOPS - loops
    assert not gone, f"these loops are gone: take {sorted(gone)} off TYPE_ONLY_LOOPS"


def test_a_new_type_only_loop_is_seen():
    """evaluation.results imports nothing of evaluation.objective; a type-only import of it
    closes a loop (objective imports results), and one of the leaf errors does not."""
    fake = {**IMPORTS, "evaluation.results": {**IMPORTS["evaluation.results"]}}
    fake["evaluation.results"]["type"] = {"evaluation.objective", "errors"}
    assert type_only_loops(fake) - type_only_loops(IMPORTS) == {
        ("evaluation.results", "evaluation.objective")
    }


def surfaces() -> dict[str, set[str]]:
    """Each package's `__all__`, read from its __init__ (gpu/ left out)."""
    out = {}
    for init in TOOLS.glob("*/__init__.py"):
        if init.parent.name == "gpu":
            continue
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
                out[init.parent.name] = set(ast.literal_eval(node.value))
    return out


def bypasses_in(path: Path, current: str, alls: dict[str, set[str]]) -> list[str]:
    """The imports in `path` (module `current` of tools/, or "" for servers/) of a package of
    tools/ other than its own that name one of its modules or a name outside its `__all__`."""
    out = []
    for node in ast.walk(parse(path)):
        if not isinstance(node, ast.ImportFrom):
            continue
        prefix = target(node, current, path.name == "__init__.py")
        package, _, inner = (prefix or "").partition(".")
        if package not in alls or package == package_of(current):
            continue
        names = [a.name for a in node.names]
        if inner or not set(names) <= alls[package]:
            out.append(f"{path.name}: from {prefix} import {', '.join(names)}")
    return out


def surface_bypasses() -> list[str]:
    alls = surfaces()
    files = [(p, module_name(p)) for p in MODULES.values()]
    files += [(p, "") for p in SERVERS.rglob("*.py")]
    return [b for path, current in files for b in bypasses_in(path, current, alls)]


def test_imports_that_bypass_a_packages_all_do_not_grow():
    found = surface_bypasses()
    assert len(found) <= SURFACE_BYPASSES, (
        f"{len(found)} imports bypass a package's __all__ (at most {SURFACE_BYPASSES}): import "
        "the name from the package, or add it to the package's __all__ if it is part of it"
    )
    assert len(found) == SURFACE_BYPASSES, (
        f"down to {len(found)}: lower SURFACE_BYPASSES in tests/tools/test_layers.py to that"
    )


def test_a_module_path_or_a_name_outside_all_is_a_bypass(tmp_path: Path):
    source = tmp_path / "fake.py"
    source.write_text(
        "from ..state.workspace import Workspace\n"  # a module path
        "from ..state import Workspace, init_workspace\n"  # the surface
        "from ..state import Workspace, task_files\n"  # a name outside __all__
        "from harnesslab.tools.state.storage import atomic_write_json\n"
        "from harnesslab.tools.task import kind_of\n"
        "from .driver import Loop\n"  # its own package
        "from ..errors import UsageError\n"  # a leaf module, not a package
    )
    assert bypasses_in(source, "loop.fake", {"state": {"Workspace", "init_workspace"},
                                             "task": {"kind_of"}, "loop": set()}) == [
        "fake.py: from state.workspace import Workspace",
        "fake.py: from state import Workspace, task_files",
        "fake.py: from state.storage import atomic_write_json",
    ]  # fmt: skip

"""The files staged to the GPU host (and the custom tools' worker, which runs sandboxed where no
harnesslab is readable) import only the standard library, torch, triton and each other: never
harnesslab, and a relative import only in the sibling import rule (tools/gpu/runner.py's
docstring): `from . import x` under `if TYPE_CHECKING or __package__:`, whose `else:` imports
the same siblings by plain name (the staged folder has no package), or under a type-only
`if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from harnesslab.tools import gpu, meta

GPU = Path(gpu.__path__[0])
FILES = sorted({*gpu.STAGED, *gpu.LAB, *gpu.TASK})  # paths under tools/gpu/
STANDALONE = [GPU / name for name in FILES] + [Path(meta.__path__[0]) / "custom_worker.py"]
ALLOWED = set(sys.stdlib_module_names) | {"torch", "triton", "numpy"}
SIBLINGS = {Path(name).stem for name in FILES}
# The folders of tools/gpu/ (packages for the host and mypy; the staged folder is flat).
GROUPS = {p.parent.name for p in GPU.glob("*/__init__.py")}


RULE = "TYPE_CHECKING or __package__"


def rule_blocks(tree: ast.AST, *tests: str) -> list[ast.If]:
    tests = tests or (RULE,)
    return [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) in tests]


def sibling_names(body: list[ast.stmt], *, level: int) -> set[str]:
    """The modules a branch of the rule imports: relative ones (level 1: `from . import x`,
    `from .x import y`, `from .. import x`, `from ..folder import x`, `from ..x import y`: the
    source tree's folders), or `import x`, `from x import y` (level 0: the flat staged folder)."""
    names = set()
    for node in body:
        if isinstance(node, ast.ImportFrom) and min(node.level, 1) == level:
            module = (node.module or "").split(".")[-1]
            if module and module not in GROUPS:
                names.add(module)
            else:
                names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import) and level == 0:
            names |= {alias.name for alias in node.names}
    return names


def imported_roots(path: Path) -> list[tuple[int, str]]:
    found = []
    tree = ast.parse(path.read_text())
    allowed = {  # the rule's package branch, or a type-only import: a sibling, relative
        id(node) for block in rule_blocks(tree, RULE, "TYPE_CHECKING") for node in block.body
        if isinstance(node, ast.ImportFrom) and node.level >= 1
        and sibling_names([node], level=1) <= SIBLINGS
    }  # fmt: skip
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "").split(".")[0]))
    return found


def test_every_staged_file_is_in_the_gpu_package():
    assert all((GPU / name).is_file() for name in FILES)
    modules = {p.relative_to(GPU).as_posix() for p in GPU.rglob("*.py") if p.name != "__init__.py"}
    assert modules == set(FILES)


def test_every_staged_file_has_its_own_basename_since_the_staged_folder_is_flat():
    """The source tree has folders; the GPU host gets one folder, each file by its basename."""
    names = [gpu.staged_name(f) for f in FILES]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    assert all(gpu.staged_name(f) == Path(f).name for f in FILES)
    assert GROUPS.isdisjoint(SIBLINGS)  # `from ..x import y`: a folder, or a sibling module


@pytest.mark.parametrize("path", STANDALONE, ids=lambda p: p.name)
def test_a_staged_file_imports_nothing_from_harnesslab(path: Path):
    bad = [
        f"{path.name}:{line} imports {root}"
        for line, root in imported_roots(path)
        if root not in ALLOWED and root not in SIBLINGS
    ]
    assert not bad, bad


@pytest.mark.parametrize("path", STANDALONE, ids=lambda p: p.name)
def test_both_branches_of_the_sibling_import_rule_import_the_same_siblings(path: Path):
    for block in rule_blocks(ast.parse(path.read_text())):
        package = sibling_names(block.body, level=1)
        assert package and package == sibling_names(block.orelse, level=0), path.name


def module_level_siblings(path: Path) -> set[str]:
    """The siblings a file imports when it is loaded (module-level statements and the `if`/`try`
    blocks among them; imports inside functions run only on the paths that need them)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If | ast.Try):
            todo += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
        else:
            names |= sibling_names([node], level=0) | sibling_names([node], level=1)
    return {n.split(".")[0] for n in names} & SIBLINGS


@pytest.mark.parametrize("name", ["STAGED", "LAB"])
def test_each_staged_list_holds_every_sibling_its_files_import_when_loaded(name: str):
    """The lab's tree broke when runner.py began to import step_trace and only STAGED had it."""
    files = set(getattr(gpu, name))
    staged = {gpu.staged_name(f) for f in files}
    missing = sorted(
        f"{f} imports {s}" for f in files for s in module_level_siblings(GPU / f)
        if f"{s}.py" not in staged
    )  # fmt: skip
    assert not missing, f"add to gpu.{name}: {missing}"

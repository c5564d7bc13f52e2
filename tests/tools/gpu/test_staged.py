"""The files staged to the GPU host (and the custom tools' worker, which runs sandboxed where no
harnesslab is readable) import only the standard library, torch, triton and each other: never
harnesslab, never a relative import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from harnesslab.tools import gpu, meta

GPU = Path(gpu.__path__[0])
FILES = sorted({*gpu.STAGED, *gpu.LAB, *gpu.TASK})
STANDALONE = [GPU / name for name in FILES] + [Path(meta.__path__[0]) / "custom_worker.py"]
ALLOWED = set(sys.stdlib_module_names) | {"torch", "triton", "numpy"}
SIBLINGS = {Path(name).stem for name in FILES}


def imported_roots(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "").split(".")[0]))
    return found


def test_every_staged_file_is_in_the_gpu_package():
    assert all((GPU / name).is_file() for name in FILES)
    assert {p.name for p in GPU.glob("*.py")} - set(FILES) == {"__init__.py"}


@pytest.mark.parametrize("path", STANDALONE, ids=lambda p: p.name)
def test_a_staged_file_imports_nothing_from_harnesslab(path: Path):
    bad = [
        f"{path.name}:{line} imports {root}"
        for line, root in imported_roots(path)
        if root not in ALLOWED and root not in SIBLINGS
    ]
    assert not bad, bad

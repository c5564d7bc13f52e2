"""The mutation config covers the trusted side: every module under the trusted folders has an
entry in tests/mutation/config.toml, or a line under [[outside]] that says why not (a package
__init__.py without a function or class only re-exports)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRUSTED = ("tools/gpu", "tools/integrity", "tools/state", "tools/task", "tools/authoring")
CORPUS = "tools/integrity/cheats"


def only_reexports(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return path.name == "__init__.py" and not any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body
    )


def test_every_trusted_module_has_an_entry_or_a_reason() -> None:
    config = tomllib.loads((ROOT / "tests/mutation/config.toml").read_text())
    entries = {m["path"] for m in config["module"]}
    outside = {o["path"]: o["why"] for o in config.get("outside", [])}
    modules = sorted(
        str(p.relative_to(ROOT))
        for folder in TRUSTED
        for p in (ROOT / folder).rglob("*.py")
        if not str(p.relative_to(ROOT)).startswith(CORPUS) and "__pycache__" not in p.parts
    )
    assert len(modules) > 60  # the folders were found
    missing = [m for m in modules if m not in entries and m not in outside
               and not only_reexports(ROOT / m)]  # fmt: skip
    assert missing == [], "no mutation entry and no [[outside]] reason"
    assert all(len(why) > 40 for why in outside.values())
    assert not set(outside) & entries  # a module is in or out, never both
    assert all((ROOT / p).is_file() for p in [*outside, *entries])  # no stale paths


def test_every_entry_and_equivalent_has_its_own_keys() -> None:
    """A lost [[module]] header (a merge) would fold an entry's keys into the previous entry's
    last equivalent, where nothing reads them."""
    config = tomllib.loads((ROOT / "tests/mutation/config.toml").read_text())
    for m in config["module"]:
        assert {"name", "path", "tests"} <= set(m), m.get("name")
        for e in m.get("equivalent", []):
            assert set(e) == {"mutant", "why"}, (m["name"], e.get("mutant"))

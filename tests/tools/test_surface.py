"""The library's declared surface: `harnesslab.tools` exports the README's "from Python" names,
every subpackage's `__all__` resolves, and a module path of the flat layout still imports (as
the same module, with a DeprecationWarning)."""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import pytest

import harnesslab.tools as tools

PACKAGES = ("task", "authoring", "state", "execution", "gpu", "evaluation", "integrity", "meta",
            "loop", "lab", "dashboard")  # fmt: skip


def test_the_readme_from_python_names_are_exported():
    for name in ("Settings", "build_launcher", "open_workspace", "run_objective", "sweep",
                 "numerical_probe", "guarded_verify", "rank_history", "restore_candidate"):  # fmt: skip
        assert name in tools.__all__ and callable(getattr(tools, name))


@pytest.mark.parametrize("package", ["", *PACKAGES])
def test_every_name_in_a_packages_all_resolves(package):
    module = importlib.import_module("harnesslab.tools" + (f".{package}" if package else ""))
    assert module.__all__ and all(hasattr(module, name) for name in module.__all__)


def test_a_module_path_of_the_flat_layout_imports_the_moved_module_with_a_warning():
    with pytest.warns(DeprecationWarning, match="harnesslab.tools.state.ledger"):
        old = importlib.import_module("harnesslab.tools.ledger")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert old is importlib.import_module("harnesslab.tools.state.ledger")


def test_every_module_path_of_the_flat_layout_names_a_module_that_exists():
    """A module moved again (gpu/'s folders) must take its old flat name along."""
    missing = [f"{old} -> {new}" for old, new in tools.MOVED.items()
               if importlib.util.find_spec(f"harnesslab.tools.{new}") is None]  # fmt: skip
    assert not missing, missing

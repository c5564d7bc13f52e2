"""A package surface whose names are imported on first use (PEP 562), for packages that are
imported by processes needing only a small part of them (a generated server imports
meta.custom_host, not qualification)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_surface(
    package: str, names: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: `names` maps a public name to the submodule
    (relative to `package`) that defines it."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__


__all__ = ["lazy_surface"]

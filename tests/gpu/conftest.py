"""Every test in tests/gpu/ needs a CUDA GPU: marked `gpu` here (deselect with -m "not gpu") and
skipped on a machine without one, so the tests themselves carry no marker."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _cuda() -> bool:
    try:
        import torch  # noqa: PLC0415 - only when a GPU test is collected
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if HERE in Path(str(item.path)).parents]
    if not gpu_items:
        return
    skip = None if _cuda() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)

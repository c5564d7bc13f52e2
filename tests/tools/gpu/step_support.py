"""What the step tools' unit tests share (test_step_timed.py, test_step_guard_units.py,
test_step_probe.py, test_step_profile.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from harnesslab.tools.gpu import failures


def expected_lengths(trace: dict[str, Any], batch: int) -> list[list[int]]:
    """Each step's lengths as the trace gives them (its prompts, one token a step)."""
    lengths, out = [0] * batch, []
    for seg in trace["segments"]:
        lengths = [
            n if new is None else new for n, new in zip(lengths, seg["lengths"], strict=True)
        ]
        for _ in seg["tokens"]:
            out.append(list(lengths))
            lengths = [n + 1 for n in lengths]
    return out


def recorded_deadlines(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """failures.deadline replaced by one that only records its seconds (nothing is cut)."""
    seen: list[float] = []

    @contextlib.contextmanager
    def deadline(seconds: float):
        seen.append(seconds)
        yield

    monkeypatch.setattr(failures, "deadline", deadline)
    return seen

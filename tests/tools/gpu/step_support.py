"""What the step verify's unit tests share (test_step_timed.py, test_step_guard_units.py)."""

from __future__ import annotations

from typing import Any


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

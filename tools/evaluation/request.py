"""What the runner is asked: the one request shape for the candidate of every mode (evaluate,
sweep, probe, profile, the guarded verify, a step task's traces) and the bounds of the agent's
timing knobs. Which dev cases (a step task's: traces) a call names, and what the request carries
for them, is the task kind's (tools/task/kinds.py `select`, `runner_cases`).

Side of the trust boundary: trusted (host). The candidate's files travel as staged files under
their hash; nothing of the request comes from the workspace but the agent's case names and
knobs, checked here.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..execution import Launcher
from ..state import Candidate, Workspace
from ..task import Case

MAX_WARMUP, MAX_REPEATS = 100, 200


def check_bounds(warmup: int | None, repeats: int | None) -> None:
    if warmup is not None and not 0 <= warmup <= MAX_WARMUP:
        raise UsageError(f"warmup={warmup} is out of range.", next_step=f"use 0..{MAX_WARMUP}")
    if repeats is not None and not 1 <= repeats <= MAX_REPEATS:
        raise UsageError(f"repeats={repeats} is out of range.", next_step=f"use 1..{MAX_REPEATS}")


def kernel_request(
    ws: Workspace,
    launcher: Launcher,
    candidate: Candidate,
    mode: str,
    *,
    cases: list[Case] | None = None,
    seed: int | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The runner request for `candidate` (staged under its hash): one shape for every mode,
    so what the runner sees never depends on which tool asked."""
    digest = candidate.digest
    staged = launcher.stage_candidate(candidate.files, digest, scope=ws.store.root.name)
    request: dict[str, Any] = {
        "mode": mode,
        "candidate_dir": f"@stage/{staged}",
        "entry": ws.task.entry,
        "config_file": ws.task.config_file,
        "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
        "triton_cache": f"@stage/{launcher.dev_cache_of(staged)}/{digest}",
        "numerics": ws.task.numerics_request(),
        **extra,
    }
    if cases is not None:
        request["cases"] = [c.model_dump() for c in cases]
    if seed is not None:
        request["seed"] = seed
    if warmup is not None:
        request["warmup"] = warmup
    if repeats is not None:
        request["repeats"] = repeats
    return request


__all__ = [
    "MAX_REPEATS",
    "MAX_WARMUP",
    "check_bounds",
    "kernel_request",
]

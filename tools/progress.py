"""Progress of a tool's work as `progress(done, total, message)` steps: the one callable type
the servers' MCP progress notifications and the CLI's bar are fed through, and the one way to
call it. A leaf (tests/tools/test_layers.py RANKS): the compile pool (execution/), the tools
(evaluation/, integrity/), qualification (meta/) and the servers report through it; the
runner's streamed events become such steps in evaluation/progress.py.

Side of the trust boundary: trusted (host); a message is text for people and agents, never a
decision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Progress = Callable[[float, float, str], Awaitable[None] | None]


async def report(progress: Progress | None, done: float, total: float, message: str) -> None:
    """One progress step to `progress` (a sync or async callable), if there is one."""
    if progress is not None:
        maybe = progress(done, total, message)
        if maybe is not None:
            await maybe


__all__ = ["Progress", "report"]

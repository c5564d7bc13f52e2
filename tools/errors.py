"""One error hierarchy for the library. Every error says what to do next.

Servers turn a `HarnesslabError` into an MCP `ToolError` (message + next step); the CLI turns it
into a message on stderr and an exit code (`exit_code`): 2 for usage or environment problems,
1 for a candidate that failed or was rejected.
"""

from __future__ import annotations


class HarnesslabError(Exception):
    """Base class. `message` says what went wrong, `next_step` what the caller should do."""

    exit_code = 2

    def __init__(self, message: str, *, next_step: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.next_step = next_step

    def __str__(self) -> str:
        if self.next_step:
            return f"{self.message} Next: {self.next_step}"
        return self.message


class UsageError(HarnesslabError):
    """A bad argument, a bad file in the workspace, an unknown name."""


class EnvironmentProblem(HarnesslabError):
    """The machine cannot do the work: torch missing, GPU host unreachable, disk full."""


class CandidateError(HarnesslabError):
    """The candidate itself failed (crash, wrong result, rejected by the verifier)."""

    exit_code = 1


class ExecutorError(EnvironmentProblem):
    """A command could not be run or finished abnormally on an executor.

    `kind` classifies the failure so that callers and remote_health_check can say what to fix:
    unreachable, auth, host_key, timeout, cancelled, remote_env, disk_full, dropped, crashed;
    on a cluster (Slurm): node_failure, preempted, allocation_lost (the next call gets a new
    allocation).
    `started` is False when the command provably never started (safe to retry).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        next_step: str = "",
        started: bool = True,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, next_step=next_step)
        self.kind = kind
        self.started = started
        self.stderr_tail = stderr_tail


__all__ = [
    "CandidateError",
    "EnvironmentProblem",
    "ExecutorError",
    "HarnesslabError",
    "UsageError",
]

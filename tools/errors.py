"""One error hierarchy for the library, and the one place where a fault gets its blame.

Every error says what to do next. Servers turn a `HarnesslabError` into an MCP `ToolError`
(message + next step; servers/runtime.py); the CLI turns it into a message on stderr and an
exit code (`exit_code`): 2 for usage or environment problems, 1 for a candidate that failed or
was rejected.

Blame (`HarnesslabError.blame`):
- `usage`: a bad argument or a bad file; fix the input.
- `candidate`: the candidate's own doing (wrong output, a crash of its code, a timeout of its
  code): recorded in the ledger as its result, and the agent is told to fix its kernel.
- `infrastructure`: the machinery failed under it (connection lost, worker died, allocation
  gone, node failure, killed by the out-of-memory killer, disk full). Never a ledger record of
  the candidate, never "fix your kernel": the call is retried once where it provably never
  started, else it is answered as retryable (`retryable`: calling again can work without fixing
  anything but the machine).
"""

from __future__ import annotations

import signal as _signal
from pathlib import Path
from typing import ClassVar, Literal

Blame = Literal["usage", "candidate", "infrastructure"]


class HarnesslabError(Exception):
    """Base class. `message` says what went wrong, `next_step` what the caller should do."""

    exit_code = 2
    blame: ClassVar[Blame] = "usage"

    def __init__(self, message: str, *, next_step: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.next_step = next_step

    @property
    def retryable(self) -> bool:
        """Whether the same call can succeed when made again, with nothing fixed but time."""
        return False

    def __str__(self) -> str:
        if self.next_step:
            return f"{self.message} Next: {self.next_step}"
        return self.message


class UsageError(HarnesslabError):
    """A bad argument, a bad file in the workspace, an unknown name."""


class EnvironmentProblem(HarnesslabError):
    """The machine cannot do the work: torch missing, GPU host unreachable, disk full."""

    blame: ClassVar[Blame] = "infrastructure"


class CandidateError(HarnesslabError):
    """The candidate itself failed (crash, wrong result, rejected by the verifier)."""

    exit_code = 1
    blame: ClassVar[Blame] = "candidate"


# Fault kinds of InfrastructureError, and whether a call that failed with one can succeed when
# made again without anyone fixing anything (a fault that leaves nothing to fix but time).
FAULT_KINDS: dict[str, bool] = {
    "dropped": True,  # the connection to the GPU host was lost
    "crashed": True,  # a warm worker was gone before the request reached it
    "killed": True,  # killed by a signal from outside (out-of-memory killer, operator)
    "node_failure": True,  # Slurm: a node of the allocation failed
    "preempted": True,  # Slurm: the allocation was preempted
    "allocation_lost": True,  # Slurm: the allocation ended (cancelled, time limit, idle)
    "unreachable": True,  # the host did not answer (network, sshd down): maybe transient
    "timeout": False,  # a command of the toolkit's own took too long
    "cancelled": False,  # the caller or the server stopped it
    "auth": False,
    "host_key": False,
    "remote_env": False,  # the host lacks something (python, torch, a writable folder)
    "disk_full": False,  # free space first (the error names where and how much)
}


class InfrastructureError(EnvironmentProblem):
    """A fault of the machinery under a call, never the candidate's (see the module docstring).

    `kind` is one of FAULT_KINDS; `started` is False when the work provably never started (the
    caller may retry it at once)."""

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

    @property
    def retryable(self) -> bool:
        return FAULT_KINDS.get(self.kind, False) or (
            not self.started and self.kind not in ("auth", "host_key", "remote_env", "disk_full")
        )


class ExecutorError(InfrastructureError):
    """A command could not be run or finished abnormally on an executor.

    `kind` classifies the failure so that callers and remote_health_check can say what to fix:
    unreachable, auth, host_key, timeout, cancelled, remote_env, disk_full, dropped, crashed,
    killed; on a cluster (Slurm): node_failure, preempted, allocation_lost (the next call gets a
    new allocation). `started` is False when the command provably never started (safe to retry).
    """


class DiskFull(InfrastructureError):
    """No space left where the toolkit writes (the trusted store, the stage, the GPU host's
    root folder): names the folder, what is free there and what the write needed. Nothing of
    the call was recorded; the next call works once space is freed."""

    def __init__(
        self,
        path: Path | str,
        *,
        needed_bytes: int | None = None,
        free_bytes: int | None = None,
        host: str = "",
    ) -> None:
        where = f"{host}:{path}" if host else str(path)
        free = "" if free_bytes is None else f", {human_bytes(free_bytes)} free"
        need = "" if needed_bytes is None else f"; it needs {human_bytes(needed_bytes)}"
        super().__init__(
            f"disk full: no space left in {where}{free}{need}.",
            kind="disk_full",
            next_step=f"free space there (df -h {path}; old checkpoints, Triton caches under the "
            "stage), then call again",
        )
        self.path = str(path)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


# Signals that end a process from outside, with who sends them. Any other signal (SIGSEGV,
# SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSYS from the sandbox's seccomp filter, SIGXCPU, SIGXFSZ)
# is the process's own doing, so the candidate's when its code runs there.
OUTSIDE_SIGNALS: dict[int, str] = {
    _signal.SIGKILL: "the host's out-of-memory killer (dmesg on the host says so), a scheduler "
    "or an operator",
    _signal.SIGTERM: "an operator, a scheduler or the machine shutting down",
    _signal.SIGHUP: "its session ending",
    _signal.SIGINT: "an interrupt",
}


def signal_name(signum: int) -> str:
    try:
        return f"{_signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


def signal_of(exit_code: int | None) -> int | None:
    """The signal that ended a process, from its exit status as Python (-N) or a shell
    (128+N: the SSH and Slurm wrappers and the sandbox report it so) gives it."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def killed_from_outside(exit_code: int | None, *, what: str, host: str) -> ExecutorError | None:
    """The infrastructure fault of a process ended by a signal from outside (see
    OUTSIDE_SIGNALS), or None: an exit of its own, or a signal of its own making."""
    sig = signal_of(exit_code)
    if sig is None or sig not in OUTSIDE_SIGNALS:
        return None
    return ExecutorError(
        f"{host}: {what} was killed by {signal_name(sig)}, most likely by "
        f"{OUTSIDE_SIGNALS[sig]}; this is not the candidate's result and nothing was recorded.",
        kind="killed",
        next_step="retry the call; if it repeats, check the host's free memory (free -g; "
        "dmesg | grep -i oom) and what else runs there",
    )


def agent_text(exc: HarnesslabError, generic_next: str = "") -> str:
    """What an agent (or a CLI user) reads for `exc`: an infrastructure fault says so, names
    its kind and says whether to retry; others are the message and the next step."""
    if isinstance(exc, InfrastructureError):
        step = exc.next_step
        if exc.retryable and not any(w in step.lower() for w in ("retry", "call again")):
            step = f"retry the call{'; ' + step if step else ''}"
        head = f"infrastructure fault ({exc.kind}), not the candidate's: {exc.message}"
        return f"{head} Next: {step}" if step else head
    if exc.next_step or not generic_next:
        return str(exc)
    return f"{exc} Next: {generic_next}"


def first_fault(exc: BaseException) -> BaseException:
    """A task group's ExceptionGroup whose failures include a HarnesslabError: that error (the
    first), so the caller sees a named fault instead of a group; anything else unchanged."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    for inner in exc.exceptions:
        found = first_fault(inner)
        if isinstance(found, HarnesslabError):
            return found
    return exc


__all__ = [
    "FAULT_KINDS",
    "OUTSIDE_SIGNALS",
    "Blame",
    "CandidateError",
    "DiskFull",
    "EnvironmentProblem",
    "ExecutorError",
    "HarnesslabError",
    "InfrastructureError",
    "UsageError",
    "agent_text",
    "first_fault",
    "human_bytes",
    "killed_from_outside",
    "signal_name",
    "signal_of",
]

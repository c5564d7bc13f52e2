"""Where commands run: the executor contract and its backends (local, SSH), the launcher that
stages the GPU-side harness and runs it on a slot (one GPU of one host) under that GPU's lock,
and the health of every host. README.md here says how to add a backend.

Side of the trust boundary: trusted (the harness it stages is hash-checked on every call).
"""

from .check_hosts import health_check
from .executor import CommandResult, Executor, LocalExecutor
from .health import HealthReport
from .launcher import Launcher, RunnerCall, build_launcher
from .procgroup import ProcessGroup
from .staging import harness_digests

__all__ = [
    "CommandResult",
    "Executor",
    "HealthReport",
    "Launcher",
    "LocalExecutor",
    "ProcessGroup",
    "RunnerCall",
    "build_launcher",
    "harness_digests",
    "health_check",
]

"""A slot (one GPU of one executor) and the warm runner it may hold: the launcher's units, below
the launcher and the modules it builds (warm.py, compile_pool.py), which take them back.

Side of the trust boundary: trusted (host). A Worker is a handle on a sandboxed runner process.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from .executor import Executor, InteractiveProcess


class Worker:
    """A warm runner process on one slot (sandboxed: it imports candidates of one task)."""

    def __init__(
        self,
        proc: InteractiveProcess,
        digest: str,
        task: str = "",
        scope: str = "",
        token: str = "",
    ) -> None:
        self.proc = proc
        self.digest = digest
        self.task = task
        self.scope = scope  # the staged candidates it may read (one workspace's)
        self.token = token  # its sandbox's exit report carries it
        self.sandbox: dict[str, Any] = {}
        self.served = 0
        self.last_used = time.monotonic()


class Slot:
    def __init__(self, executor: Executor, gpu_index: int) -> None:
        self.executor = executor
        self.gpu_index = gpu_index
        self.lock = anyio.Lock()
        self.calls = 0
        self.worker: Worker | None = None
        self.warm_supported = True

    @property
    def label(self) -> str:
        return f"{self.executor.host}:gpu{self.gpu_index}"


__all__ = ["Slot", "Worker"]

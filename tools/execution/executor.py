"""Executors run commands where the GPU is: the local machine or a remote host over SSH.

One interface (`Executor`), several backends (execution/backends.py names them; README.md here
says how to add one; tests/tools/execution/test_executor_contract.py is what every backend
passes). Every command runs in its own process group; a timeout or a cancel kills the whole
group (TERM, then KILL after a grace period): on this machine through procgroup.py. Files reach
the executor through `sync_tree` (only changed files travel) before a command refers to them.
Callers use only this interface: no backend is ever probed with isinstance or getattr.
"""

from __future__ import annotations

import os
import shutil
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import NamedTuple

import anyio

from ..errors import ExecutorError
from ..settings import Settings
from . import procgroup
from .command_result import CommandResult
from .health import HostHealth, probe_host
from .procgroup import DEVNULL, LineSink, ProcessGroup

# Hears why a call waits before it runs ("waiting for GPU 0 (held by pid N)", "pending: Resources").
OnWait = Callable[[str], Awaitable[None] | None]


class Executor(ABC):
    """Where commands run. Paths given to `run` (cwd, argv items) are executor-side paths."""

    name: str = "executor"
    host: str = "local"
    # Commands that can run here at once (None: no bound beside the host's own resources).
    max_parallel: int | None = None
    # Whether this executor's paths are this machine's: a command task's objective then runs
    # in the workspace itself, the GPU lock is a flock here (tools/execution/gpu_lock.py), and
    # the sandbox that applies is this machine's.
    on_this_machine: bool = False
    # Whether a scheduler keeps every other job off this executor's GPUs (a Slurm allocation):
    # the GPU lock then needs no lock file, only the launcher's in-process slot lock.
    gpus_reserved: bool = False

    def python(self, settings: Settings) -> str:
        """The interpreter that runs the harness on this executor."""
        return settings.remote_python

    def channels_held(self) -> int:
        """Command slots of `max_parallel` that the executor's own long-lived helpers hold now
        (the SSH sync helper), for the launcher's capacity sums."""
        return 0

    def gpu_indices(self, settings: Settings) -> list[int]:
        """The GPUs this executor offers; the launcher makes one slot of each. The launcher
        names a slot's GPU to `run`/`start` as CUDA_VISIBLE_DEVICES=<index>."""
        return [int(g) for g in settings.gpus.split(",") if g.strip()] or [0]

    async def connect(self, *, on_wait: OnWait | None = None) -> None:  # noqa: B027
        """Open a connection and resolve the root folder (before `path`); raises
        ExecutorError. A backend that may wait first (a pending allocation) says why through
        `on_wait`. Backends with nothing to open keep this no-op."""

    async def health(
        self, *, python: str, min_free_disk_gb: float = 1.0, python_probe: bool = True
    ) -> HostHealth:
        """Reachability, latency, Python/torch/triton/CUDA, free disk and GPUs of this host,
        through `run` (tools/execution/health.py). Costs a few seconds with `python_probe` (a
        torch import there). Never raises for the expected failures: they come back classified
        in `problems` (kind + next step)."""
        return await probe_host(
            self, python=python, min_free_disk_gb=min_free_disk_gb, python_probe=python_probe
        )

    @abstractmethod
    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        stdin: bytes | None = None,
        max_output_bytes: int = 8 << 20,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        """Run argv in a new process group; on timeout or cancel kill the group.

        A timeout returns a result with timed_out=True and exit_code None (it does not raise);
        a cancel kills the group and re-raises the cancellation. Failures to start raise
        ExecutorError(started=False). `on_line` receives each stdout line as it arrives
        (progress events); the whole stdout is still returned."""

    @abstractmethod
    async def sync_tree(
        self, local_dir: Path, remote_dir: str, *, skip: Collection[str] = ()
    ) -> list[str]:
        """Make remote_dir mirror local_dir's files; return the relative paths that travelled.
        `skip`: top-level folders the host writes itself (caches, scratch): never sent, and
        never listed on the host (a listing of thousands of cache files costs every call)."""

    @abstractmethod
    def path(self, *parts: str) -> str:
        """An executor-side path under this executor's root folder."""

    async def start(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: str | None = None,
    ) -> InteractiveProcess:
        """Start a long-lived process (a warm worker) in its own process group, talking JSON
        lines over stdin/stdout. Backends without it make the launcher use fresh processes."""
        raise NotImplementedError

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and workers."""


class Ending(NamedTuple):
    """How an interactive process ended (InteractiveProcess.ended): its exit status as a shell
    reports it (128+N for a signal; None: unknown), or the fault of the transport that carried
    it (`lost`: the connection or the allocation went away, the process did not just exit)."""

    code: int | None = None
    lost: ExecutorError | None = None


class InteractiveProcess(ABC):
    """A process in its own group that reads request lines and writes event lines."""

    pid: int

    def alive(self) -> bool:
        """False once the process is known to be gone (exited, killed, its connection lost):
        a request sent to it could never start. Backends that cannot tell say True."""
        return True

    async def ended(self) -> Ending:
        """After receive_line() returned None: how the process ended (a bounded wait for its
        exit status). Backends that cannot tell return Ending()."""
        return Ending()

    @abstractmethod
    async def send_line(self, line: str) -> None: ...

    @abstractmethod
    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        """The next stdout line, or None at end of stream (the process died)."""

    @abstractmethod
    async def kill(self) -> None:
        """TERM then KILL the whole process group; safe to call twice."""


def inherited_env(allow: Collection[str] | None = None) -> dict[str, str]:
    """The environment a local child starts from: all of this process's, or only the names in
    `allow` (qualification runs generated code with no provider keys, no SSH agent socket)."""
    if allow is None:
        return dict(os.environ)
    return {k: os.environ[k] for k in allow if k in os.environ}


class LocalInteractive(InteractiveProcess):
    def __init__(self, group: ProcessGroup) -> None:
        from anyio.streams.buffered import BufferedByteReceiveStream  # noqa: PLC0415

        self.group = group
        self.process = group.process
        self.pid = group.pid
        assert self.process.stdout is not None and self.process.stdin is not None
        self._out = BufferedByteReceiveStream(self.process.stdout)

    async def send_line(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            await self.process.stdin.send(line.encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise ExecutorError(
                "the warm worker was gone before the request reached it.",
                kind="crashed",
                started=False,
                next_step="call again: a new worker starts",
            ) from exc

    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        try:
            return (await self._out.receive_until(b"\n", max_bytes)).decode(errors="replace")
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ):
            return None

    def alive(self) -> bool:
        return not self.group.killed and self.process.returncode is None

    async def ended(self) -> Ending:
        code = await self.group.wait()
        return Ending(code=None if code is None else 128 - code if code < 0 else code)

    async def kill(self) -> None:
        await self.group.kill()


class LocalExecutor(Executor):
    """Runs commands on this machine. `root` holds synced trees (a per-user cache folder)."""

    name = "local"
    host = "local"
    on_this_machine = True

    def python(self, settings: Settings) -> str:
        return settings.python

    async def connect(self, *, on_wait: OnWait | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def __init__(self, root: Path) -> None:
        self.root = root
        # Interactive processes started here and not yet killed: aclose() ends them, so none
        # outlives the executor (an open one's asyncio transport, collected after its event
        # loop closed, printed "RuntimeError: Event loop is closed" at a program's exit).
        self._live: weakref.WeakSet[LocalInteractive] = weakref.WeakSet()

    def path(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    async def aclose(self) -> None:
        for proc in list(self._live):
            await proc.kill()

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        stdin: bytes | None = None,
        max_output_bytes: int = 8 << 20,
        on_line: LineSink | None = None,
        env_allow: Collection[str] | None = None,
    ) -> CommandResult:
        """See Executor.run. `env_allow`: inherit only these variables (then `env`)."""
        full_env = inherited_env(env_allow)
        if env:
            full_env.update(env)
        try:
            done = await procgroup.run(
                argv,
                cwd=cwd,
                env=full_env,
                timeout_s=timeout_s,
                stdin=stdin,
                keep_bytes=max_output_bytes,
                on_line=on_line,
            )
        except OSError as exc:
            raise ExecutorError(
                f"could not start {argv[0]!r}: {exc}",
                kind="remote_env",
                started=False,
                next_step="check that the interpreter/command exists (HARNESSLAB_PYTHON)",
            ) from exc
        return CommandResult(
            argv=list(argv),
            exit_code=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            duration_s=done.duration_s,
            timed_out=done.timed_out,
            host=self.host,
        )

    async def start(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: str | None = None,
    ) -> InteractiveProcess:
        try:
            group = await ProcessGroup.spawn(
                argv,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stderr=stderr_path or DEVNULL,
            )
        except OSError as exc:
            raise ExecutorError(
                f"could not start {argv[0]!r}: {exc}", kind="remote_env", started=False
            ) from exc
        proc = LocalInteractive(group)
        self._live.add(proc)
        return proc

    async def sync_tree(
        self, local_dir: Path, remote_dir: str, *, skip: Collection[str] = ()
    ) -> list[str]:
        dest = Path(remote_dir)
        if dest.resolve() == local_dir.resolve():
            return []
        changed: list[str] = []
        for src in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = src.relative_to(local_dir)
            if rel.parts[0] in skip:
                continue
            target = dest / rel
            if target.is_file() and target.read_bytes() == src.read_bytes():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            changed.append(rel.as_posix())
        return changed


def start_failure(
    host: str, code: int | None, stderr: str, program: str, cwd: str | None
) -> ExecutorError | None:
    """The shell's own report that argv never ran: no such program (127) or cwd (126), for
    backends that start commands through a shell wrapper (SSH, Slurm)."""
    tail = stderr.strip()[-300:]
    if code == 127 and (
        f"{program}: not found" in stderr
        or f"{program}: command not found" in stderr
        or (program in stderr and "No such file or directory" in stderr)
    ):
        return ExecutorError(
            f"{host}: {program!r} not found ({tail}).",
            kind="remote_env",
            started=False,
            stderr_tail=tail,
            next_step="install it on the host or fix the path (remote_python for Python)",
        )
    if code == 126 and cwd and ("can't cd" in stderr or f"{cwd}: No such file" in stderr):
        return ExecutorError(
            f"{host}: cannot enter the working directory {cwd!r} ({tail}).",
            kind="remote_env",
            started=False,
            stderr_tail=tail,
            next_step="sync the tree there first (sync_tree) or fix cwd",
        )
    return None


__all__ = [
    "CommandResult",
    "Ending",
    "Executor",
    "InteractiveProcess",
    "LineSink",
    "LocalExecutor",
    "OnWait",
    "inherited_env",
    "start_failure",
]

"""The SSH executor: commands and synced trees on a remote GPU host, over asyncssh.

Every command runs in its own process group on the host. The wrapper below starts it with
`setsid`, writes the group id to `<remote_root>/run/<id>.pid`, and after the command's leader
exits kills whatever the command left in its group. A timeout, a cancel or `aclose()` kills the
group through a SECOND channel (`kill -TERM -PGID`, then KILL after a grace period): sshd does
not deliver channel signals for root logins and sends none when a channel just closes, so
closing the channel alone would leave the command running. A connection that drops mid-command
leaves its group behind; the next connection to that host kills it first.
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import time
import uuid
from collections.abc import Collection, Mapping
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import asyncssh

from ..errors import ExecutorError
from .executor import (
    CommandResult,
    Ending,
    Executor,
    InteractiveProcess,
    LineSink,
    OnWait,
    start_failure,
)
from .procgroup import KILL_GRACE_S, Capture
from .ssh_pool import ConnectionPool, PooledConnection, SSHTarget
from .ssh_sync import MANIFEST, SyncHelper, sync_tree

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 16
_SETUP_TIMEOUT_S = 30.0

# $1 = run base (<root>/run/<id>), $2 = cwd or "", $3... = argv. The inner sh stays the group
# leader (no exec) so a command killed by a signal still reports 128+N through setsid -w.
_RUN = r"""b=$1; shift
setsid -w sh -c 'b=$1; echo $$ >"$b.pid"; [ -e "$b.cancel" ] && exit 143
if [ -n "$2" ]; then cd -- "$2" || exit 126; fi; shift 2; "$@"' harnesslab "$b" "$@"
rc=$?
pg=$(cat "$b.pid" 2>/dev/null); [ -n "$pg" ] && kill -KILL "-$pg" 2>/dev/null
rm -f -- "$b.pid" "$b.cancel"; exit $rc"""

# $1 = run base, $2 = grace in tenths of a second. The cancel file stops a wrapper that has not
# written its pid yet; one that has is found through the pid file. Zombies do not count as alive
# (a container's init may never reap them).
_KILL = r"""b=$1; n=$2
alive() { ps -eo pgid=,stat= 2>/dev/null | awk -v g="$1" '$1==g && $2 !~ /^Z/ {f=1} END {exit !f}'; }
touch -- "$b.cancel" 2>/dev/null
pg=$(cat -- "$b.pid" 2>/dev/null); [ -n "$pg" ] || exit 0
kill -TERM "-$pg" 2>/dev/null || exit 0
i=0; while [ "$i" -lt "$n" ] && alive "$pg"; do sleep 0.1; i=$((i+1)); done
kill -KILL "-$pg" 2>/dev/null; exit 0"""

# $1 = remote_root as configured (~ or relative to $HOME allowed). Prints the absolute root
# and clears run files older than a day.
_SETUP = r"""r=$1
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
mkdir -p -- "$r/run" && cd -- "$r" && pwd || exit 1
find run -type f -mmin +1440 -exec rm -f {} + 2>/dev/null; exit 0"""


def _quote(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


async def _pump(reader: asyncssh.SSHReader, capture: Capture) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        await capture.feed(chunk)
    await capture.end()


class SSHExecutor(Executor):
    """Runs commands on one SSH host; see the module docstring for the kill protocol.

    `max_connections` connections at most, `channels_per_connection` commands on each at once
    (more wait their turn). Call `connect()` before `path()` unless remote_root is absolute."""

    name = "ssh"

    def __init__(
        self,
        target: SSHTarget,
        *,
        max_connections: int = 3,
        channels_per_connection: int = 8,
        kill_grace_s: float = KILL_GRACE_S,
    ) -> None:
        self.target = target
        self.host = target.label
        self.kill_grace_s = kill_grace_s
        self.max_parallel = max_connections * channels_per_connection
        self.pool = ConnectionPool(
            target,
            max_connections=max_connections,
            channels_per_connection=channels_per_connection,
            on_connect=self._on_connect,
        )
        root = target.remote_root
        self._root = posixpath.normpath(root) if root.startswith("/") else None
        self._orphans: set[str] = set()  # run bases whose connection dropped mid-command
        self._inflight: dict[str, PooledConnection] = {}
        self._closing = False
        self._sync = SyncHelper(self)  # sync_tree's steps on the host (ssh_sync.py)

    # -- connection setup ---------------------------------------------------------------

    async def connect(self, *, on_wait: OnWait | None = None) -> None:
        """Open the first connection now (resolving remote_root); raises ExecutorError."""
        await self.pool.connection()

    async def _on_connect(self, entry: PooledConnection) -> None:
        try:
            result = await self._plain(entry, _SETUP, [self.target.remote_root])
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise ExecutorError(
                f"{self.host}: the new connection failed during setup ({exc}).",
                kind="unreachable",
                started=False,
                next_step="retry; check the host's load and sshd logs if it persists",
            ) from exc
        root = result.stdout.strip() if isinstance(result.stdout, str) else ""
        if result.exit_status != 0 or not root:
            raise _setup_error(self.target, self.target.remote_root, str(result.stderr))
        self._root = root
        await self._reap_orphans(entry)

    async def _reap_orphans(self, entry: PooledConnection) -> None:
        """Kill the groups of commands whose connection dropped under them."""
        for base in sorted(self._orphans):
            logger.warning("ssh %s: killing a command orphaned by a dropped connection", self.host)
            try:
                await self._plain(entry, _KILL, [base, str(self._grace_ticks())])
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                logger.warning("ssh %s: could not kill %s yet: %s", self.host, base, exc)
                return
            self._orphans.discard(base)

    async def _plain(self, entry: PooledConnection, script: str, args: list[str]):
        """A short helper script on a spare channel, outside any process-group wrapper."""
        async with entry.spare:
            with anyio.fail_after(_SETUP_TIMEOUT_S + self.kill_grace_s):
                return await entry.conn.run(_quote(["sh", "-c", script, "sh", *args]), check=False)

    def _grace_ticks(self) -> int:
        return max(1, round(self.kill_grace_s * 10))

    def path(self, *parts: str) -> str:
        if self._root is None:
            raise ExecutorError(
                f"remote_root {self.target.remote_root!r} of {self.host} is not resolved yet.",
                kind="remote_env",
                started=False,
                next_step="await executor.connect() before calling path()",
            )
        return posixpath.join(self._root, *parts)

    # -- commands -------------------------------------------------------------------------

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
        """Run argv on the host in a new process group (see `Executor.run`).

        A signal-killed command reports exit code 128+N (shell convention). A command that
        provably never started (connect or channel-open failure) is retried twice; a connection
        lost mid-command raises ExecutorError(kind="dropped", started=True)."""
        if not argv:
            raise ExecutorError("empty argv", kind="remote_env", started=False)
        delay = 0.25
        for attempt in range(3):
            try:
                async with self.pool.channel() as entry:
                    return await self._run_on(
                        entry, argv, cwd, env, timeout_s, stdin, max_output_bytes, on_line
                    )
            except ExecutorError as exc:
                if exc.started or exc.kind != "dropped" or attempt == 2 or self._closing:
                    raise
                logger.info("ssh %s: %s; retrying (it never started)", self.host, exc)
                await anyio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def _spawn(
        self,
        entry: PooledConnection,
        argv: list[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> tuple[str, asyncssh.SSHClientProcess]:
        """Start argv under the group wrapper; returns its run base and the channel."""
        base = self.path("run", uuid.uuid4().hex)
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)
        command = _quote(["sh", "-c", _RUN, "sh", base, cwd or "", *words])
        try:
            process = await entry.conn.create_process(command, encoding=None)
        except asyncssh.ChannelOpenError as exc:  # refused before anything ran
            raise ExecutorError(
                f"{self.host}: could not open a channel ({exc.reason}).",
                kind="dropped",
                started=False,
                next_step="check the host; lower channels_per_connection if sshd's "
                "MaxSessions is below 10",
            ) from exc
        except BaseException as exc:  # the exec request may have reached the host
            with anyio.CancelScope(shield=True):
                await self._kill(base, entry)
            if _transport_error(exc):
                raise self._dropped(exc) from exc
            raise
        self._inflight[base] = entry
        return base, process

    async def _run_on(
        self,
        entry: PooledConnection,
        argv: list[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout_s: float,
        stdin: bytes | None,
        limit: int,
        on_line: LineSink | None,
    ) -> CommandResult:
        started = time.perf_counter()
        base, process = await self._spawn(entry, argv, cwd, env)
        out, err = Capture(limit, on_line=on_line), Capture(limit)
        try:
            with anyio.move_on_after(timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_pump, process.stdout, out)
                    tg.start_soon(_pump, process.stderr, err)
                    if stdin:
                        process.stdin.write(stdin)
                        await process.stdin.drain()
                    process.stdin.write_eof()
                await process.wait_closed()
            if scope.cancelled_caught:
                await self._kill(base, entry)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._kill(base, entry)
            if self._closing:
                raise self._closed_error(argv) from exc
            if _transport_error(exc):
                raise self._dropped(exc) from exc
            raise
        finally:
            process.close()
            self._inflight.pop(base, None)
        code = process.returncode
        if self._closing:  # aclose() killed it: its exit status says nothing about argv
            raise self._closed_error(argv)
        if not scope.cancelled_caught and code is None:
            await self._kill(base, entry)
            raise self._dropped(None)
        stderr = err.text()
        if failure := start_failure(self.host, code, stderr, argv[0], cwd):
            raise failure
        return CommandResult(
            argv=list(argv),
            exit_code=None if scope.cancelled_caught else code,
            stdout=out.text(),
            stderr=stderr,
            duration_s=time.perf_counter() - started,
            timed_out=scope.cancelled_caught,
            host=self.host,
        )

    async def start(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: str | None = None,
    ) -> SSHInteractive:
        """Start a long-lived process (a warm worker) in its own group on the host.

        It holds one command channel until `kill()`; its stderr goes to stderr_path on the
        host (appended) or is discarded. `pid` is 0: the group is killed through its run base."""
        words = ["sh", "-c", 'f=$1; shift; exec "$@" 2>>"$f"', "sh", stderr_path or "/dev/null"]
        stack = AsyncExitStack()
        try:
            entry = await stack.enter_async_context(self.pool.channel())
            base, process = await self._spawn(entry, [*words, *argv], cwd, env)
        except BaseException:
            await stack.aclose()
            raise
        return SSHInteractive(self, entry, base, process, stack)

    def _closed_error(self, argv: list[str]) -> ExecutorError:
        return ExecutorError(
            f"{self.host}: the executor closed while {argv[0]!r} ran; its process group was "
            "killed.",
            kind="cancelled",
        )

    def _dropped(self, exc: BaseException | None) -> ExecutorError:
        why = f" ({type(exc).__name__}: {exc})" if exc else ""
        return ExecutorError(
            f"{self.host}: the SSH connection was lost while the command ran{why}.",
            kind="dropped",
            started=True,
            next_step="retry; the next call reconnects and kills what the lost command left",
        )

    async def _kill(self, base: str, entry: PooledConnection) -> None:
        """TERM, then KILL the command's group through another channel; never raises."""
        if entry.closed:
            self._orphans.add(base)  # killed by the next connection (_on_connect) or aclose()
            return
        try:
            await self._plain(entry, _KILL, [base, str(self._grace_ticks())])
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            logger.warning("ssh %s: could not kill %s yet: %s", self.host, base, exc)
            self._orphans.add(base)

    # -- files -----------------------------------------------------------------------------

    async def sync_tree(
        self,
        local_dir: Path,
        remote_dir: str,
        *,
        skip: Collection[str] = (),
        timeout_s: float = 300.0,
    ) -> list[str]:
        """Mirror local_dir's files into remote_dir (ssh_sync.sync_tree: only changed files
        travel, through the executor's sync helper)."""
        return await sync_tree(self._sync, local_dir, remote_dir, skip=skip, timeout_s=timeout_s)

    def channels_held(self) -> int:
        """Channels the executor's own long-lived helper holds (the sync helper)."""
        return self._sync.channels()

    @property
    def closing(self) -> bool:
        return self._closing

    # -- shutdown --------------------------------------------------------------

    async def aclose(self) -> None:
        """Kill every command still running here, then close the connections."""
        self._closing = True
        with anyio.CancelScope(shield=True):
            await self._sync.aclose()
            async with anyio.create_task_group() as tg:
                for base, entry in list(self._inflight.items()):
                    tg.start_soon(self._kill, base, entry)
            if self._orphans:  # left by dropped connections: one more try before leaving
                with anyio.move_on_after(self.target.connect_timeout_s + _SETUP_TIMEOUT_S):
                    try:
                        await self._reap_orphans(await self.pool.connection())
                    except ExecutorError as exc:
                        logger.warning("ssh %s: orphans left running: %s", self.host, exc)
            await self.pool.aclose()


class SSHInteractive(InteractiveProcess):
    """A warm worker's channel: request lines in on stdin, event lines out on stdout."""

    def __init__(
        self,
        executor: SSHExecutor,
        entry: PooledConnection,
        base: str,
        process: asyncssh.SSHClientProcess,
        slot: AsyncExitStack,
    ) -> None:
        self.pid = 0
        self._executor, self._entry, self._base = executor, entry, base
        self._process, self._slot = process, slot
        self._buffer = bytearray()
        self._killed = False
        self._lost: BaseException | None = None  # the transport error a read ended with

    def alive(self) -> bool:
        return (
            not self._killed
            and self._lost is None
            and not self._entry.closed
            and self._process.returncode is None
        )

    async def ended(self) -> Ending:
        """The command's exit status (128+N for a signal: the group wrapper), or `lost` when the
        connection went away under it (no exit status ever came)."""
        if self._lost is None and not self._entry.closed:
            with anyio.move_on_after(self._executor.kill_grace_s, shield=True):
                await self._process.wait_closed()
        code = self._process.returncode
        if self._lost is not None or self._entry.closed or code is None:
            return Ending(lost=self._executor._dropped(self._lost))
        return Ending(code=128 - code if code < 0 else code)

    async def send_line(self, line: str) -> None:
        await self.send_bytes(line.encode() + b"\n")

    async def send_bytes(self, data: bytes) -> None:
        try:
            self._process.stdin.write(data)
            await self._process.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise ExecutorError(
                f"{self._executor.host}: the warm worker was gone before the request reached it.",
                kind="crashed",
                started=False,
                next_step="call again: a new worker starts",
            ) from exc

    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        line = await self.receive_until(b"\n", max_bytes)
        return None if line is None else line.decode(errors="replace")

    async def receive_until(self, sep: bytes, max_bytes: int = 64 << 20) -> bytes | None:
        """The output up to the next `sep` (consumed, not returned); None at its end."""
        start = 0
        while (end := self._buffer.find(sep, start)) < 0:
            if len(self._buffer) > max_bytes:
                raise ExecutorError(f"worker line over {max_bytes} bytes", kind="crashed")
            start = max(0, len(self._buffer) - len(sep) + 1)
            try:
                chunk = await self._process.stdout.read(_READ_CHUNK)
            except (OSError, asyncssh.Error) as exc:
                self._lost = exc
                return None
            if not chunk:
                return None
            self._buffer.extend(chunk)
        data = bytes(self._buffer[:end])
        del self._buffer[: end + len(sep)]
        return data

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        with anyio.CancelScope(shield=True):
            await self._executor._kill(self._base, self._entry)
            self._process.close()
            self._executor._inflight.pop(self._base, None)
            await self._slot.aclose()


def _transport_error(exc: BaseException) -> bool:
    """True for a lost connection, also inside the task group's exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_transport_error(e) for e in exc.exceptions)
    return isinstance(exc, OSError | asyncssh.Error)


def _setup_error(target: SSHTarget, root: str, stderr: str) -> ExecutorError:
    return ExecutorError(
        f"{target.label}: cannot create remote_root {root!r}: {stderr.strip()[-300:]}",
        kind="disk_full" if "No space left" in stderr else "remote_env",
        started=False,
        next_step="choose a writable remote_root (HARNESSLAB_REMOTE_ROOT) on the host",
    )


__all__ = [
    "MANIFEST",
    "SSHExecutor",
    "SSHInteractive",
    "SSHTarget",
]

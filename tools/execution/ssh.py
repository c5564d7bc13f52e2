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

import io
import json
import logging
import posixpath
import shlex
import tarfile
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

logger = logging.getLogger(__name__)

MANIFEST = ".manifest.json"
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

# $1: the folder; $2...: top-level folders in it the host writes itself (sync_tree's `skip`:
# sandbox scratch folders, Triton caches, thousands of files after a few sweeps): not listed.
_STATE = r"""mkdir -p -- "$1" && cd -- "$1" || exit 1; shift
[ -f .manifest.json ] && cat .manifest.json; printf '\n@@HL-STAT@@\n'
prune=""; for d in "$@"; do prune="$prune -path ./$d -prune -o"; done
find . $prune -type f ! -path ./.manifest.json -printf '%P\0%s\0%T@\0'"""

_APPLY = r"""cd -- "$1" || exit 1; shift
for f in "$@"; do rm -f -- "$f" || exit 1; done
tar -x -p -f - --no-same-owner"""


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
    ) -> InteractiveProcess:
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
        """Mirror local_dir's files into remote_dir; only changed files travel (one tar stream).

        The host keeps `remote_dir/.manifest.json` (sha256, size, mtime per file sent). A file
        travels when its hash differs from the manifest or the host's copy no longer has the
        recorded size and mtime (edited or deleted there). Files sent earlier and gone locally
        are deleted; files the host created itself (caches, outputs) are left alone, and the
        top-level folders in `skip` are not even listed."""
        local = await anyio.to_thread.run_sync(_scan, local_dir)
        local = {rel: v for rel, v in local.items() if rel.split("/", 1)[0] not in skip}
        state = await self.run(["sh", "-c", _STATE, "sh", remote_dir, *skip], timeout_s=timeout_s)
        if state.exit_code != 0:
            raise _sync_error(self.host, remote_dir, state)
        manifest, on_host = _parse_state(state.stdout)
        send = sorted(
            rel
            for rel, (digest, _size, _mtime, _mode) in local.items()
            if (old := manifest.get(rel)) is None
            or old.get("sha256") != digest
            or on_host.get(rel) != (old.get("size"), old.get("mtime"))
        )
        gone = sorted(rel for rel in manifest if rel not in local and rel in on_host)
        if not send and not gone and set(manifest) == set(local):
            return []
        new_manifest = {
            rel: manifest[rel] if rel not in send else {"sha256": d, "size": s, "mtime": m}
            for rel, (d, s, m, _mode) in local.items()
        }
        archive = await anyio.to_thread.run_sync(_tar, local_dir, send, local, new_manifest)
        applied = await self.run(
            ["sh", "-c", _APPLY, "sh", remote_dir, *gone], timeout_s=timeout_s, stdin=archive
        )
        if applied.timed_out or applied.exit_code != 0:
            raise _sync_error(self.host, remote_dir, applied)
        return send

    # -- shutdown --------------------------------------------------------------

    async def aclose(self) -> None:
        """Kill every command still running here, then close the connections."""
        self._closing = True
        with anyio.CancelScope(shield=True):
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
        try:
            self._process.stdin.write(line.encode() + b"\n")
            await self._process.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise ExecutorError(
                f"{self._executor.host}: the warm worker was gone before the request reached it.",
                kind="crashed",
                started=False,
                next_step="call again: a new worker starts",
            ) from exc

    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > max_bytes:
                raise ExecutorError(f"worker line over {max_bytes} bytes", kind="crashed")
            try:
                chunk = await self._process.stdout.read(_READ_CHUNK)
            except (OSError, asyncssh.Error) as exc:
                self._lost = exc
                return None
            if not chunk:
                return None
            self._buffer.extend(chunk)
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line.decode(errors="replace")

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


def _scan(root: Path) -> dict[str, tuple[str, int, int, int]]:
    """rel path -> (sha256, size, whole-second mtime, mode) for every file under root."""
    import hashlib

    files: dict[str, tuple[str, int, int, int]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path == root / MANIFEST:
            continue
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
        st = path.stat()
        files[path.relative_to(root).as_posix()] = (
            digest.hexdigest(),
            st.st_size,
            int(st.st_mtime),
            st.st_mode & 0o777,
        )
    return files


def _tar(root: Path, send: list[str], local: dict, manifest: dict) -> bytes:
    """A tar of the files to send, then the new manifest (last: it lands only if they did)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel in send:
            _digest, size, mtime, mode = local[rel]
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = size, mtime, mode
            with (root / rel).open("rb") as fh:
                tar.addfile(info, fh)
        data = json.dumps({"version": 1, "files": manifest}, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _parse_state(stdout: str) -> tuple[dict[str, dict], dict[str, tuple[int, int]]]:
    head, _, listing = stdout.partition("\n@@HL-STAT@@\n")
    try:
        manifest = json.loads(head)["files"] if head.strip() else {}
        if not isinstance(manifest, dict):
            manifest = {}
    except (ValueError, KeyError, TypeError):
        manifest = {}  # a torn manifest: every file travels again
    fields = listing.split("\0")
    on_host = {}
    for i in range(0, len(fields) - 2, 3):
        on_host[fields[i]] = (int(fields[i + 1]), int(float(fields[i + 2])))
    return manifest, on_host


def _sync_error(host: str, remote_dir: str, result: CommandResult) -> ExecutorError:
    tail = result.stderr_tail()
    if "No space left on device" in result.stderr:
        return ExecutorError(
            f"{host}: disk full while syncing into {remote_dir}.",
            kind="disk_full",
            stderr_tail=tail,
            next_step=f"free space on {host} (df -h {remote_dir}) or move remote_root",
        )
    what = "timed out" if result.timed_out else f"failed (exit {result.exit_code})"
    return ExecutorError(
        f"{host}: sync into {remote_dir} {what}: {tail[-300:]}",
        kind="timeout" if result.timed_out else "remote_env",
        stderr_tail=tail,
        next_step="check that the host has GNU tar and find, and that remote_root is writable",
    )


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

"""Where an SSH executor connects and how it holds connections.

`SSHTarget` says where and as whom (a `user@host:port` string or an ~/.ssh/config alias, with
key, known_hosts and an optional jump host). `ConnectionPool` keeps up to N connections to one
target, each carrying at most 8 command channels at once: OpenSSH's MaxSessions defaults to 10,
and 2 more channels per connection stay free for kills and setup, so a burst of commands queues
here instead of failing with "open failed" on the server. Connections open lazily, one at a time,
with exponential backoff on transient failures; a dead connection is dropped and the next
command opens a new one.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import asyncssh
from pydantic import BaseModel, Field, field_validator

from ..errors import ExecutorError, UsageError
from ..settings import Settings

logger = logging.getLogger(__name__)

KEEPALIVE_INTERVAL_S = 20
KEEPALIVE_COUNT_MAX = 3
CHANNELS_PER_CONNECTION = 8
SPARE_CHANNELS = 2  # kills and setup commands; 8 + 2 = OpenSSH's default MaxSessions
ACCEPT_FLAG = "accept_new_host_key (HARNESSLAB_ACCEPT_NEW_HOST_KEY=1)"


def _default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def _default_ssh_config() -> Path | None:
    path = Path.home() / ".ssh" / "config"
    return path if path.is_file() else None


class SSHTarget(BaseModel):
    """One SSH destination: a host name or ~/.ssh/config alias plus how to log in."""

    host: str = Field(description="Host name, address or ~/.ssh/config alias.")
    port: int | None = Field(default=None, ge=1, le=65535, description="None: ssh config, 22.")
    user: str | None = Field(default=None, description="None: ssh config, then the local user.")
    key: Path | None = Field(default=None, description="Private key; None: config/agent/defaults.")
    known_hosts: Path = Field(
        default_factory=_default_known_hosts, description="known_hosts file, always checked."
    )
    accept_new_host_key: bool = Field(
        default=False,
        description="Trust an UNKNOWN host key on first connect and append it to known_hosts "
        "(a changed key is never accepted).",
    )
    remote_root: str = Field(
        default="~/.cache/harnesslab", description="Folder on the host for synced trees and runs."
    )
    jump: str | None = Field(
        default=None, description="Jump host as [user@]host[:port], logged into with the same key."
    )
    ssh_config: Path | None = Field(
        default_factory=_default_ssh_config,
        description="OpenSSH client config for aliases, ProxyJump, IdentityFile; None: ignore.",
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, description="TCP + handshake + auth.")

    @field_validator("key", "known_hosts", "ssh_config")
    @classmethod
    def _expand_user(cls, path: Path | None) -> Path | None:
        return path.expanduser() if path is not None else None

    @property
    def label(self) -> str:
        """How results name this host: user@host:port as given."""
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port else ""
        return f"{user}{host}{port}"

    @classmethod
    def parse(cls, spec: str, **fields: object) -> SSHTarget:
        """`[user@]host[:port]` (IPv6 as `[addr]:port`) or an alias; `fields` fill the rest.

        User and port written in `spec` win over the same keys in `fields`."""
        spec = spec.strip()
        if not spec:
            raise UsageError("empty SSH host", next_step="give user@host[:port] or an alias")
        user, _, hostport = spec.rpartition("@")
        port: int | None = None
        if hostport.startswith("["):
            host, _, rest = hostport[1:].partition("]")
            if rest:
                port = _port(rest.removeprefix(":"), spec)
        elif hostport.count(":") == 1:
            host, _, port_text = hostport.partition(":")
            port = _port(port_text, spec)
        else:
            host = hostport
        if not host:
            raise UsageError(f"no host in {spec!r}", next_step="write it as user@host[:port]")
        values = {k: v for k, v in fields.items() if v is not None}
        if user:
            values["user"] = user
        if port is not None:
            values["port"] = port
        return cls.model_validate({**values, "host": host})


def _port(text: str, spec: str) -> int:
    if not text.isdigit():
        raise UsageError(f"bad port in {spec!r}", next_step="write it as user@host:22")
    return int(text)


def targets_from_settings(settings: Settings) -> list[SSHTarget]:
    """One target per comma-separated entry of settings.gpu_host (empty: none)."""
    common: dict[str, object] = {
        "port": settings.ssh_port,
        "user": settings.ssh_user,
        "key": settings.ssh_key,
        "known_hosts": settings.known_hosts,
        "accept_new_host_key": settings.accept_new_host_key,
        "remote_root": settings.remote_root,
    }
    return [SSHTarget.parse(s, **common) for s in settings.gpu_host.split(",") if s.strip()]


class _HostKeyGate(asyncssh.SSHClient):
    """Checks the server key against known_hosts; on request, records an unknown one.

    asyncssh asks `validate_host_public_key` only for a key that known_hosts does not trust.
    The gate accepts it only when the flag is set and known_hosts has NO key for that host: a
    changed key is refused whatever the flag says."""

    def __init__(self, target: SSHTarget) -> None:
        self.target = target
        self.verdict = ""  # "unknown", "changed" or "accepted" once a key was questioned

    def lookup(self, host: str, addr: str, port: int | None) -> tuple[list, list, list]:
        path = self.target.known_hosts
        if not path.is_file():
            return [], [], []
        found = asyncssh.read_known_hosts(str(path)).match(host, addr, port)
        return list(found[0]), list(found[1]), list(found[2])

    def validate_host_public_key(self, host: str, addr: str, port: int, key) -> bool:
        trusted, cas, _revoked = self.lookup(host, addr, None if port == 22 else port)
        if trusted or cas:
            self.verdict = "changed"
            return False
        if not self.target.accept_new_host_key:
            self.verdict = "unknown"
            return False
        pattern = host if port == 22 else f"[{host}]:{port}"
        algorithm, blob = key.export_public_key("openssh").decode().split()[:2]
        path = self.target.known_hosts
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"{pattern} {algorithm} {blob}\n")
        logger.warning(
            "accepted NEW host key for %s: %s %s, appended to %s (accept_new_host_key is set)",
            pattern,
            algorithm,
            key.get_fingerprint(),
            path,
        )
        self.verdict = "accepted"
        return True


_TRANSIENT = (ConnectionRefusedError, ConnectionResetError, asyncssh.ConnectionLost)


def classify_connect_error(exc: BaseException, target: SSHTarget, verdict: str) -> ExecutorError:
    """Name a failed connect: host_key, auth or unreachable, each with the fix."""
    where = target.label
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        known = target.known_hosts
        if verdict == "changed":
            return ExecutorError(
                f"host key of {where} CHANGED (it does not match {known}); refusing to connect.",
                kind="host_key",
                started=False,
                next_step=f"if the host was reinstalled, check its new fingerprint, then remove "
                f"the old entry: ssh-keygen -R '{_pattern(target)}' -f {known}",
            )
        return ExecutorError(
            f"host key of {where} is not in {known}.",
            kind="host_key",
            started=False,
            next_step=f"check the host's fingerprint and connect once with {ACCEPT_FLAG} "
            f"(the key is then appended to {known}), or add it with ssh-keyscan",
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        key = target.key or "the keys from ssh config/agent"
        return ExecutorError(
            f"{where} refused the login ({exc.reason}).",
            kind="auth",
            started=False,
            next_step=f"check the user and that {key} is in the host's authorized_keys",
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return ExecutorError(
            f"cannot load the SSH key {target.key}: {exc}",
            kind="auth",
            started=False,
            next_step="give an unencrypted key (HARNESSLAB_SSH_KEY) or load it into ssh-agent",
        )
    if isinstance(exc, socket.gaierror):
        reason = f"name lookup failed ({exc.strerror})"
    elif isinstance(exc, TimeoutError):
        reason = f"no answer within {target.connect_timeout_s:g} s"
    elif isinstance(exc, ConnectionRefusedError):
        reason = "connection refused (is sshd running on that port?)"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return ExecutorError(
        f"cannot reach {where}: {reason}.",
        kind="unreachable",
        started=False,
        next_step="check host, port and network (ssh -v to the same host shows the same path)",
    )


def _pattern(target: SSHTarget) -> str:
    return f"[{target.host}]:{target.port}" if target.port not in (None, 22) else target.host


async def open_connection(
    target: SSHTarget,
) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHClientConnection | None]:
    """One connection to target (through its jump host if any); errors are ExecutorErrors."""
    if target.key is not None and not target.key.is_file():
        raise ExecutorError(
            f"SSH key {target.key} does not exist.",
            kind="auth",
            started=False,
            next_step="point HARNESSLAB_SSH_KEY (or --ssh-key) at the private key",
        )
    jump = None
    if target.jump:
        hop = SSHTarget.parse(target.jump, **target.model_dump(exclude={"host", "port", "user"}))
        hop = hop.model_copy(update={"jump": None})
        jump, _ = await open_connection(hop)
    gate = _HostKeyGate(target)
    try:
        conn = await asyncssh.connect(
            target.host,
            port=target.port if target.port is not None else (),
            username=target.user if target.user is not None else (),
            client_keys=[str(target.key)] if target.key is not None else (),
            known_hosts=gate.lookup,
            config=[str(target.ssh_config)] if target.ssh_config else None,
            tunnel=jump if jump is not None else (),
            client_factory=lambda: gate,
            keepalive_interval=KEEPALIVE_INTERVAL_S,
            keepalive_count_max=KEEPALIVE_COUNT_MAX,
            connect_timeout=target.connect_timeout_s,
        )
    except (OSError, asyncssh.Error, asyncssh.KeyImportError) as exc:
        if jump is not None:
            jump.close()
        raise classify_connect_error(exc, target, gate.verdict) from exc
    except BaseException:
        if jump is not None:
            jump.close()
        raise
    return conn, jump


@dataclass(eq=False)
class PooledConnection:
    """One live connection and how many command channels it carries now."""

    conn: asyncssh.SSHClientConnection
    jump: asyncssh.SSHClientConnection | None = None
    active: int = 0
    spare: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(SPARE_CHANNELS))

    @property
    def closed(self) -> bool:
        return self.conn.is_closed()

    def close(self) -> None:
        self.conn.close()
        if self.jump is not None:
            self.jump.close()


class ConnectionPool:
    """Up to `max_connections` connections to one target, `channels_per_connection` each.

    `on_connect` runs once on every new connection before any command uses it (the executor
    resolves ~ there and reaps process groups orphaned by a dropped connection)."""

    def __init__(
        self,
        target: SSHTarget,
        *,
        max_connections: int = 2,
        channels_per_connection: int = CHANNELS_PER_CONNECTION,
        connect_attempts: int = 3,
        backoff_s: float = 0.25,
        on_connect: Callable[[PooledConnection], Awaitable[None]] | None = None,
    ) -> None:
        if max_connections < 1 or channels_per_connection < 1:
            raise UsageError("the pool needs at least one connection with one channel")
        self.target = target
        self.max_connections = max_connections
        self.channels_per_connection = channels_per_connection
        self.connect_attempts = connect_attempts
        self.backoff_s = backoff_s
        self.on_connect = on_connect
        self.peak_channels = 0  # most command channels ever open at once on one connection
        self.connects = 0  # connections opened so far (a reconnect counts)
        self._slots = anyio.Semaphore(max_connections * channels_per_connection)
        self._lock = anyio.Lock()
        self._entries: list[PooledConnection] = []
        self._closed = False

    @asynccontextmanager
    async def channel(self) -> AsyncIterator[PooledConnection]:
        """Hold one command slot on the least busy live connection (opened if needed)."""
        async with self._slots:
            entry = await self._pick(busy_ok=False)
            entry.active += 1
            self.peak_channels = max(self.peak_channels, entry.active)
            try:
                yield entry
            finally:
                entry.active -= 1

    async def connection(self) -> PooledConnection:
        """A live connection, however busy (opened if there is none)."""
        return await self._pick(busy_ok=True)

    async def _pick(self, *, busy_ok: bool) -> PooledConnection:
        async with self._lock:
            if self._closed:
                raise ExecutorError(
                    f"the connection pool for {self.target.label} is closed.",
                    kind="cancelled",
                    started=False,
                )
            for dead in [e for e in self._entries if e.closed]:
                logger.info("ssh %s: dropping a closed connection", self.target.label)
                dead.close()
                self._entries.remove(dead)
            free = [e for e in self._entries if busy_ok or e.active < self.channels_per_connection]
            if free:
                return min(free, key=lambda e: e.active)
            # Connections open one at a time (under the lock): a burst of commands against a
            # fresh host staggers its handshakes instead of tripping sshd's MaxStartups.
            entry = await self._connect()
            if self.on_connect is not None:
                try:
                    await self.on_connect(entry)
                except BaseException:
                    entry.close()
                    raise
            self._entries.append(entry)
            return entry

    async def _connect(self) -> PooledConnection:
        delay = self.backoff_s
        for attempt in range(1, self.connect_attempts + 1):
            try:
                conn, jump = await open_connection(self.target)
            except ExecutorError as exc:
                cause = exc.__cause__
                if attempt == self.connect_attempts or not isinstance(cause, _TRANSIENT):
                    raise
                logger.info("ssh %s: %s; retrying in %.2f s", self.target.label, exc, delay)
                await anyio.sleep(delay)
                delay *= 2
            else:
                self.connects += 1
                return PooledConnection(conn=conn, jump=jump)
        raise AssertionError("unreachable")  # pragma: no cover

    def live(self) -> list[PooledConnection]:
        return [e for e in self._entries if not e.closed]

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            entries, self._entries = self._entries, []
        for entry in entries:
            entry.close()
        with anyio.move_on_after(5, shield=True):
            for entry in entries:
                await entry.conn.wait_closed()


__all__ = [
    "ConnectionPool",
    "PooledConnection",
    "SSHTarget",
    "classify_connect_error",
    "open_connection",
    "targets_from_settings",
]

"""A real SSH server on loopback, in process, for tests and for end-to-end runs on a GPU host.

`serve_loopback(workdir)` listens on 127.0.0.1 with a fresh host key and accepts one fresh client
key (both written under workdir, with a known_hosts file for the client). Exec channels run their
command as `sh -c COMMAND` in a real subprocess in a new session, like sshd: stdin, stdout,
stderr and the exit status are passed through, process groups are real, and a closed channel
does not signal the command. It runs as whoever starts it, root included.

    python -m harnesslab.tests.ssh_testserver /tmp/hl-ssh [PORT]
    # prints {"host", "port", "user", "client_key", "known_hosts"} as JSON, serves until
    # SIGINT/SIGTERM, then kills the commands it started
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import asyncssh
from anyio.abc import Process

from harnesslab.tools.execution.ssh_pool import SSHTarget


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: LoopbackServer) -> None:
        self.owner = owner
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.owner.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.owner.connections.discard(self.conn)


@dataclass(eq=False)
class LoopbackServer:
    """A running loopback SSH server and what a client needs to log in."""

    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    connections: set[asyncssh.SSHServerConnection] = field(default_factory=set)
    processes: set[Process] = field(default_factory=set)
    acceptor: asyncssh.SSHAcceptor | None = None

    def target(self, **fields: object) -> SSHTarget:
        """An SSHTarget for this server (ssh config ignored); `fields` override."""
        values: dict[str, object] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key": self.client_key,
            "known_hosts": self.known_hosts,
            "ssh_config": None,
        }
        return SSHTarget.model_validate({**values, **fields})

    def drop_connections(self) -> None:
        """Cut every client connection at once, as a network failure would.

        Commands keep running (as under sshd, whose child would simply lose its client)."""
        for conn in list(self.connections):
            conn.abort()

    async def aclose(self) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
            await self.acceptor.wait_closed()
        self.drop_connections()
        for process in list(self.processes):  # no test leaves commands behind on this host
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def __aenter__(self) -> LoopbackServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        if not process.command:
            process.stderr.write(b"only exec channels are served here\n")
            process.exit(1)
            return
        try:
            child = await anyio.open_process(
                ["/bin/sh", "-c", process.command], start_new_session=True
            )
        except OSError as exc:
            process.stderr.write(f"cannot start /bin/sh: {exc}\n".encode())
            process.exit(127)
            return
        self.processes.add(child)
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, process.stdin, child.stdin)
                async with anyio.create_task_group() as outputs:
                    outputs.start_soon(_copy, child.stdout, process.stdout)
                    outputs.start_soon(_copy, child.stderr, process.stderr)
                code = await child.wait()
                tg.cancel_scope.cancel()
            process.exit(code if code >= 0 else 128 - code)
        except (OSError, asyncssh.Error):
            pass  # the client went away; the command runs on, as under sshd
        finally:
            if child.returncode is not None:
                self.processes.discard(child)


async def _feed(source: asyncssh.SSHReader, sink) -> None:
    try:
        while data := await source.read(1 << 16):
            await sink.send(data)
    except (OSError, asyncssh.Error, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        await sink.aclose()


async def _copy(source, sink: asyncssh.SSHWriter) -> None:
    writable = True
    async for data in source:
        if writable:
            try:
                sink.write(data)
                await sink.drain()
            except (OSError, asyncssh.Error):
                writable = False  # keep reading so the command never blocks on a full pipe


async def serve_loopback(
    workdir: Path, *, host: str = "127.0.0.1", port: int = 0
) -> LoopbackServer:
    """Start the server; keys and known_hosts go under workdir. `async with` it or aclose()."""
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key.write_private_key(str(workdir / "client_key"))
    (workdir / "client_key").chmod(0o600)
    client_key.write_public_key(str(workdir / "authorized_keys"))
    server = LoopbackServer(
        host=host,
        port=0,
        user=_login_name(),
        client_key=workdir / "client_key",
        known_hosts=workdir / "known_hosts",
    )
    server.acceptor = await asyncssh.create_server(
        lambda: _Server(server),
        host,
        port,
        server_host_keys=[host_key],
        authorized_client_keys=str(workdir / "authorized_keys"),
        process_factory=server._handle,
        encoding=None,
        keepalive_interval=20,
        keepalive_count_max=3,
    )
    server.port = server.acceptor.get_port()
    public = host_key.export_public_key("openssh").decode().split()[:2]
    server.known_hosts.write_text(f"[{host}]:{server.port} {' '.join(public)}\n")
    return server


def _login_name() -> str:
    import getpass

    return getpass.getuser()


async def _serve_forever(workdir: Path, port: int) -> None:
    async with await serve_loopback(workdir, port=port) as server:
        info = {
            "host": server.host,
            "port": server.port,
            "user": server.user,
            "client_key": str(server.client_key),
            "known_hosts": str(server.known_hosts),
        }
        print(json.dumps(info), flush=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break  # leaving the block closes the server and kills its commands


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m harnesslab.tests.ssh_testserver WORKDIR [PORT]", file=sys.stderr)
        return 2
    anyio.run(_serve_forever, Path(args[0]), int(args[1]) if len(args) > 1 else 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["LoopbackServer", "serve_loopback"]

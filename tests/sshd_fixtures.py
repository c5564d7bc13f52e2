"""SSH servers for tests: a real OpenSSH sshd on 127.0.0.1 and the in-process asyncssh server.

`start_sshd(workdir)` runs `/usr/sbin/sshd -D -e` with a throwaway host key, `UsePAM no`, the
default MaxSessions (10, written out) and one authorized client key. Under root it logs in as
the unprivileged user `hltest` (created when missing); otherwise as the current user. Tests that
cannot have it (no sshd, no useradd) are skipped with the reason.

Fixtures: `openssh_server` (one per module), `ssh_host` (each test twice: OpenSSH and asyncssh).
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harnesslab.tests.ssh_testserver import LoopbackServer, serve_loopback
from harnesslab.tools.execution.ssh_pool import SSHTarget

SSHD = Path("/usr/sbin/sshd")
TEST_USER = "hltest"
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(eq=False)
class SshdServer:
    """A running OpenSSH sshd and what a client needs to log in."""

    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_key: Path
    workdir: Path
    remote_dir: Path  # writable by `user`
    process: subprocess.Popen

    def target(self, **fields: object) -> SSHTarget:
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
        """Kill the sshd processes serving connections (not the listener, not the commands)."""
        table = subprocess.run(
            ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
        ).stdout
        children: dict[int, list[tuple[int, str]]] = {}
        for line in table.splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3:
                children.setdefault(int(parts[1]), []).append((int(parts[0]), parts[2]))
        todo, victims = [self.process.pid], []
        while todo:
            for pid, args in children.get(todo.pop(), []):
                if args.startswith("sshd:"):
                    victims.append(pid)
                    todo.append(pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.drop_connections()
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


def _login_user() -> str:
    """The unprivileged account sshd lets the tests in as; skips when there can be none."""
    if os.geteuid() != 0:
        return getpass.getuser()  # an unprivileged sshd can only log in its own user
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip(f"running as root, no user {TEST_USER!r} and no useradd to create it")
        done = subprocess.run(
            ["useradd", "-m", "-s", "/bin/sh", TEST_USER], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot create user {TEST_USER!r}: {done.stderr.strip()}")
    # With UsePAM no, sshd refuses accounts whose password is locked ("!"); "*" only means
    # "no password", which key logins do not need.
    shadow = subprocess.run(["getent", "shadow", TEST_USER], capture_output=True, text=True)
    if shadow.stdout.split(":")[1:2] and shadow.stdout.split(":")[1].startswith("!"):
        subprocess.run(["usermod", "-p", "*", TEST_USER], check=True, capture_output=True)
    return TEST_USER


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "harnesslab-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def start_sshd(workdir: Path | None = None) -> SshdServer:
    """Start an sshd on a free loopback port; skips the test when that is impossible."""
    if not SSHD.is_file() or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    user = _login_user()
    workdir = Path(tempfile.mkdtemp(prefix="hl-sshd-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # sshd reads authorized_keys as the login user
    _keygen(workdir / "host_ed25519")
    _keygen(workdir / "client_key")
    shutil.copy(workdir / "client_key.pub", workdir / "authorized_keys")
    (workdir / "authorized_keys").chmod(0o644)
    remote_dir = workdir / "remote"
    remote_dir.mkdir()
    entry = pwd.getpwnam(user)
    os.chown(remote_dir, entry.pw_uid, entry.pw_gid)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {workdir}/host_ed25519\n"
        f"PidFile {workdir}/sshd.pid\nAuthorizedKeysFile {workdir}/authorized_keys\n"
        "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nMaxSessions 10\nMaxStartups 100\nAllowTcpForwarding yes\n"
        f"AllowUsers {user}\nLogLevel VERBOSE\n"
    )
    public = (workdir / "host_ed25519.pub").read_text().split()[:2]
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(public)}\n")
    log = (workdir / "sshd.log").open("wb")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {(workdir / 'sshd.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"sshd did not listen within {START_TIMEOUT_S} s") from None
            time.sleep(0.05)  # polling a bounded wait for the listener
    return SshdServer(
        host="127.0.0.1",
        port=port,
        user=user,
        client_key=workdir / "client_key",
        known_hosts=known_hosts,
        host_key=workdir / "host_ed25519",
        workdir=workdir,
        remote_dir=remote_dir,
        process=process,
    )


@dataclass(eq=False)
class SSHHost:
    """One of the two test servers, with a fresh remote_root for each executor."""

    kind: str  # "openssh" or "asyncssh"
    server: SshdServer | LoopbackServer
    remote_dir: Path

    def target(self, **fields: object) -> SSHTarget:
        fields.setdefault("remote_root", str(self.remote_dir / uuid.uuid4().hex[:12]))
        return self.server.target(**fields)

    def drop_connections(self) -> None:
        self.server.drop_connections()


@pytest.fixture(scope="module")
def openssh_server() -> Iterator[SshdServer]:
    server = start_sshd()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(params=["openssh", "asyncssh"])
async def ssh_host(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SSHHost]:
    if request.param == "openssh":
        server = request.getfixturevalue("openssh_server")
        yield SSHHost("openssh", server, server.remote_dir)
        return
    async with await serve_loopback(tmp_path / "loopback") as loopback:
        yield SSHHost("asyncssh", loopback, tmp_path)


SSH_FIXTURES = frozenset({"openssh_server", "ssh_host"})

__all__ = [
    "SSH_FIXTURES",
    "SSHHost",
    "SshdServer",
    "free_port",
    "openssh_server",
    "ssh_host",
    "start_sshd",
]

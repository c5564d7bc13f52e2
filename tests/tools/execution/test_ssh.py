"""The SSH executor against a real OpenSSH sshd and the in-process asyncssh server: what only
SSH has (targets, connection pool, host keys, reconnects, sync deletions); what every backend
does is in test_executor_contract.py.

Remote and local are the same machine here, so tests check remote effects (files, processes)
directly. Every wait is bounded; process checks ignore zombies (a container's init may never
reap them)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import asyncssh
import pytest

from harnesslab.tests.ssh_testserver import serve_loopback
from harnesslab.tests.sshd_fixtures import SshdServer, SSHHost, free_port
from harnesslab.tests.tools.execution.procs import SLEEPERS, live_group, read_pgid, wait_until
from harnesslab.tools.errors import ExecutorError, UsageError
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.execution.ssh_pool import SSHTarget, targets_from_settings
from harnesslab.tools.settings import Settings

pytestmark = pytest.mark.ssh


# Writes its process group id to {pgfile}, then leaves two sleepers in that group.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def executor(target: SSHTarget, **options: object) -> AsyncIterator[SSHExecutor]:
    ex = SSHExecutor(target, **options)
    try:
        yield ex
    finally:
        await ex.aclose()


def sleepers(host: SSHHost, name: str) -> tuple[list[str], Path]:
    pgfile = host.remote_dir / f"{name}-{os.getpid()}-{id(host)}.pgid"
    pgfile.unlink(missing_ok=True)
    return ["sh", "-c", SLEEPERS.format(pgfile=pgfile)], pgfile


# -- targets ------------------------------------------------------------------------------


def test_parse_reads_user_host_and_port_and_keeps_aliases() -> None:
    t = SSHTarget.parse("alice@gpu.example.org:2222", user="bob", ssh_config=None)
    assert (t.user, t.host, t.port) == ("alice", "gpu.example.org", 2222)
    alias = SSHTarget.parse("h100", user="bob", port=None, ssh_config=None)
    assert (alias.user, alias.host, alias.port) == ("bob", "h100", None)
    v6 = SSHTarget.parse("root@[fe80::1]:22", ssh_config=None)
    assert (v6.host, v6.port, v6.label) == ("fe80::1", 22, "root@[fe80::1]:22")
    with pytest.raises(UsageError):
        SSHTarget.parse("alice@gpu:notaport")


def test_settings_give_one_target_per_host() -> None:
    settings = Settings(gpu_host="a@h1:2201, h2", ssh_user="u", remote_root="/scratch/hl")
    first, second = targets_from_settings(settings)
    assert (first.user, first.host, first.port, first.remote_root) == (
        "a",
        "h1",
        2201,
        "/scratch/hl",
    )
    assert (second.user, second.host, second.port) == ("u", "h2", None)


# -- commands -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_aclose_kills_commands_still_running(ssh_host: SSHHost) -> None:
    argv, pgfile = sleepers(ssh_host, "aclose")
    ex = SSHExecutor(ssh_host.target())
    errors: list[ExecutorError] = []

    async def victim() -> None:
        try:
            await ex.run(argv, timeout_s=120)
        except ExecutorError as exc:
            errors.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            pgid = await read_pgid(pgfile)
            await ex.aclose()
    assert [e.kind for e in errors] == ["cancelled"]
    await wait_until(lambda: not live_group(pgid), 5)


@pytest.mark.anyio
async def test_sixteen_concurrent_commands_on_one_connection_respect_the_channel_bound(
    ssh_host: SSHHost,
) -> None:
    # sshd_config says MaxSessions 10: 16 channels at once on one connection would be refused.
    async with executor(ssh_host.target(), max_connections=1) as ex:
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            done = await ex.run(["sh", "-c", 'sleep 0.3; echo "$1"', "sh", str(i)], timeout_s=30)
            results[i] = done.stdout

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(one, i)
    assert results == {i: f"{i}\n" for i in range(16)}
    assert ex.pool.connects == 1
    assert ex.pool.peak_channels == 8


@pytest.mark.anyio
async def test_dropped_connection_is_classified_and_the_next_call_reconnects(
    ssh_host: SSHHost,
) -> None:
    argv, pgfile = sleepers(ssh_host, "dropped")
    async with executor(ssh_host.target()) as ex:
        errors: list[ExecutorError] = []

        async def victim() -> None:
            try:
                await ex.run(argv, timeout_s=120)
            except ExecutorError as exc:
                errors.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(victim)
                pgid = await read_pgid(pgfile)
                ssh_host.drop_connections()
        assert [(e.kind, e.started) for e in errors] == [("dropped", True)]
        with anyio.fail_after(20):
            assert (await ex.run(["echo", "back"], timeout_s=10)).stdout == "back\n"
        assert ex.pool.connects == 2
        # the reconnect killed what the lost command left behind
        await wait_until(lambda: not live_group(pgid), 5)


# -- files --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sync_sends_only_changed_files(ssh_host: SSHHost, tmp_path: Path) -> None:
    local = tmp_path / "ws"
    (local / "sub").mkdir(parents=True)
    (local / "kernel.py").write_text("x = 1\n")
    (local / "sub" / "cases.json").write_text("[]\n")
    (local / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (local / "run.sh").chmod(0o755)
    target = ssh_host.target()
    remote = Path(target.remote_root) / "ws"
    async with executor(target) as ex:
        with anyio.fail_after(30):
            first = await ex.sync_tree(local, str(remote))
            again = await ex.sync_tree(local, str(remote))
            (local / "kernel.py").write_text("x = 2\n")
            edited = await ex.sync_tree(local, str(remote))
            (local / "sub" / "cases.json").unlink()
            (remote / "__pycache__").mkdir()
            (remote / "__pycache__" / "k.pyc").write_bytes(b"host-made")
            removed = await ex.sync_tree(local, str(remote))
            (remote / "run.sh").write_text("tampered on the host\n")
            repaired = await ex.sync_tree(local, str(remote))
            ran = await ex.run(["./run.sh"], cwd=str(remote), timeout_s=10)
    assert first == ["kernel.py", "run.sh", "sub/cases.json"]
    assert again == []
    assert edited == ["kernel.py"]
    assert (remote / "kernel.py").read_text() == "x = 2\n"
    assert removed == [] and not (remote / "sub" / "cases.json").exists()
    assert (remote / "__pycache__" / "k.pyc").read_bytes() == b"host-made"
    assert repaired == ["run.sh"] and ran.stdout == "hi\n"


@pytest.mark.anyio
async def test_remote_root_with_tilde_resolves_to_the_login_home(
    openssh_server: SshdServer,
) -> None:
    import pwd
    import shutil

    home = Path(pwd.getpwnam(openssh_server.user).pw_dir)
    name = f".cache/hl-test-{os.getpid()}"
    async with executor(openssh_server.target(remote_root=f"~/{name}")) as ex:
        with anyio.fail_after(20):
            await ex.connect()
        assert ex.path("ws", "kernel.py") == f"{home}/{name}/ws/kernel.py"
    shutil.rmtree(home / name, ignore_errors=True)


# -- connecting: keys and reachability ----------------------------------------------------


@pytest.mark.anyio
async def test_unknown_host_key_is_refused_unless_the_accept_flag_records_it(
    openssh_server: SshdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    async with executor(openssh_server.target(known_hosts=known)) as ex:
        with anyio.fail_after(20), pytest.raises(ExecutorError) as info:
            await ex.run(["true"], timeout_s=10)
    assert info.value.kind == "host_key"
    assert "accept_new_host_key" in info.value.next_step
    assert not known.exists()

    caplog.set_level(logging.WARNING, logger="harnesslab.tools.execution.ssh_pool")
    async with executor(openssh_server.target(known_hosts=known, accept_new_host_key=True)) as ex:
        with anyio.fail_after(20):
            assert (await ex.run(["echo", "ok"], timeout_s=10)).exit_code == 0
    blob = openssh_server.host_key.with_suffix(".pub").read_text().split()[1]
    assert known.read_text().split() == [f"[127.0.0.1]:{openssh_server.port}", "ssh-ed25519", blob]
    assert "accepted NEW host key" in caplog.text

    async with executor(openssh_server.target(known_hosts=known)) as ex:
        with anyio.fail_after(20):
            assert (await ex.run(["true"], timeout_s=10)).exit_code == 0


@pytest.mark.anyio
async def test_changed_host_key_is_refused_even_with_the_accept_flag(tmp_path: Path) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    async with await serve_loopback(tmp_path / "srv") as server:
        stale = f"[127.0.0.1]:{server.port} {' '.join(impostor.split()[:2])}\n"
        server.known_hosts.write_text(stale)
        async with executor(
            server.target(remote_root=str(tmp_path / "r"), accept_new_host_key=True)
        ) as ex:
            with anyio.fail_after(20), pytest.raises(ExecutorError) as info:
                await ex.run(["true"], timeout_s=10)
    assert info.value.kind == "host_key" and "CHANGED" in info.value.message
    assert server.known_hosts.read_text() == stale


@pytest.mark.anyio
async def test_wrong_key_is_an_auth_error(openssh_server: SshdServer, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    async with executor(openssh_server.target(key=stranger)) as ex:
        with anyio.fail_after(20), pytest.raises(ExecutorError) as info:
            await ex.run(["true"], timeout_s=10)
    assert (info.value.kind, info.value.started) == ("auth", False)


@pytest.mark.anyio
async def test_closed_port_is_unreachable(tmp_path: Path) -> None:
    target = SSHTarget(host="127.0.0.1", port=free_port(), ssh_config=None, remote_root="/tmp/x")
    async with executor(target) as ex:
        with anyio.fail_after(20), pytest.raises(ExecutorError) as info:
            await ex.run(["true"], timeout_s=10)
    assert (info.value.kind, info.value.started) == ("unreachable", False)


@pytest.mark.anyio
async def test_ssh_config_alias_and_proxyjump_are_honoured(
    openssh_server: SshdServer, tmp_path: Path
) -> None:
    s = openssh_server
    host = (
        f"  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n  IdentityFile {s.client_key}\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host hl-jump\n{host}  UserKnownHostsFile {s.known_hosts}\n"
        f"Host hl-gpu\n{host}  ProxyJump hl-jump\n"
    )
    target = SSHTarget(
        host="hl-gpu", ssh_config=config, known_hosts=s.known_hosts, remote_root=str(s.remote_dir)
    )
    async with executor(target) as ex:
        with anyio.fail_after(20):
            done = await ex.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout_s=10)
    assert done.exit_code == 0 and done.stdout.split()[2] == "127.0.0.1"


@pytest.mark.anyio
async def test_explicit_jump_host_carries_the_connection(openssh_server: SshdServer) -> None:
    s = openssh_server
    target = s.target(jump=f"{s.user}@127.0.0.1:{s.port}", remote_root=str(s.remote_dir))
    async with executor(target) as ex:
        with anyio.fail_after(20):
            assert (await ex.run(["echo", "via"], timeout_s=10)).stdout == "via\n"
        assert all(entry.jump is not None for entry in ex.pool.live())


# -- health -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_health_of_an_unreachable_host_comes_back_classified() -> None:
    target = SSHTarget(host="127.0.0.1", port=free_port(), ssh_config=None, remote_root="/tmp/x")
    async with executor(target) as ex:
        with anyio.fail_after(20):
            report = await ex.health(python="python3")
    assert not report.reachable and report.error_kind == "unreachable"
    assert report.problems[0].next_step

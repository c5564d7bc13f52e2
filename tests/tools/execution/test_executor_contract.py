"""The executor contract: what every backend (tools/execution/backends.py) does, the same way.

Run over the local executor, the SSH executor against a real OpenSSH sshd and the in-process
asyncssh server, and the Slurm executor on a real one-node Slurm cluster started on this machine
(tests/slurm_cluster.py), its login node reached directly or over SSH. A new backend joins by
adding its fixture parameter here.
Remote and local are the same machine in these tests, so they check effects (files, processes)
directly. Every wait is bounded; process checks ignore zombies."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import pytest

from harnesslab.tests.slurm_cluster import slurm_settings
from harnesslab.tests.ssh_testserver import serve_loopback
from harnesslab.tests.tools.execution.procs import SLEEPERS, live_group, read_pgid, wait_until
from harnesslab.tools.errors import ExecutorError, UsageError
from harnesslab.tools.execution.backends import BACKENDS, build_executors, register_backend
from harnesslab.tools.execution.executor import Executor, LocalExecutor
from harnesslab.tools.execution.slurm import SlurmExecutor
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.settings import Settings


# Writes its process group id to {pgfile}, then leaves two sleepers in that group.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Backend:
    kind: str
    executor: Executor
    scratch: Path  # a folder both this test and the executor's commands see


@pytest.fixture(
    params=[
        "local",
        pytest.param("openssh", marks=pytest.mark.ssh),
        "asyncssh",
        pytest.param("slurm", marks=pytest.mark.slurm),
        pytest.param("slurm-over-ssh", marks=pytest.mark.slurm),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "local":
        ex: Executor = LocalExecutor(tmp_path / "root")
        try:
            yield Backend("local", ex, tmp_path)
        finally:
            await ex.aclose()
        return
    if request.param == "openssh":
        server = request.getfixturevalue("openssh_server")
        # sshd logs in an unprivileged user (when the tests run as root): its folder, not ours.
        scratch = server.remote_dir / uuid.uuid4().hex[:12]
        ex = SSHExecutor(server.target(remote_root=str(scratch / "root")))
        try:
            await ex.run(["mkdir", "-p", str(scratch)], timeout_s=30)
            yield Backend("openssh", ex, scratch)
        finally:
            await ex.aclose()
        return
    if request.param == "slurm":
        # Steps run on this machine's slurmd, whose node is this machine: the login executor
        # is the local one, and the scratch folder is the same for the test and the steps.
        cluster = request.getfixturevalue("slurm_cluster")
        settings = slurm_settings(cluster, tmp_path / "state")
        ex = SlurmExecutor(LocalExecutor(tmp_path / "root"), settings)
        try:
            yield Backend("slurm", ex, tmp_path)
        finally:
            await ex.aclose()
        return
    async with await serve_loopback(tmp_path / "loopback") as loopback:
        ex = SSHExecutor(loopback.target(remote_root=str(tmp_path / "root")))
        if request.param == "slurm-over-ssh":  # the login node reached over SSH
            cluster = request.getfixturevalue("slurm_cluster")
            ex = SlurmExecutor(ex, slurm_settings(cluster, tmp_path / "state"))
        try:
            yield Backend(request.param, ex, tmp_path)
        finally:
            await ex.aclose()


def sleepers(b: Backend, name: str) -> tuple[list[str], Path]:
    pgfile = b.scratch / f"{name}-{os.getpid()}.pgid"
    pgfile.unlink(missing_ok=True)
    return ["sh", "-c", SLEEPERS.format(pgfile=pgfile)], pgfile


@pytest.mark.anyio
async def test_run_returns_output_exit_code_and_passes_stdin_cwd_env(backend: Backend) -> None:
    ex = backend.executor
    with anyio.fail_after(20):
        await ex.connect()
        done = await ex.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
        fed = await ex.run(
            ["sh", "-c", 'cat; pwd; echo "$HL_X"'],
            cwd="/tmp",
            env={"HL_X": "it's x"},
            stdin=b"in\n",
            timeout_s=10,
        )
    assert (done.exit_code, done.stdout, done.stderr, done.timed_out) == (
        3,
        "out\n",
        "err\n",
        False,
    )
    assert done.host == ex.host
    assert fed.stdout == "in\n/tmp\nit's x\n"


@pytest.mark.anyio
async def test_run_streams_stdout_lines_to_on_line(backend: Backend) -> None:
    lines: list[str] = []
    with anyio.fail_after(20):
        done = await backend.executor.run(
            ["printf", "a\\nb\\nc"], timeout_s=10, on_line=lines.append
        )
    assert lines == ["a", "b", "c"] and done.stdout == "a\nb\nc"


@pytest.mark.anyio
async def test_started_process_talks_in_lines_and_kill_ends_its_group(backend: Backend) -> None:
    pgfile = backend.scratch / f"worker-{os.getpid()}.pgid"
    log = backend.scratch / f"worker-{os.getpid()}.log"
    script = (
        f"ps -o pgid= -p $$ > {pgfile}; echo ready; echo to-log >&2; sleep 300 &\n"
        'while read -r line; do echo "got $line"; [ "$line" = quit ] && exit 3; done'
    )
    ex = backend.executor
    with anyio.fail_after(20):
        worker = await ex.start(["sh", "-c", script], stderr_path=str(log))
        assert await worker.receive_line() == "ready"
        await worker.send_line("one")
        assert await worker.receive_line() == "got one"
        pgid = await read_pgid(pgfile)
        if isinstance(ex, SSHExecutor):
            assert ex.pool.live()[0].active == 1  # a worker holds one command channel
        await worker.kill()
        await worker.kill()  # twice is fine
        await wait_until(lambda: not live_group(pgid), 5)
        if isinstance(ex, SSHExecutor):
            assert ex.pool.live()[0].active == 0
        assert log.read_text() == "to-log\n"
        # No background child here: on the local backend one that holds stdout would keep the
        # stream open after the leader exits (the SSH wrapper kills the group at that point).
        crashing = await ex.start(["sh", "-c", script.replace("sleep 300 &", "")])
        assert await crashing.receive_line() == "ready"
        await crashing.send_line("quit")
        assert await crashing.receive_line() == "got quit"
        assert await crashing.receive_line() is None  # it died: end of stream
        await crashing.kill()


@pytest.mark.anyio
async def test_missing_program_or_cwd_is_a_remote_env_error_that_never_started(
    backend: Backend,
) -> None:
    ex = backend.executor
    with anyio.fail_after(20):
        with pytest.raises(ExecutorError) as program:
            await ex.run(["hl-no-such-program"], timeout_s=10)
        with pytest.raises(ExecutorError) as cwd:
            await ex.run(["true"], cwd="/hl-no-such-dir", timeout_s=10)
    assert (program.value.kind, program.value.started) == ("remote_env", False)
    assert (cwd.value.kind, cwd.value.started) == ("remote_env", False)


@pytest.mark.anyio
async def test_timeout_kills_the_process_group(backend: Backend) -> None:
    argv, pgfile = sleepers(backend, "timeout")
    with anyio.fail_after(20):
        result = await backend.executor.run(argv, timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    pgid = int(pgfile.read_text())
    await wait_until(lambda: not live_group(pgid), 5)


@pytest.mark.anyio
async def test_cancel_kills_the_process_group_and_the_executor_stays_usable(
    backend: Backend,
) -> None:
    argv, pgfile = sleepers(backend, "cancel")
    ex = backend.executor
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(ex.run, argv, timeout_s=120))
            pgid = await read_pgid(pgfile)
            assert live_group(pgid)
            tg.cancel_scope.cancel()
    await wait_until(lambda: not live_group(pgid), 5)
    with anyio.fail_after(10):
        assert (await ex.run(["echo", "ok"], timeout_s=10)).stdout == "ok\n"


@pytest.mark.anyio
async def test_sync_sends_only_changed_files(backend: Backend) -> None:
    local = backend.scratch / "ws"
    (local / "sub").mkdir(parents=True)
    (local / "kernel.py").write_text("x = 1\n")
    (local / "sub" / "cases.json").write_text("[]\n")
    ex = backend.executor
    with anyio.fail_after(30):
        await ex.connect()
        remote = ex.path("ws")
        first = await ex.sync_tree(local, remote)
        again = await ex.sync_tree(local, remote)
        (local / "kernel.py").write_text("x = 2\n")
        edited = await ex.sync_tree(local, remote)
        ran = await ex.run(["cat", "kernel.py"], cwd=remote, timeout_s=10)
    assert first == ["kernel.py", "sub/cases.json"] and again == [] and edited == ["kernel.py"]
    assert ran.stdout == "x = 2\n"


@pytest.mark.anyio
async def test_sync_leaves_the_hosts_own_folders_alone_and_keeps_working_around_them(
    backend: Backend,
) -> None:
    local = backend.scratch / "stage"
    (local / "tcache").mkdir(parents=True)
    (local / "kernel.py").write_text("x = 1\n")
    (local / "tcache" / "local-only.bin").write_text("never sent\n")
    ex = backend.executor
    with anyio.fail_after(30):
        await ex.connect()
        remote = ex.path("stage2")
        first = await ex.sync_tree(local, remote, skip=("tcache",))
        # the host fills its cache folder; the next sync neither lists nor touches it
        await ex.run(["sh", "-c", "mkdir -p tcache && echo host > tcache/k.bin"], cwd=remote,
                     timeout_s=10)  # fmt: skip
        again = await ex.sync_tree(local, remote, skip=("tcache",))
        ran = await ex.run(["sh", "-c", "ls tcache; cat kernel.py"], cwd=remote, timeout_s=10)
    assert first == ["kernel.py"] and again == []
    assert ran.stdout == "k.bin\nx = 1\n"


@pytest.mark.anyio
async def test_health_reports_a_python_without_torch_classified(backend: Backend) -> None:
    python = backend.scratch / "python-without-site"
    python.write_text('#!/bin/sh\nexec python3 -S "$@"\n')  # -S: no site-packages, no torch
    python.chmod(0o755)
    with anyio.fail_after(60):
        report = await backend.executor.health(python=str(python))
    assert report.reachable and report.latency_ms is not None and report.latency_ms > 0
    assert report.python_version and report.torch_version is None
    assert report.disk_free_gb is not None and report.disk_free_gb > 0
    torch = [p for p in report.problems if "torch" in p.message]
    assert torch and torch[0].kind == "remote_env" and torch[0].next_step
    assert report.nvidia_smi or report.gpus == []
    assert not report.ok and report.error_kind == "remote_env"


def test_the_backend_registry_builds_local_or_ssh_from_the_settings(tmp_path: Path) -> None:
    (local,) = build_executors(Settings(state_dir=tmp_path))
    assert local.on_this_machine and local.python(Settings(python="py")) == "py"
    hosts = build_executors(Settings(state_dir=tmp_path, gpu_host="a@h1,b@h2"))
    assert [type(e) for e in hosts] == [SSHExecutor, SSHExecutor]
    assert not hosts[0].on_this_machine and hosts[0].python(Settings(remote_python="rp")) == "rp"
    with pytest.raises(UsageError, match="no executor backend 'nope'"):
        build_executors(Settings(state_dir=tmp_path, executor="nope"))


def test_a_registered_backend_is_chosen_by_name(tmp_path: Path) -> None:
    made: list[Executor] = [LocalExecutor(tmp_path)]
    register_backend("contract-test", lambda settings: made)
    try:
        assert build_executors(Settings(state_dir=tmp_path, executor="contract-test")) is made
    finally:
        BACKENDS.pop("contract-test")

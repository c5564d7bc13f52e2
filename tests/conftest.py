"""Shared fixtures: the SSH test servers (tests/sshd_fixtures.py) and the Slurm test cluster
(tests/slurm_cluster.py), and the `ssh` and `slurm` markers applied to every test that uses one,
so `-m "not ssh"` or `-m "not slurm"` deselects them.

Under pytest-xdist (`make test-fast`, CI's `-n 2`) every worker is a session of its own: state
lives under tmp_path, servers take free ports, and each worker's Slurm test cluster has its own
ports, daemons and job ids. What tests share beyond that carries an `xdist_group` marker, and no
two tests of one group run at once (`_one_group_test_at_a_time`): the Slurm tests (one cluster
at work at a time, as in a serial run: their daemons' timeouts are seconds) and each cheat that
leaves traces outside its tmp_path (tests/tools/integrity/test_cheats.py)."""

from __future__ import annotations

import fcntl
import gc
import os
from collections.abc import Iterator

import pytest

from harnesslab.tests.slurm_cluster import SLURM_FIXTURES, slurm_cluster
from harnesslab.tests.sshd_fixtures import SSH_FIXTURES, openssh_server, ssh_host

__all__ = ["openssh_server", "slurm_cluster", "ssh_host"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SSH_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)
        if SLURM_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.xdist_group("slurm_cluster"))


@pytest.fixture(autouse=True)
def _one_group_test_at_a_time(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test with an `xdist_group` marker holds that group's lock, shared by the workers of
    this run, while it runs. `--dist loadgroup` would send a group to
    one worker, but with pytest >= 9.2 it silently stops grouping (pytest-xdist issue 1386:
    it still renames the node id the old way), so the lock is what keeps a group serial."""
    marker = request.node.get_closest_marker("xdist_group")
    if marker is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    name = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
    lock = tmp_path_factory.getbasetemp().parent / f"xdist_group_{name}.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def pytest_collection_finish(session: pytest.Session) -> None:
    """What lives all session (torch, triton, the toolkit, the collected tests) moves to the
    collector's permanent generation once, after collection: each test file's collection below,
    and every automatic one, then walks only what the tests made (0.26 s -> 0.07 s a file with
    torch loaded, measured over tests/tools/gpu's 52 files). Nothing a test makes is frozen."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module():
    """Collect at the end of each test file, so an object a test leaked (an asyncio subprocess
    transport whose loop is closed) fails in the file that leaked it, not whenever the
    collector happens to run (inside ast.parse it turned into 'AST constructor recursion depth
    mismatch' in an unrelated test)."""
    yield
    gc.collect()

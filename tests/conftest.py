"""Shared fixtures: the SSH test servers (tests/sshd_fixtures.py) and the Slurm test cluster
(tests/slurm_cluster.py), and the `ssh` and `slurm` markers applied to every test that uses one,
so `-m "not ssh"` or `-m "not slurm"` deselects them.

Under pytest-xdist (`make test-fast`, CI's `-n 2 --dist loadgroup`) every worker is its own
session. The Slurm tests share one xdist group, so one worker starts the one test cluster and runs
them in turn (two clusters on one node would share its job ids, and `Cluster.kill_slurmd` kills
by job id). Everything else that tests share is per-process already: free ports, tmp_path,
state dirs under tmp_path."""

from __future__ import annotations

import gc

import pytest

from harnesslab.tests.slurm_cluster import SLURM_FIXTURES, slurm_cluster
from harnesslab.tests.sshd_fixtures import SSH_FIXTURES, openssh_server, ssh_host

__all__ = ["openssh_server", "slurm_cluster", "ssh_host"]


# tryfirst: xdist's worker reads `xdist_group` in its own modifyitems hook, which runs first
# otherwise (registered after this conftest).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SSH_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)
        if SLURM_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.xdist_group("slurm_cluster"))


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module():
    """Collect at the end of each test file, so an object a test leaked (an asyncio subprocess
    transport whose loop is closed) fails in the file that leaked it, not whenever the
    collector happens to run (inside ast.parse it turned into 'AST constructor recursion depth
    mismatch' in an unrelated test)."""
    yield
    gc.collect()

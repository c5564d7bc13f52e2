"""Shared fixtures: the SSH test servers (tests/sshd_fixtures.py) and the Slurm test cluster
(tests/slurm_cluster.py), and the `ssh` and `slurm` markers applied to every test that uses one,
so `-m "not ssh"` or `-m "not slurm"` deselects them."""

from __future__ import annotations

import gc

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


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module():
    """Collect at the end of each test file, so an object a test leaked (an asyncio subprocess
    transport whose loop is closed) fails in the file that leaked it, not whenever the
    collector happens to run (inside ast.parse it turned into 'AST constructor recursion depth
    mismatch' in an unrelated test)."""
    yield
    gc.collect()

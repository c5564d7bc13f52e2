"""Shared fixtures: the SSH test servers (tests/sshd_fixtures.py), and the `ssh` marker applied
to every test that uses one, so `-m "not ssh"` deselects them."""

from __future__ import annotations

import pytest

from harnesslab.tests.sshd_fixtures import SSH_FIXTURES, openssh_server, ssh_host

__all__ = ["openssh_server", "ssh_host"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SSH_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)

"""Sweep space expansion: validation and sampling (no runner involved)."""

from __future__ import annotations

import pytest

from harnesslab.tests.conftest_shared import make_workspace
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.sweep import expand_space


def test_a_sub_space_expands_to_every_combination_on_top_of_the_current_config(tmp_path):
    ws = make_workspace(tmp_path)
    base = ws.read_config()
    configs = expand_space(ws, {"num_warps": [2, 8], "rows_per_program": [1, 4]}, 32, base)
    assert len(configs) == 4
    assert all(c["num_stages"] == base["num_stages"] for c in configs)
    assert {(c["num_warps"], c["rows_per_program"]) for c in configs} == {
        (2, 1),
        (2, 4),
        (8, 1),
        (8, 4),
    }


def test_the_full_space_is_sampled_down_deterministically_keeping_the_current_config(tmp_path):
    ws = make_workspace(tmp_path)
    base = ws.read_config()
    first = expand_space(ws, None, 10, base)
    assert len(first) == 10 and base in first
    assert first == expand_space(ws, None, 10, base)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"num_warps": [3]}, "num_warps=3 is not allowed"),
        ({"num_warps": [True]}, "num_warps=True is not allowed"),
        ({"block": [1]}, "unknown knob 'block'"),
        ({"num_warps": []}, "non-empty list"),
    ],
)
def test_values_outside_the_declared_space_are_refused_naming_the_allowed_ones(
    tmp_path, space, message
):
    ws = make_workspace(tmp_path)
    with pytest.raises(UsageError, match=message):
        expand_space(ws, space, 32, ws.read_config())


def test_compile_parallelism_stays_within_what_the_ssh_channels_allow(tmp_path):
    # 2 connections x 8 channels on each of two hosts; a warm worker holds one channel on the
    # first; one channel per host stays free for kills: 14 + 15 compile processes at once.
    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.execution.ssh import SSHExecutor
    from harnesslab.tools.execution.ssh_pool import SSHTarget
    from harnesslab.tools.settings import Settings

    hosts = [
        SSHExecutor(
            SSHTarget(host=h, port=22, ssh_config=None, remote_root="/tmp/x"), max_connections=2
        )
        for h in ("gpu-a", "gpu-b")
    ]
    launcher = Launcher(Settings(state_dir=tmp_path / "state"), hosts)
    assert launcher.parallel_capacity() == 30
    launcher.slots[0].worker = object()  # type: ignore[assignment]
    assert launcher.parallel_capacity() == 29
    assert Launcher(Settings(state_dir=tmp_path / "local")).parallel_capacity() is None


def test_sweeps_compile_on_the_gpu_hosts_cores_once_a_result_named_them(tmp_path):
    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.settings import Settings

    launcher = Launcher(Settings(state_dir=tmp_path / "state"))
    assert launcher.host_cpus() >= 1  # no result yet: this machine's count
    launcher.last_env = {"cpu_count": 64}
    assert launcher.host_cpus() == 64
    launcher.last_env = {"cpu_count": None}  # an older runner: fall back to this machine
    assert launcher.host_cpus() >= 1

"""The sandbox's reaper (tools/gpu/isolation/sandbox.py's _reaper) on its own, in a fork of the
test that plays the outer: it holds the go pipe's write end and reads the result pipe. What it
pins: a reaper that never gets its go runs nothing and exits 1; the limits it reports from the
wait statuses it reaps (the CPU time a SIGKILL is judged by is user + system time, a limit hit
by several processes listed once); the scratch-full bound (under 1 MiB free, not at it). The
wait statuses and the scratch's free space come from stand-ins where the real ones cannot be
made to order (a process's system time, a tmpfs with exactly 1 MiB free)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harnesslab.tests.tools.gpu.test_sandbox_units import SH
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation import sandbox_policy as sp


def reap(
    tmp: Path,
    script: str,
    *,
    go: bool = True,
    limits: sp.Limits | None = None,
    enforced: dict[str, str] | None = None,
    before: Callable[[], None] | None = None,
) -> tuple[int, dict[str, Any] | None]:
    """_reaper in a fork, its target `sh -c script`; `before()` runs in the fork first (to put
    stand-ins there). Returns (the reaper's exit, what it wrote on the result pipe or None)."""
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    policy = sp.Policy(limits=limits or sp.Limits(), landlock=False, seccomp=False)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(go_w)
            os.close(res_r)
            if before is not None:
                before()
            sandbox._reaper(policy, [SH, "-c", script], str(tmp), 0, enforced or {}, [], go_r,
                            res_w)  # fmt: skip
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(res_w)
    if go:
        os.write(go_w, b"g")
    os.close(go_w)
    with os.fdopen(res_r, "rb") as fh:
        said = fh.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code, json.loads(said) if said else None


def killed_by(sig: int) -> int:
    """A wait status: killed by `sig`."""
    pid = os.fork()
    if pid == 0:
        signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGXFSZ
        os.kill(os.getpid(), sig)
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def usage(utime: float, stime: float) -> Any:
    return SimpleNamespace(ru_utime=utime, ru_stime=stime)


def test_a_reaper_without_its_go_runs_nothing_and_exits_1(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code, said = reap(tmp_path, f"echo x > {marker}", go=False)
    assert (code, said) == (1, None)  # never 0: whoever reaps it must not read a success
    assert not marker.exists()
    assert reap(tmp_path, f"echo x > {marker}") == (0, {"limits_hit": []})
    assert marker.exists()


def test_a_sigkill_past_the_cpu_limit_counts_user_and_system_time(tmp_path: Path) -> None:
    """The target's real status (SIGKILL), reported with 0.2 s of user and 0.5 s of system
    time: 0.7 s is past a 1 s limit's 0.5 s threshold; user time alone or their difference is
    not."""

    def system_heavy() -> None:
        wait4 = os.wait4

        def stand_in(pid: int, options: int) -> Any:
            done, status, _ = wait4(pid, options)
            return done, status, usage(0.2, 0.5)

        os.wait4 = stand_in

    limits = sp.Limits(cpu_s=1)
    code, said = reap(tmp_path, "kill -9 $$", limits=limits, before=system_heavy)
    assert (code, said) == (128 + signal.SIGKILL, {"limits_hit": ["cpu"]})
    light = reap(tmp_path, "kill -9 $$", limits=sp.Limits(cpu_s=2), before=system_heavy)
    assert light == (128 + signal.SIGKILL, {"limits_hit": []})  # 0.7 s is under 1.5 s


def test_a_limit_hit_by_several_processes_is_listed_once(tmp_path: Path) -> None:
    """Two orphans the reaper reaps (stand-ins) died of SIGXFSZ before the target did."""
    status = killed_by(signal.SIGXFSZ)

    def orphans() -> None:
        wait4, queue = os.wait4, [(1 << 22) + 1, (1 << 22) + 2]

        def stand_in(pid: int, options: int) -> Any:
            if queue:
                return queue.pop(0), status, usage(0.0, 0.0)
            return wait4(pid, options)

        os.wait4 = stand_in

    assert os.WTERMSIG(status) == signal.SIGXFSZ
    assert reap(tmp_path, "exit 0", before=orphans) == (0, {"limits_hit": ["file_size"]})


def test_a_tmpfs_scratch_is_full_under_1_mib_free_not_at_it(tmp_path: Path) -> None:
    def free(bytes_: int) -> Callable[[], None]:
        def before() -> None:
            stand_in = SimpleNamespace(f_bavail=bytes_ // 4096, f_frsize=4096)
            os.statvfs = lambda path: stand_in  # type: ignore[assignment,return-value]

        return before

    tmpfs = {"scratch": "tmpfs"}
    assert reap(tmp_path, "exit 0", enforced=tmpfs, before=free(1 << 20))[1] == {"limits_hit": []}
    assert reap(tmp_path, "exit 0", enforced=tmpfs, before=free((1 << 20) - 4096))[1] == {
        "limits_hit": ["scratch"]
    }
    assert reap(tmp_path, "exit 0", before=free(0))[1] == {"limits_hit": []}  # no tmpfs

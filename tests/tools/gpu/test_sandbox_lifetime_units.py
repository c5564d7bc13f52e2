"""The sandbox's lifetime rules (tools/gpu/isolation/sandbox.py), each with the outer in a fork
of the test as tests/tools/gpu/test_sandbox_units.py runs it: a signal to the outer or to the
reaper ends the whole sandbox, a killed outer takes the reaper and the target with it
(PDEATHSIG), a dead caller takes the outer (`die_with_parent`), the outer cannot be read by a
same-user process (not dumpable), a reaper whose mounts fail or that never gets its go runs no
target, a cgroup it cannot join runs nothing (and leaves no reaper behind), the cgroup is removed
after a run and after a setup that failed, the reaper stops at its target's exit (in a PID
namespace its end takes the target's orphans), an in-place target keeps its scratch folder's
lock, and the scratch-full bound."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tests.tools.gpu.test_sandbox_units import FULL, PROBE, SH, Outcome, run
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation import sandbox_policy as sp

PR_GET_DUMPABLE = 3


class Live:
    """A sandbox running in a fork of the test (its outer: sandbox.main), whose target says
    `running <its parent's pid>` on descriptor 5, then sleeps `sleep` seconds and writes a
    marker file. `caller`: the outer is started by a middle process that exits once the target
    runs, and the policy's die_with_parent names that middle process."""

    def __init__(
        self, tmp: Path, *, sleep: float = 2.0, caller: bool = False, **policy: Any
    ) -> None:
        self.marker = tmp / f"out-survived-{len(list(tmp.glob('out-survived-*')))}"
        script = f"echo running $PPID >&5; sleep {sleep}; echo x > {self.marker}"
        fields = {
            "report_fd": 3,
            "token": "t",
            "scratch_root": str(tmp),
            "write": [str(tmp)],
            **policy,
        }
        in_r, in_w = os.pipe()
        rep_r, rep_w = os.pipe()
        go_r, go_w = os.pipe()
        rel_r, self.release_fd = os.pipe()  # caller: the middle process exits when written
        self.pid = os.fork()
        if self.pid == 0:
            code = 99
            try:
                if caller and os.fork() != 0:  # the middle process
                    for fd in (in_r, in_w, rep_r, rep_w, go_r, go_w, self.release_fd):
                        os.close(fd)
                    os.read(rel_r, 1)
                    os._exit(0)
                if caller:
                    fields["die_with_parent"] = os.getppid()
                os.write(in_w, sp.frame(sp.Policy(**fields)))
                os.dup2(in_r, 0)
                os.dup2(rep_w, 3)
                os.dup2(go_w, 5)
                code = sandbox.main(["--policy-stdin", "--", SH, "-c", script])
            finally:
                os._exit(code)
        for fd in (in_r, in_w, rep_w, go_w, rel_r):
            os.close(fd)
        self.ready, self.reports_fd = os.fdopen(go_r, "rb"), rep_r

    def running(self) -> int:
        """Waits for the target; returns its parent's pid (the reaper's, without a PID
        namespace)."""
        line = self.ready.readline().split()
        assert line[:1] == [b"running"], line
        return int(line[1])

    def end(self) -> tuple[int | None, list[dict[str, Any]]]:
        """(the outer's exit, or None when it is not the test's child), its reports."""
        with os.fdopen(self.reports_fd, "rb") as fh:
            events = [json.loads(x) for x in fh.read().splitlines()]
        code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        self.ready.close()
        os.close(self.release_fd)
        return code, events


@FULL
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_outer_ends_the_target(tmp_path: Path, sig: int) -> None:
    live = Live(tmp_path)
    live.running()
    os.kill(live.pid, sig)
    code, events = live.end()
    assert code == 128 + signal.SIGKILL and events[-1]["status"] == code  # the reaper, killed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_reaper_ends_it_and_the_sandbox(tmp_path: Path, sig: int) -> None:
    """The reaper does not keep the outer's handlers (which would leave it running)."""
    live = Live(tmp_path, namespaces=False, landlock=False)
    reaper = live.running()
    assert reaper != live.pid
    os.kill(reaper, sig)
    code, events = live.end()
    assert code == 128 + sig and events[-1]["status"] == code  # not the target's 0


def test_a_killed_outer_takes_the_reaper_and_the_target_with_it(tmp_path: Path) -> None:
    """Without a PID namespace only PDEATHSIG ends them: the outer's for the reaper, the
    reaper's for the target."""
    live = Live(tmp_path, sleep=1.0, namespaces=False, landlock=False)
    reaper = live.running()
    os.kill(live.pid, signal.SIGKILL)
    code, _ = live.end()
    assert code == -signal.SIGKILL or code == 128 + signal.SIGKILL
    time.sleep(1.4)
    assert not live.marker.exists()
    assert dead(reaper)


def dead(pid: int) -> bool:
    """Gone, or a zombie its new parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def test_a_dead_caller_takes_the_sandbox_with_it(tmp_path: Path) -> None:
    live = Live(tmp_path, sleep=1.0, caller=True, namespaces=False, landlock=False)
    live.running()
    os.write(live.release_fd, b"x")  # the caller exits
    code, events = live.end()
    assert code == 0  # the middle process, not the outer
    assert events[-1]["event"] == "sandbox_exit" and events[-1]["status"] == 128 + signal.SIGKILL
    time.sleep(1.3)
    assert not live.marker.exists()


def test_the_outer_is_not_dumpable(tmp_path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def inside(main: Any) -> int:
        code = main()
        print(f"dumpable={libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)}")
        return code

    out = run(tmp_path, [SH, "-c", "exit 0"], inside=inside, namespaces=False, landlock=False)
    assert out.code == 0 and "dumpable=0" in out.stdout


def test_a_reaper_whose_mounts_fail_runs_no_target(tmp_path: Path) -> None:
    def inside(main: Any) -> int:
        def fail(*a: Any) -> None:
            raise OSError("no mounts here")

        sandbox.sm.setup_mounts = fail
        return main()

    marker = tmp_path / "out-ran"
    out = run(tmp_path, [SH, "-c", f"echo x > {marker}"], inside=inside, namespaces=["mnt"],
              landlock=False, write=[str(tmp_path)])  # fmt: skip
    if out.reports[0]["namespaces"] != ["mnt"]:
        pytest.skip("no mount namespace here")
    assert (out.code, out.reports[-1]["status"]) == (126, 126)
    assert "sandbox: no mounts here" in out.stderr and not marker.exists()


def test_a_cgroup_the_sandbox_cannot_join_runs_nothing(tmp_path: Path) -> None:
    if PROBE["cgroup"] == "none":
        pytest.skip("no cgroup here")
    made: list[Any] = []

    def inside(main: Any) -> int:
        create = sandbox.sl.Cgroup.create

        def refusing(*a: Any) -> Any:
            group = create(*a)
            if group is not None:
                group.add = lambda pid: False
                made.append(group)
                print("cgroup=" + ",".join(group.folders))
            return group

        sandbox.sl.Cgroup.create = staticmethod(refusing)
        code = main()
        try:  # the reaper, told no go, was waited for: the outer leaves no child behind
            print("left=", os.waitpid(-1, os.WNOHANG))
        except ChildProcessError:
            print("left=none")
        return code

    marker = tmp_path / "out-ran"
    out = run(tmp_path, [SH, "-c", f"echo x > {marker}"], inside=inside, landlock=False,
              write=[str(tmp_path)])  # fmt: skip
    assert (out.code, out.reports[-1]["status"]) == (126, 126)
    assert "sandbox: cannot move the sandbox into its cgroup" in out.stderr
    assert not marker.exists()
    assert "left=none" in out.stdout
    folders = out.stdout.split("cgroup=", 1)[1].split()[0].split(",")
    assert folders and not any(os.path.exists(f) for f in folders)  # removed at the end


def cgroup_folders(tmp_path: Path, fail_after: bool) -> tuple[Outcome, list[str]]:
    """A run whose cgroup's folders are printed when made; `fail_after`: the setup fails right
    after the cgroup was made."""

    def inside(main: Any) -> int:
        create = sandbox.sl.Cgroup.create

        def noted(*a: Any) -> Any:
            group = create(*a)
            print("cgroup=" + ",".join(group.folders), flush=True)
            return group

        def failing(*a: Any) -> Any:
            raise OSError("no plan")

        sandbox.sl.Cgroup.create = staticmethod(noted)
        if fail_after:
            sandbox.plan_limits = failing
        return main()

    out = run(tmp_path, [SH, "-c", "exit 0"], inside=inside, landlock=False)
    return out, out.stdout.split("cgroup=", 1)[1].split()[0].split(",")


def test_a_run_removes_its_cgroup_and_so_does_a_setup_that_failed(tmp_path: Path) -> None:
    if PROBE["cgroup"] == "none":
        pytest.skip("no cgroup here")
    out, folders = cgroup_folders(tmp_path, fail_after=False)
    assert out.code == 0
    assert folders and not any(os.path.exists(f) for f in folders)
    failed, folders = cgroup_folders(tmp_path, fail_after=True)
    assert failed.code == sandbox.SETUP_FAILED and "no plan" in failed.stderr
    assert folders and not any(os.path.exists(f) for f in folders)


@FULL
def test_the_reaper_ends_with_its_target_and_takes_what_the_target_left(tmp_path: Path) -> None:
    """In a PID namespace the target's orphans are the reaper's children: it reaps them while
    the target runs, but stops at the target's exit (its own exit ends the namespace)."""
    marker = tmp_path / "out-orphan"
    out = run(tmp_path, [SH, "-c", f"(sleep 0.5; echo x > {marker}) & exit 4"],
              write=[str(tmp_path)])  # fmt: skip
    assert out.reports[0]["lifetime"] == "pid_namespace"
    assert out.code == 4
    time.sleep(1.0)  # the orphan's sleep, and then some
    assert not marker.exists()


def test_an_in_place_target_holds_its_scratch_folders_lock(tmp_path: Path) -> None:
    script = "ls -l /proc/$$/fd | grep -q 'sbx-.*\\.lock' && exit 7; exit 8"
    out = run(tmp_path, [SH, "-c", script], fork=False, namespaces=False, landlock=False)
    assert out.code == 7
    forked = run(tmp_path, [SH, "-c", script], namespaces=False, landlock=False)
    assert forked.code == 8  # with a reaper, the outer holds it and the target never sees it


@FULL
def test_a_scratch_with_a_mebibyte_free_is_not_full(tmp_path: Path) -> None:
    fill = 'head -c 2500000 /dev/zero > "$TMPDIR/fill"; exit 0'
    out = run(tmp_path, [SH, "-c", fill], limits=sp.Limits(scratch_mb=4, cgroup="off"))
    assert out.code == 0 and out.reports[-1]["limits_hit"] == []
    full = run(tmp_path, [SH, "-c", fill.replace("2500000", "3300000")],
               limits=sp.Limits(scratch_mb=4, cgroup="off"))  # fmt: skip
    assert full.reports[-1]["limits_hit"] == ["scratch"]


def test_no_fork_means_no_reaper_only_without_namespaces(tmp_path: Path) -> None:
    assert sys.platform.startswith("linux")
    out = run(tmp_path, [SH, "-c", "exit 3"], fork=False, namespaces=False, landlock=False)
    assert out.code == 3 and out.reports[0]["lifetime"] == "caller"


FORKER = """import os, time
for i in range(12):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
    except OSError:
        pass
time.sleep(3)
"""


def test_a_pids_limit_hit_kills_the_whole_sandbox_at_once(tmp_path: Path) -> None:
    """The target survives its failed forks; the cgroup's counter ends it, not its sleep."""
    if PROBE["cgroup"] == "none":
        pytest.skip("no cgroup here")
    t0 = time.monotonic()
    out = run(
        tmp_path, [sys.executable, "-I", "-c", FORKER], limits=sp.Limits(pids=8), landlock=False
    )
    assert out.code == 128 + signal.SIGKILL and out.reports[-1]["limits_hit"] == ["pids"]
    assert time.monotonic() - t0 < 2.5

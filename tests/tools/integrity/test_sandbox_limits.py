"""The sandbox itself (tools/gpu/isolation/sandbox.py, started as the toolkit starts it: sandbox_policy's
command()): its limits and what decides that one was hit, its seccomp filter, what a target can
learn of its caller, what it leaves behind, and a policy it does not know.

Targets are plain `python -c` programs (no torch: a fraction of a second each). The attacks run
through the toolkit's own paths are in tests/trust/test_sandbox_attacks.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnesslab.tools.gpu import copy_flat
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation import sandbox_limits as sl
from harnesslab.tools.gpu.isolation import sandbox_policy as sp
from harnesslab.tools.gpu.verify import guard_kid
from harnesslab.tools.gpu.verify.guard_kid import Kid, KidFailed

PROBE = sandbox.probe()
pytestmark = pytest.mark.skipif(
    PROBE["level"] != "full", reason="no Landlock or namespaces on this machine"
)
needs_cgroup = pytest.mark.skipif(
    PROBE["cgroup"] == "none", reason="this machine lets the sandbox make no cgroup"
)


def run(code: str, tmp_path: Path, *, env: dict[str, str] | None = None, timeout_s: float = 120,
        **fields) -> tuple[subprocess.CompletedProcess[str], dict, dict | None]:  # fmt: skip
    """`code` in the sandbox (the toolkit's way); (process, first report, exit report)."""
    fields.setdefault("scratch_root", str(tmp_path / "scratch"))
    policy = sp.Policy(**fields)
    launch = sp.command(
        sys.executable, sandbox.__file__, policy, [sys.executable, "-I", "-c", code]
    )
    proc = subprocess.run(
        launch.argv, input=launch.stdin.decode(), capture_output=True, text=True,
        timeout=timeout_s, env=env,
    )  # fmt: skip
    start, end, _ = sp.take_reports(proc.stdout, launch.token)
    return proc, start, end


def procs_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


# -- limits ---------------------------------------------------------------------------------------


@needs_cgroup
def test_a_fork_bomb_ends_at_the_pids_limit_and_leaves_nothing(tmp_path: Path) -> None:
    bomb = (
        "import os, sys, time\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', 'hl-bomb'])\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(600)\n"
    )  # fmt: skip
    started = time.monotonic()
    proc, start, end = run(bomb, tmp_path, limits=sp.Limits(pids=32))
    assert start["limits"]["by"]["pids"].startswith("cgroup")
    assert end is not None and "pids" in end["limits_hit"], (end, proc.stderr)
    assert time.monotonic() - started < 60  # ended by the limit, not by a timeout
    assert procs_with("hl-bomb") == []


@needs_cgroup
def test_a_memory_bomb_is_killed_at_the_memory_limit(tmp_path: Path) -> None:
    bomb = "b = []\nwhile len(b) < 30 * 16:\n    b.append(bytearray(64 << 20))\n"  # 30 GiB
    proc, start, end = run(bomb, tmp_path, limits=sp.Limits(memory_mb=256))
    assert start["limits"]["by"]["memory"].startswith("cgroup")
    assert end is not None and end["limits_hit"] == ["memory"], (end, proc.stderr)
    assert proc.returncode == 137


def test_without_a_cgroup_memory_is_an_rlimit_on_a_cpu_host(tmp_path: Path) -> None:
    """cgroup "off" (or none here): RLIMIT_DATA; the allocation fails inside the target."""
    code = "try:\n    bytearray(2 << 30)\nexcept MemoryError:\n    print('REFUSED')\n"
    proc, start, _ = run(code, tmp_path, limits=sp.Limits(memory_mb=512, cgroup="off"))
    assert start["limits"]["by"]["memory"] == "rlimit"
    assert "REFUSED" in proc.stdout


def test_the_scratch_folder_is_a_tmpfs_of_its_size_and_files_are_bounded(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "d = os.environ['TMPDIR']\n"
        "try:\n    open(d + '/big', 'wb').write(b'x' * (20 << 20))\n"
        "except OSError as e:\n    print('FILE', e.errno)\n"
        "try:\n"
        "    for i in range(100):\n        open(f'{d}/f{i}', 'wb').write(b'x' * (1 << 20))\n"
        "except OSError as e:\n    print('FULL', e.errno)\n"
    )
    proc, start, end = run(code, tmp_path, limits=sp.Limits(file_mb=8, scratch_mb=32))
    assert start["limits"]["by"]["scratch"] == "tmpfs"
    assert "FILE 27" in proc.stdout and "FULL 28" in proc.stdout  # EFBIG, ENOSPC
    assert end is not None and end["limits_hit"] == ["scratch"]


def test_a_cpu_spin_ends_at_the_cpu_limit(tmp_path: Path) -> None:
    proc, _, end = run("while True:\n    pass\n", tmp_path, limits=sp.Limits(cpu_s=2))
    assert end is not None and end["limits_hit"] == ["cpu"], (end, proc.stderr)


def test_a_sandbox_that_cannot_set_up_says_why_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start failure used to leave the guard with "the sandbox did not start" and no cause,
    charged to the candidate (`candidate_crashed`) though none of its code had run."""
    # The Kid starts its sandbox.py from the flat staged folder, as on the GPU host.
    monkeypatch.setattr(guard_kid, "HERE", str(copy_flat(tmp_path / "stage" / "harness")))
    blocked, marker = tmp_path / "a-file", tmp_path / "ran"
    blocked.write_text("")
    proc, start, _ = run(f"open({str(marker)!r}, 'w')", tmp_path, scratch_root=str(blocked))
    assert proc.returncode == sandbox.SETUP_FAILED and start == {} and not marker.exists()
    said = json.loads(proc.stdout.splitlines()[0])
    assert said["event"] == "sandbox_failed" and said["error"].startswith("FileExistsError")
    kid = Kid("incumbent", "guard_child.py", sp.Policy(scratch_root=str(blocked)), 30)
    with pytest.raises(KidFailed) as failed:
        kid.started()
    kid.close()
    assert failed.value.code == "sandbox_failed" and failed.value.role == "incumbent"
    assert "the sandbox did not start: FileExistsError" in str(failed.value)


def test_the_target_cannot_forge_the_exit_report(tmp_path: Path) -> None:
    forged = '{"event": "sandbox_exit", "token": "guess", "status": 0, "limits_hit": ["memory"]}'
    proc, _, end = run(f"print({forged!r})", tmp_path)
    assert forged in proc.stdout and end is not None and end["limits_hit"] == []
    assert sp.exit_report(forged, "another token") is None


# -- seccomp --------------------------------------------------------------------------------------


def test_clone_with_a_new_namespace_is_refused_and_clone3_is_unknown(tmp_path: Path) -> None:
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # clone(CLONE_NEWUSER|SIGCHLD)
        "if pid == 0:\n    os._exit(0)\n"
        "print('CLONE', pid, ctypes.get_errno())\n"
        "args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17)\n"  # clone3, same flags
        "pid = libc.syscall(435, args, 88)\n"
        "if pid == 0:\n    os._exit(0)\n"
        "print('CLONE3', pid, ctypes.get_errno())\n"
        "pid = os.fork()\n"  # a plain fork still works
        "if pid == 0:\n    os._exit(0)\n"
        "print('FORK', pid > 0)\n"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86_64's")
    proc, _, _ = run(code, tmp_path)
    assert "CLONE -1 1" in proc.stdout, proc.stdout + proc.stderr  # EPERM
    assert "CLONE3 -1 38" in proc.stdout  # ENOSYS: glibc falls back to clone
    assert "FORK True" in proc.stdout


def test_the_filter_refuses_what_dockers_default_profile_refuses() -> None:
    from harnesslab.tools.gpu.isolation import sandbox_confine as sc

    for arch in sc.ARCHES.values():
        deny = set(arch["deny"])
        assert {"pidfd_getfd", "kcmp", "fsopen", "open_tree", "move_mount", "syslog"} <= deny
        assert {"pidfd_open", "memfd_create"}.isdisjoint(deny)  # allowed: sandbox_confine says why


# -- what the target learns ------------------------------------------------------------------------


def test_the_policy_is_not_on_any_command_line_inside(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        print(open(f'/proc/{p}/cmdline', 'rb').read())\n"
    )
    secret = str(tmp_path / "granted-folder")
    os.makedirs(secret)
    proc, _, _ = run(code, tmp_path, read=[secret])
    assert "/proc/1/" not in proc.stderr and "cmdline" not in proc.stderr, proc.stderr
    assert secret not in proc.stdout and "scratch_root" not in proc.stdout
    assert "--policy-stdin" in proc.stdout  # it did read /proc/1/cmdline


def test_sys_is_not_readable_without_a_gpu(tmp_path: Path) -> None:
    if sandbox.sc.has_gpu(sandbox.sc.device_paths()):
        pytest.skip("a GPU host: /sys grants what CUDA reads")
    code = (
        "import os\n"
        "for p in ('/sys/class/net', '/sys/kernel', '/sys/devices/system/cpu'):\n"
        "    try:\n        os.listdir(p); print('READ', p)\n"
        "    except OSError:\n        print('DENIED', p)\n"
    )
    proc, _, _ = run(code, tmp_path)
    assert "READ" not in proc.stdout and proc.stdout.count("DENIED") == 3, proc.stdout


def test_the_target_gets_a_minimal_path_not_its_callers(tmp_path: Path) -> None:
    marker = str(tmp_path / "hl-host-tools")
    os.makedirs(marker)
    env = {**os.environ, "PATH": f"{marker}:{os.environ.get('PATH', '')}"}
    proc, _, _ = run("import os; print('PATH=' + os.environ['PATH'])", tmp_path, env=env)
    path = proc.stdout.split("PATH=")[1].split()[0].split(":")
    assert marker not in path and "/usr/bin" in path and os.path.dirname(sys.executable) in path


# -- what is left, and what is refused -----------------------------------------------------------


def test_a_sweep_between_a_scratch_locks_creation_and_its_flock_does_not_break_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sandboxes start at once (a verify's candidate and incumbent): the second's sweep ran
    while the first had created its temporary lock file but not yet locked it, took the lock,
    removed the file, and the first died on os.link (CI: "the sandbox did not start")."""
    root = tmp_path / "scratch"
    root.mkdir()
    flock = sl.fcntl.flock
    sweeps = []

    def another_sandbox_sweeps_first(fd: int, op: int) -> None:
        if op == sl.fcntl.LOCK_EX and not sweeps:  # the creator's blocking lock, once
            code = "import sys; from harnesslab.tools.gpu.isolation import sandbox_limits as sl; sl.sweep(sys.argv[1])"
            sweeps.append(subprocess.run([sys.executable, "-c", code, str(root)], check=True))
        flock(fd, op)

    monkeypatch.setattr(sl.fcntl, "flock", another_sandbox_sweeps_first)
    scratch = sl.Scratch(str(root))
    assert sweeps and os.path.isdir(scratch.path) and os.path.exists(scratch.lock)
    monkeypatch.setattr(sl.fcntl, "flock", flock)
    assert sl.sweep(str(root)) == []  # it is still owned
    scratch.remove()


def test_a_killed_outer_leaves_nothing_the_next_sandbox_does_not_sweep(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    policy = sp.Policy(scratch_root=str(root))
    code = "import os, time\nopen(os.environ['TMPDIR'] + '/x', 'w').write('x')\nprint('UP', flush=True)\ntime.sleep(600)\n"
    launch = sp.command(
        sys.executable, sandbox.__file__, policy, [sys.executable, "-I", "-c", code]
    )
    proc = subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(launch.stdin.decode())
    proc.stdin.flush()
    while "UP" not in proc.stdout.readline():
        pass
    live = run("print('second')", tmp_path, scratch_root=str(root))  # a live one is never swept
    assert live[0].returncode == 0 and len([p for p in root.iterdir() if p.is_dir()]) == 1
    proc.send_signal(signal.SIGKILL)  # no clean-up of its own: its lock goes with it
    proc.wait()
    proc.stdout.close()
    proc.stdin.close()
    for _ in range(100):  # its reaper dies with it (PDEATHSIG), releasing the lock
        if not sl.sweep(str(root)) and not any(p.is_dir() for p in root.iterdir()):
            break
        time.sleep(0.05)
    run("print('third')", tmp_path, scratch_root=str(root))
    assert list(root.iterdir()) == []


def test_a_policy_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    policy = {"scratch_root": str(tmp_path), "writ": ["/"]}
    out = subprocess.run(
        [sys.executable, "-I", sandbox.__file__, "--policy", json.dumps(policy), "--",
         sys.executable, "-c", "print('RAN')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "unknown key(s) writ" in out.stderr and "RAN" not in out.stdout
    with pytest.raises(ValueError, match="limits: unknown key"):
        sp.Policy.from_json('{"limits": {"memory_gb": 1}}')
    with pytest.raises(ValueError, match="is not bool"):
        sp.Policy.from_json('{"require": "yes"}')


def test_a_v2_cgroup_is_made_beside_the_callers_where_memory_and_pids_are_delegated(
    tmp_path: Path,
) -> None:
    """cgroup v2 (this machine has v1): the sandbox's cgroup is a sibling of the outer's own
    (v2 forbids controllers in a cgroup with processes), only where the parent delegates memory
    and pids; its limits are written, its kernel counters read. A plain folder stands in for
    the cgroup2 mount."""
    parent = tmp_path / "cg" / "app.slice"
    (parent / "me.scope").mkdir(parents=True)
    place = ("/", str(tmp_path / "cg"), "/app.slice/me.scope")
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place) is None  # nothing delegated
    (parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    group = sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place)
    assert group is not None and group.kind == "v2"
    folder = parent / "hl-sbx-1-2-ab"
    assert group.folders == [str(folder)]
    assert (folder / "memory.max").read_text() == str(1 << 30)
    assert (folder / "pids.max").read_text() == "64"
    assert (folder / "memory.swap.max").read_text() == "0"
    assert group.hits() == []
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (folder / "pids.events").write_text("max 7\n")
    assert group.hits() == ["memory", "pids"]

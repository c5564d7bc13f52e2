"""The sandbox's limits and leftovers (tools/gpu/isolation/sandbox_limits.py) rule by rule, without a
sandbox: cgroup names and who owns them, the cgroup files read and written (plain folders stand
in for the cgroup mounts), the rlimits planned, the signal a limit kills with, scratch folders
and their sweep. The sandbox itself enforcing them is tests/tools/integrity/test_sandbox_limits.py.
"""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harnesslab.tools.gpu.isolation import sandbox_limits as sl

# -- reading cgroup and /proc files ------------------------------------------------------------


def test_a_flat_keyed_field_is_the_number_after_its_exact_key() -> None:
    text = "oom 3\noom_kill 2\nmax x\nlow 1 2\n"
    assert sl._field(text, "oom_kill") == 2
    assert sl._field(text, "oom") == 3
    assert sl._field(text, "max") == 0  # not a number
    assert sl._field(text, "low") == 0  # not `key N`
    assert sl._field(text, "high") == 0


def test_a_missing_file_reads_empty_and_a_refused_write_is_false(tmp_path: Path) -> None:
    assert sl._read(str(tmp_path / "none")) == ""
    assert sl._write(str(tmp_path / "f"), "7") and (tmp_path / "f").read_text() == "7"
    assert sl._write(str(tmp_path / "no" / "f"), "7") is False


def test_mtime_of_a_vanished_folder_is_0_so_it_counts_as_old(tmp_path: Path) -> None:
    assert sl._mtime(str(tmp_path / "gone")) == 0.0
    assert sl._mtime(str(tmp_path)) == os.stat(tmp_path).st_mtime


def test_start_time_is_the_22nd_field_of_proc_stat_and_empty_for_a_gone_process() -> None:
    me = sl.start_time(os.getpid())
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert me.isdigit() and me == stat.rsplit(")", 1)[1].split()[19]
    assert sl.start_time(2**22 + 12345) == ""


def test_start_time_reads_past_a_process_name_holding_a_parenthesis(monkeypatch) -> None:
    fields = " ".join(["S"] + [str(n) for n in range(1, 25)])  # the 20th after the state: 19
    stat = f"77 (evil) 1 2) {fields}\n"
    monkeypatch.setattr(sl, "_read", lambda p: stat if p == "/proc/77/stat" else "")
    assert sl.start_time(77) == "19"


def test_a_cgroup_is_owned_while_the_pid_and_start_time_in_its_name_match() -> None:
    pid = os.getpid()
    alive = f"{sl.PREFIX}{pid}-{sl.start_time(pid)}-abcd"
    assert sl._owner_alive(alive)
    assert sl._owner_alive(f"{sl.PREFIX}{pid}-1-abcd") is False  # a reused pid: another start
    assert sl._owner_alive(f"{sl.PREFIX}{pid}-{sl.start_time(pid)}") is False  # two parts
    assert not sl._owner_alive(f"{sl.PREFIX}{pid}-{sl.start_time(pid)}-ab-cd")  # four
    assert not sl._owner_alive(f"{sl.PREFIX}x{pid}-{sl.start_time(pid)}-abcd")


MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 /docker /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "37 31 0:34 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n"
    "38 31 0:35 / /short - cgroup\n"
    "39 31 - cgroup cgroup rw\n"
    "40 31 0:36 / /sys/fs/cgroup/blkio - tmpfs cgroup rw\n"
    "41 31 0:37 / /five - cgroup none rw,cpuset\n"
)
PROC_CGROUP = "9:name=systemd:/\n5:memory:/docker/c1\n4:pids,cpu:/p\n0::/user.slice/me.scope\n"


@pytest.fixture
def proc(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """/proc/self/mountinfo and /proc/self/cgroup as the test writes them."""
    files = {"/proc/self/mountinfo": MOUNTINFO, "/proc/self/cgroup": PROC_CGROUP}
    real = sl._read
    monkeypatch.setattr(sl, "_read", lambda p: files[p] if p in files else real(p))
    return files


def test_the_cgroup_mounts_and_this_processs_groups_are_read_from_proc(proc) -> None:
    assert sl._mounts() == [
        ("/docker", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
        ("/", "/sys/fs/cgroup/pids", "cgroup", "rw,pids"),
        ("/", "/sys/fs/cgroup/unified", "cgroup2", "rw,nsdelegate"),
        ("/", "/five", "cgroup", "rw,cpuset"),  # five fields are enough
    ]  # not a tmpfs (whatever its source is named), not a line with too few fields
    assert sl._own("") == "/user.slice/me.scope"
    assert sl._own("memory") == "/docker/c1"
    assert sl._own("pids") == "/p" and sl._own("cpu") == "/p"
    assert sl._own("blkio") is None
    proc["/proc/self/cgroup"] = "5:memory:/c1\n"
    assert sl._own("") is None  # v1 only


def test_a_cgroup_path_maps_under_its_mount_only_inside_the_mounts_root() -> None:
    assert sl._under("/", "/m", "/a/b") == "/m/a/b"
    assert sl._under("/docker", "/m", "/docker/c1") == "/m/c1"
    assert sl._under("/docker", "/m", "/docker") == "/m/"
    assert sl._under("/docker", "/m", "/dockerx/c1") is None
    assert sl._under("/docker", "/m", "/other") is None


# -- v2 and v1 cgroups on stand-in folders -------------------------------------------------------


def v2_place(tmp_path: Path, controllers: str = "cpu memory pids") -> tuple[Path, tuple]:
    parent = tmp_path / "cg" / "app.slice"
    (parent / "me.scope").mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text(controllers + "\n")
    return parent, ("/", str(tmp_path / "cg"), "/app.slice/me.scope")


def test_a_v2_cgroup_needs_memory_and_pids_delegated_and_a_writable_parent(
    tmp_path, monkeypatch
) -> None:
    parent, place = v2_place(tmp_path, "cpu memory")
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place) is None  # no pids
    (parent / "cgroup.subtree_control").write_text("pids cpu\n")
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place) is None  # no memory
    (parent / "cgroup.subtree_control").write_text("memory pids\n")
    real_access = os.access
    monkeypatch.setattr(sl.os, "access", lambda p, m: p != str(parent) and real_access(p, m))
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place) is None  # not writable
    assert not (parent / "hl-sbx-1-2-ab").exists()
    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1, 1, ("/", str(tmp_path / "cg"), "/")) is None  # root
    assert not (tmp_path / "hl-sbx-1-2-ab").exists()
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1, 1, ("/x", str(tmp_path / "cg"), "/y/z")) is None


def test_a_v2_cgroup_writes_its_limits_and_sweeps_a_dead_outers(tmp_path) -> None:
    parent, place = v2_place(tmp_path)
    stale = parent / f"{sl.PREFIX}{2**22 + 7}-1-dead"
    stale.mkdir()
    group = sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place)
    assert group is not None and group.kind == "v2" and not stale.exists()
    folder = parent / "hl-sbx-1-2-ab"
    assert group.dirs == {"memory": str(folder), "pids": str(folder)}
    assert (folder / "memory.max").read_text() == str(1 << 30)
    assert (folder / "pids.max").read_text() == "64"
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "memory.oom.group").read_text() == "1"
    assert folder.stat().st_mode & 0o777 == 0o755 & ~umask()


def umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_v2_cgroup_whose_limits_cannot_be_written_is_removed(tmp_path, monkeypatch) -> None:
    parent, place = v2_place(tmp_path)
    real = sl._write
    monkeypatch.setattr(sl, "_write", lambda p, v: not p.endswith("pids.max") and real(p, v))
    removed = []
    monkeypatch.setattr(sl.Cgroup, "remove", lambda self, timeout_s=5.0: removed.append(self))
    assert sl.Cgroup._v2("hl-sbx-1-2-ab", 1 << 30, 64, place) is None
    assert [g.folders for g in removed] == [[str(parent / "hl-sbx-1-2-ab")]]
    removed.clear()
    monkeypatch.setattr(sl, "_write", lambda p, v: not p.endswith("memory.max") and real(p, v))
    assert sl.Cgroup._v2("hl-sbx-1-2-cd", 1 << 30, 64, place) is None
    assert len(removed) == 1


def test_v2_finds_its_place_from_proc(tmp_path, proc) -> None:
    parent = tmp_path / "app.slice"
    (parent / "me.scope").mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text("memory pids\n")
    proc["/proc/self/mountinfo"] = (
        f"36 31 0:33 / {tmp_path}/v1 rw - cgroup cgroup rw,pids\n"  # a v1 one first
        f"37 31 0:34 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    )
    proc["/proc/self/cgroup"] = "0::/app.slice/me.scope\n"
    group = sl.Cgroup._v2("hl-sbx-1-2-ab", 5, 6)
    assert group is not None and group.folders == [str(parent / "hl-sbx-1-2-ab")]
    proc["/proc/self/cgroup"] = "1:memory:/x\n"
    assert sl.Cgroup._v2("hl-sbx-1-2-cd", 5, 6) is None  # no v2 group of ours
    proc["/proc/self/cgroup"] = "0::/app.slice/me.scope\n"
    proc["/proc/self/mountinfo"] = MOUNTINFO.replace("cgroup2", "cgroup")
    assert sl.Cgroup._v2("hl-sbx-1-2-ef", 5, 6) is None  # no v2 mount


def v1_setup(tmp_path: Path, proc: dict[str, str], memsw: bool = True) -> tuple[Path, Path]:
    mem, pids = tmp_path / "memory" / "c1", tmp_path / "pids" / "p"
    mem.mkdir(parents=True)
    pids.mkdir(parents=True)
    proc["/proc/self/mountinfo"] = (
        f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
        f"36 31 0:33 / {tmp_path}/pids rw - cgroup cgroup rw,pids,cpu\n"
    )
    proc["/proc/self/cgroup"] = "5:memory:/c1\n4:cpu,pids:/p\n"
    return mem, pids


def test_a_v1_cgroup_is_one_folder_per_controller_under_this_processs_own(tmp_path, proc) -> None:
    mem, pids = v1_setup(tmp_path, proc)
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):  # the kernel makes a v1 memory group's files
        real_mkdir(path, mode)
        if "/memory/" in str(path):
            Path(path, "memory.memsw.limit_in_bytes").write_text("")

    stale = pids / f"{sl.PREFIX}{2**22 + 7}-1-dead"
    stale.mkdir()
    os_mkdir = sl.os.mkdir
    sl.os.mkdir = mkdir
    try:
        group = sl.Cgroup._v1("hl-sbx-1-2-ab", 1 << 30, 64)
    finally:
        sl.os.mkdir = os_mkdir
    assert group is not None and group.kind == "v1" and not stale.exists()
    assert group.dirs == {"memory": str(mem / "hl-sbx-1-2-ab"), "pids": str(pids / "hl-sbx-1-2-ab")}
    assert (mem / "hl-sbx-1-2-ab" / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert (mem / "hl-sbx-1-2-ab" / "memory.memsw.limit_in_bytes").read_text() == str(1 << 30)
    assert (pids / "hl-sbx-1-2-ab" / "pids.max").read_text() == "64"
    assert (pids / "hl-sbx-1-2-ab").stat().st_mode & 0o777 == 0o755 & ~umask()


def test_a_v1_memory_limit_refused_is_refused_whatever_the_swap_limit_says(
    tmp_path, proc, monkeypatch
) -> None:
    v1_setup(tmp_path, proc)
    real_mkdir, real_write = os.mkdir, sl._write

    def mkdir(path, mode=0o777):
        real_mkdir(path, mode)
        if "/memory/" in str(path):
            Path(path, "memory.memsw.limit_in_bytes").write_text("")

    monkeypatch.setattr(sl.os, "mkdir", mkdir)
    monkeypatch.setattr(
        sl, "_write", lambda p, v: not p.endswith("/memory.limit_in_bytes") and real_write(p, v)
    )
    removed = []
    monkeypatch.setattr(sl.Cgroup, "remove", lambda self, timeout_s=5.0: removed.append(1))
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 100, 64) is None and removed == [1]


def test_a_v1_cgroup_without_swap_accounting_writes_no_memsw(tmp_path, proc) -> None:
    mem, _ = v1_setup(tmp_path, proc)
    group = sl.Cgroup._v1("hl-sbx-1-2-ab", 100, 64)
    assert group is not None
    assert not (mem / "hl-sbx-1-2-ab" / "memory.memsw.limit_in_bytes").exists()


def test_a_v1_cgroup_is_refused_where_a_controller_is_missing_or_not_writable(
    tmp_path, proc, monkeypatch
) -> None:
    mem, pids = v1_setup(tmp_path, proc)
    mounts = proc["/proc/self/mountinfo"]
    proc["/proc/self/mountinfo"] = mounts.splitlines()[0] + "\n"
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None  # no pids hierarchy
    proc["/proc/self/mountinfo"] = mounts.replace("cgroup cgroup", "cgroup2 cgroup2")
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None  # v2 mounts are not v1's
    proc["/proc/self/mountinfo"] = mounts
    proc["/proc/self/cgroup"] = "5:memory:/c1\n"
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None  # not in a pids group
    proc["/proc/self/cgroup"] = "5:memory:/elsewhere\n4:pids:/p\n"
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None  # no such folder: not writable
    proc["/proc/self/mountinfo"] = mounts.replace(" / ", " /docker ", 1)
    proc["/proc/self/cgroup"] = "5:memory:/c1\n4:pids:/p\n"
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None  # its group is outside the mount
    proc["/proc/self/mountinfo"] = mounts
    proc["/proc/self/cgroup"] = "5:memory:/c1\n4:pids:/p\n"
    monkeypatch.setattr(sl.os, "access", lambda p, m: "/pids/" not in str(p) + "/")
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None
    assert sorted(os.listdir(mem)) == [] and sorted(os.listdir(pids)) == []


def test_a_v1_cgroup_that_cannot_be_made_or_limited_is_removed(tmp_path, proc, monkeypatch):
    mem, pids = v1_setup(tmp_path, proc)
    (pids / "hl-sbx-1-2-ab").write_text("")  # its pids folder cannot be made
    assert sl.Cgroup._v1("hl-sbx-1-2-ab", 1, 1) is None
    assert not (mem / "hl-sbx-1-2-ab").exists()  # the memory one made before it is gone
    real = sl._write
    removed: list[list[str]] = []
    monkeypatch.setattr(
        sl.Cgroup, "remove", lambda self, timeout_s=5.0: removed.append(self.folders)
    )
    for n, refused in enumerate(("memory.limit_in_bytes", "pids.max")):
        monkeypatch.setattr(sl, "_write", lambda p, v, r=refused: not p.endswith(r) and real(p, v))
        assert sl.Cgroup._v1(f"hl-sbx-1-2-{n}", 1, 1) is None, refused
        assert removed == [[str(mem / f"hl-sbx-1-2-{n}"), str(pids / f"hl-sbx-1-2-{n}")]]
        removed.clear()


def test_create_tries_v2_then_v1_and_names_the_group_after_its_outer(monkeypatch) -> None:
    tried: list[tuple[str, str, int, int]] = []

    def fake(kind, result):
        def make(name, memory_bytes, pids):
            tried.append((kind, name, memory_bytes, pids))
            if isinstance(result, Exception):
                raise result
            return result

        return make

    v1 = sl.Cgroup("v1", {})
    monkeypatch.setattr(sl.Cgroup, "_v2", staticmethod(fake("v2", None)))
    monkeypatch.setattr(sl.Cgroup, "_v1", staticmethod(fake("v1", v1)))
    assert sl.Cgroup.create(10, 20) is v1
    assert [t[0] for t in tried] == ["v2", "v1"] and tried[0][1:] == tried[1][1:]
    pid = os.getpid()
    name = tried[0][1]
    assert name.startswith(f"{sl.PREFIX}{pid}-{sl.start_time(pid)}-") and sl._owner_alive(name)
    assert tried[0][2:] == (10, 20)
    tried.clear()
    monkeypatch.setattr(sl.Cgroup, "_v2", staticmethod(fake("v2", OSError("no"))))
    monkeypatch.setattr(sl.Cgroup, "_v1", staticmethod(fake("v1", OSError("no"))))
    assert sl.Cgroup.create(10, 20) is None and len(tried) == 2
    v2 = sl.Cgroup("v2", {})
    monkeypatch.setattr(sl.Cgroup, "_v2", staticmethod(fake("v2", v2)))
    assert sl.Cgroup.create(10, 20) is v2


# -- a cgroup's counters, members, kill and removal -------------------------------------------------


def test_hits_are_the_kernels_counters_of_each_kind(tmp_path: Path) -> None:
    mem, pids = tmp_path / "m", tmp_path / "p"
    mem.mkdir()
    pids.mkdir()
    v1 = sl.Cgroup("v1", {"memory": str(mem), "pids": str(pids)})
    v2 = sl.Cgroup("v2", {"memory": str(mem), "pids": str(mem)})
    assert v1.hits() == [] and v2.hits() == []
    (mem / "memory.events").write_text("oom 2\noom_kill 1\n")
    assert v2.hits() == ["memory"] and v1.hits() == []  # v1 reads memory.oom_control
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert v1.hits() == ["memory"]
    (pids / "pids.events").write_text("max 0\n")
    assert v1.hits() == ["memory"]
    (pids / "pids.events").write_text("max 4\n")
    assert v1.hits() == ["memory", "pids"]
    (mem / "memory.oom_control").write_text("oom_kill 0\n")
    assert v1.hits() == ["pids"]


def test_pids_are_every_member_of_every_folder_once(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "cgroup.procs").write_text("12\n7\n")
    (b / "cgroup.procs").write_text("7\n3\nx\n")
    group = sl.Cgroup("v1", {"memory": str(a), "pids": str(b)})
    assert group.folders == [str(a), str(b)]
    assert group.pids() == [3, 7, 12]
    assert sl.Cgroup("v2", {"memory": str(a), "pids": str(a)}).folders == [str(a)]


def test_add_writes_the_pid_into_every_folder(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert sl.Cgroup("v1", {"memory": str(a), "pids": str(b)}).add(42)
    assert (a / "cgroup.procs").read_text() == "42" == (b / "cgroup.procs").read_text()
    assert not sl.Cgroup("v1", {"memory": str(a), "pids": str(tmp_path / "gone")}).add(42)


def test_kill_uses_cgroup_kill_on_v2_else_signals_every_member(tmp_path, monkeypatch) -> None:
    killed: list[tuple[int, int]] = []

    def kill(pid, sig):
        killed.append((pid, sig))
        if pid == 5:
            raise ProcessLookupError

    monkeypatch.setattr(sl.os, "kill", kill)
    (tmp_path / "cgroup.procs").write_text("5\n9\n")
    sl.Cgroup("v2", {"memory": str(tmp_path), "pids": str(tmp_path)}).kill()
    assert (tmp_path / "cgroup.kill").read_text() == "1" and killed == []
    sl.Cgroup("v1", {"memory": str(tmp_path), "pids": str(tmp_path)}).kill()
    assert killed == [(5, signal.SIGKILL), (9, signal.SIGKILL)]
    killed.clear()
    gone = tmp_path / "gone"  # an older v2 kernel without cgroup.kill: the members one by one
    monkeypatch.setattr(sl, "_read", lambda p: "9\n" if p.endswith("cgroup.procs") else "")
    sl.Cgroup("v2", {"memory": str(gone), "pids": str(gone)}).kill()
    assert killed == [(9, signal.SIGKILL)]


def test_remove_kills_until_the_folder_empties_or_gives_up_at_the_timeout(tmp_path, monkeypatch):
    kills = []
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "member").write_text("")  # a cgroup with a process cannot be removed
    group = sl.Cgroup("v1", {"memory": str(folder), "pids": str(folder)})

    def kill(self):
        kills.append(1)
        if len(kills) == 3:
            (folder / "member").unlink()

    monkeypatch.setattr(sl.Cgroup, "kill", kill)
    assert group.remove() and not folder.exists() and len(kills) == 3
    assert group.remove()  # already gone
    folder.mkdir()
    (folder / "member").write_text("")
    kills.clear()
    monkeypatch.setattr(sl.Cgroup, "kill", lambda self: kills.append(1))
    started = time.monotonic()
    assert group.remove(timeout_s=0.2) is False and folder.exists()
    assert 0.2 <= time.monotonic() - started < 3 and kills


def test_remove_waits_5_seconds_by_default_sleeping_20_ms_between_tries(tmp_path, monkeypatch):
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "member").write_text("")
    clock, slept, kills = [0.0], [], []

    def monotonic() -> float:
        clock[0] += 1.0
        return clock[0]

    monkeypatch.setattr(sl, "time", SimpleNamespace(monotonic=monotonic, sleep=slept.append))
    monkeypatch.setattr(sl.Cgroup, "kill", lambda self: kills.append(1))
    group = sl.Cgroup("v1", {"memory": str(folder), "pids": str(folder)})
    assert group.remove() is False
    # deadline 1 + 5 = 6: tries at 2, 3, 4, 5, 6 (not past it), gives up at 7
    assert len(kills) == 5 and slept == [0.02] * 5


def test_sweep_cgroups_removes_only_dead_outers_groups(tmp_path: Path) -> None:
    pid = os.getpid()
    live = tmp_path / f"{sl.PREFIX}{pid}-{sl.start_time(pid)}-aa"
    dead = tmp_path / f"{sl.PREFIX}{2**22 + 3}-5-bb"
    busy = tmp_path / f"{sl.PREFIX}{2**22 + 4}-5-cc"
    other = tmp_path / "user-group"
    for d in (live, dead, busy, other):
        d.mkdir()
    (busy / "member").write_text("")  # still holds processes: stays
    sl.sweep_cgroups([str(tmp_path / "missing"), str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, busy.name, other.name])


# -- rlimits --------------------------------------------------------------------------------------


@pytest.fixture
def rlimits(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, int]]:
    hard = {resource.RLIMIT_NOFILE: (1024, 4096)}
    set_: dict[int, tuple[int, int]] = {}
    monkeypatch.setattr(
        sl.resource,
        "getrlimit",
        lambda w: hard.get(w, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)),
    )
    monkeypatch.setattr(sl.resource, "setrlimit", lambda w, v: set_.__setitem__(w, v))
    return set_


LIMITS = SimpleNamespace(file_mb=8, cpu_s=30, open_files=9000, pids=64, memory_mb=512)


def test_rlimits_are_set_only_where_the_plan_says_rlimit(rlimits) -> None:
    sl.apply_rlimits(LIMITS, {"file": "rlimit", "cpu": "rlimit", "pids": "cgroup v1",
                              "memory": "cgroup v1", "open_files": "rlimit"})  # fmt: skip
    assert rlimits == {
        resource.RLIMIT_CORE: (0, 0),  # always: no core files
        resource.RLIMIT_FSIZE: (8 << 20, 8 << 20),
        resource.RLIMIT_CPU: (30, 35),  # SIGXCPU at the soft limit, SIGKILL 5 s later
        resource.RLIMIT_NOFILE: (4096, 4096),  # never above the hard limit
    }
    rlimits.clear()
    sl.apply_rlimits(LIMITS, {"pids": "rlimit", "memory": "rlimit"})
    assert rlimits == {
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_NPROC: (64, 64),
        resource.RLIMIT_DATA: (512 << 20, 512 << 20),
    }


def test_the_limit_a_process_died_of_is_read_from_its_signal() -> None:
    lim = SimpleNamespace(cpu_s=10)
    assert sl.signal_limit(0, 100.0, lim) == ""  # exited
    assert sl.signal_limit(1 << 8, 100.0, lim) == ""  # exit code 1
    assert sl.signal_limit(signal.SIGXCPU, 0.0, lim) == "cpu"
    assert sl.signal_limit(signal.SIGKILL, 9.5, lim) == "cpu"  # the hard limit's kill
    assert sl.signal_limit(signal.SIGKILL, 9.4, lim) == ""  # killed otherwise
    assert sl.signal_limit(signal.SIGXFSZ, 0.0, lim) == "file_size"
    assert sl.signal_limit(signal.SIGSEGV, 100.0, lim) == ""


# -- scratch folders ---------------------------------------------------------------------------


def locked_elsewhere(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_scratch_folder_is_private_and_owned_by_its_lock(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    s = sl.Scratch(str(root))
    path, lock = Path(s.path), Path(s.lock)
    assert path.parent == root and path.name.startswith("sbx-") and len(path.name) == 16
    assert lock == root / (path.name + ".lock") and locked_elsewhere(lock)
    assert path.stat().st_mode & 0o777 == 0o700 and root.stat().st_mode & 0o777 == 0o700
    assert lock.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in root.iterdir()) == sorted([path.name, lock.name])  # no temp
    assert not os.get_inheritable(s.lock_fd)
    assert sl.sweep(str(root)) == [] and path.exists()  # a live one is never swept
    s.remove()
    assert list(root.iterdir()) == []
    with pytest.raises(OSError):
        os.fstat(s.lock_fd)
    s.remove()  # twice is harmless
    t = sl.Scratch(str(root), inheritable=True)
    assert os.get_inheritable(t.lock_fd)
    t.remove()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_new_scratch_folder_sweeps_the_dead_ones_first(tmp_path: Path) -> None:
    (tmp_path / "sbx-dead").mkdir()
    (tmp_path / "sbx-dead.lock").write_text("")
    s = sl.Scratch(str(tmp_path))
    assert not (tmp_path / "sbx-dead").exists() and not (tmp_path / "sbx-dead.lock").exists()
    s.remove()


def test_a_temporary_lock_name_another_sandbox_holds_is_never_shared(tmp_path, monkeypatch):
    temp = tmp_path / ".sbx-000000000000.lock"
    temp.write_text("")
    held = os.open(temp, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # another sandbox between its open and its link
    monkeypatch.setattr(sl.os, "urandom", lambda n: bytes(n))
    try:
        with pytest.raises(FileExistsError):
            sl.Scratch(str(tmp_path))
    finally:
        os.close(held)


def test_a_scratch_name_taken_meanwhile_is_drawn_again(tmp_path, monkeypatch) -> None:
    root = tmp_path / "scratch"
    root.mkdir()
    (root / "sbx-000000000000.lock").write_text("")  # another sandbox's lock, held below
    held = os.open(root / "sbx-000000000000.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    draws = iter([bytes(6), bytes(6), b"\x01" * 6])
    monkeypatch.setattr(sl.os, "urandom", lambda n: next(draws))
    fds = open_fds()
    s = sl.Scratch(str(root))
    assert open_fds() == fds + 1  # its lock only: the refused draws' descriptors are closed
    assert s.path == str(root / "sbx-010101010101")
    assert sorted(p.name for p in root.iterdir()) == [
        "sbx-000000000000.lock", "sbx-010101010101", "sbx-010101010101.lock"
    ]  # fmt: skip
    os.close(held)
    s.remove()


def test_sweep_removes_only_what_no_live_sandbox_owns(tmp_path: Path) -> None:
    root = tmp_path
    live = sl.Scratch(str(root))
    dead = root / "sbx-dead"  # its lock is not held: its outer was SIGKILLed
    dead.mkdir()
    (dead / "x").write_text("")
    (root / "sbx-dead.lock").write_text("")
    old = root / "sbx-old"  # no lock at all (an older version), an hour old
    old.mkdir()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fresh = root / "sbx-fresh"  # lock-less and fresh: between its mkdir and its lock
    fresh.mkdir()
    other = root / "mine"  # not a sandbox's, however old
    other.mkdir()
    os.utime(other, (time.time() - 3600, time.time() - 3600))
    (root / "mine.lock").write_text("")  # nor a lock beside a folder of another name
    (root / "notes.txt").write_text("")  # nor a file of another name
    (root / "sbx-file").write_text("")  # a file where a folder was expected: no error
    os.utime(root / "sbx-file", (time.time() - 3600, time.time() - 3600))
    (root / "sbx-gone.lock").write_text("")  # a lock whose folder is gone
    (root / ".sbx-tmp.lock").write_text("")  # a temporary lock name left by a killed outer
    os.utime(root / ".sbx-tmp.lock", (time.time() - 61, time.time() - 61))  # (over a minute old)
    (root / "sbx-held.lock").write_text("")  # a folder-less lock still held: a sandbox starting
    held = os.open(root / "sbx-held.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    fds = open_fds()
    try:
        removed = sl.sweep(str(root))
    finally:
        os.close(held)
    assert open_fds() == fds - 1  # every lock it opened is closed again (and `held` here)
    assert sorted(removed) == sorted([str(dead), str(old), str(root / "sbx-file")])
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [Path(live.path).name, Path(live.lock).name, "sbx-fresh", "mine", "sbx-held.lock",
         "notes.txt", "sbx-file", "mine.lock"]
    )  # fmt: skip
    assert fresh.exists() and locked_elsewhere(Path(live.lock))
    live.remove()
    assert sl.sweep(str(tmp_path / "missing")) == []


def test_a_lockless_folder_is_fresh_for_60_seconds(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "sbx-x"
    folder.mkdir()
    os.utime(folder, (1000, 1000))
    for now, kept in ((1059.5, True), (1060.0, False)):
        monkeypatch.setattr(sl.time, "time", lambda now=now: now)
        assert (sl.sweep(str(tmp_path)) == []) is kept, now
        assert folder.exists() is kept


def test_a_temporary_lock_is_fresh_for_60_seconds(tmp_path, monkeypatch) -> None:
    """Its creator may not have locked it yet (a sandbox starting beside this one)."""
    tmp = tmp_path / ".sbx-x.lock"
    tmp.write_text("")
    os.utime(tmp, (1000, 1000))
    for now, kept in ((1059.5, True), (1060.0, False)):
        monkeypatch.setattr(sl.time, "time", lambda now=now: now)
        sl.sweep(str(tmp_path))
        assert tmp.exists() is kept, now


def test_sweep_skips_a_folder_whose_lock_it_cannot_open(tmp_path, monkeypatch) -> None:
    (tmp_path / "sbx-a").mkdir()
    (tmp_path / "sbx-a.lock").write_text("")
    real = os.open

    def refuse(path, flags, *a):
        if str(path).endswith("sbx-a.lock"):
            raise PermissionError(13, "refused")
        return real(path, flags, *a)

    monkeypatch.setattr(sl.os, "open", refuse)
    assert sl.sweep(str(tmp_path)) == [] and (tmp_path / "sbx-a").exists()

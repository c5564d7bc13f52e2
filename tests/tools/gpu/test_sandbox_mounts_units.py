"""The sandbox's namespaces and mounts (tools/gpu/isolation/sandbox_mounts.py) in this process,
with unshare(2) and mount(2) recorded instead of made: which namespaces are asked for and what
is said when the kernel refuses, which folders are hidden and which paths bound back, in what
order the reaper's mount namespace is built. (tests/tools/gpu/test_sandbox_bind.py runs the
real thing; these pin each rule where a mutant of the staged copy would go unseen.)"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harnesslab.tools.gpu.isolation import sandbox_mounts as sm

# Linux's values (sched.h, sys/mount.h): the flags are the kernel's ABI, not ours to choose.
LINUX = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWIPC": 0x08000000, "MS_NOSUID": 2, "MS_NODEV": 4,
    "MS_NOEXEC": 8, "MS_REC": 16384, "MS_PRIVATE": 262144, "MS_BIND": 4096,
}  # fmt: skip


def test_the_flags_are_linuxs() -> None:
    assert {name: getattr(sm, name) for name in LINUX} == LINUX
    assert sm.NAMESPACES == {"pid": 0x20000000, "net": 0x40000000, "ipc": 0x08000000,
                             "mnt": 0x00020000}  # fmt: skip


class Kernel:
    """unshare(2) and mount(2) as recorded calls, each answering from a list (default: yes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, unshare=(), mount=()) -> None:
        self.unshared: list[int] = []
        self.mounts: list[tuple] = []
        self.unshare_answers, self.mount_answers = list(unshare), list(mount)
        monkeypatch.setattr(sm, "_unshare", self.unshare)
        monkeypatch.setattr(sm, "_mount", self.mount)

    def unshare(self, flags: int) -> bool:
        self.unshared.append(flags)
        return self.unshare_answers.pop(0) if self.unshare_answers else True

    def mount(self, src, target, fstype, flags, data) -> bool:
        self.mounts.append((src, target, fstype, flags, data))
        return self.mount_answers.pop(0) if self.mount_answers else True


# -- namespaces -------------------------------------------------------------------------------------
def as_user(monkeypatch: pytest.MonkeyPatch, uid: int, fail_write: bool = False) -> dict:
    written: dict[str, str] = {}

    class File:
        def __init__(self, path: str, mode: str) -> None:
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> bool:
            return False

        def write(self, text: str) -> None:
            if fail_write:
                raise PermissionError(self.path)
            written[self.path] = text

    monkeypatch.setattr(os, "getuid", lambda: uid)
    monkeypatch.setattr(os, "getgid", lambda: uid + 1)
    monkeypatch.setattr(sm, "open", File, raising=False)
    return written


def test_root_asks_for_pid_net_and_ipc_the_reaper_makes_the_mount_namespace(monkeypatch) -> None:
    as_user(monkeypatch, 0)
    kernel = Kernel(monkeypatch)
    assert sm.enter_namespaces() == ["pid", "net", "ipc", "mnt"]
    assert kernel.unshared == [0x20000000 | 0x40000000 | 0x08000000]
    kernel.unshared.clear()
    assert sm.enter_namespaces(["net", "mnt"]) == ["net", "mnt"]
    assert kernel.unshared == [0x40000000]


def test_a_refused_unshare_falls_back_to_a_network_namespace_then_to_none(monkeypatch) -> None:
    as_user(monkeypatch, 0)
    kernel = Kernel(monkeypatch, unshare=[False, True])
    assert sm.enter_namespaces() == ["net"]
    assert kernel.unshared == [0x20000000 | 0x40000000 | 0x08000000, 0x40000000]
    Kernel(monkeypatch, unshare=[False, False])
    assert sm.enter_namespaces() == []


def test_a_user_maps_itself_in_a_user_namespace_first(monkeypatch) -> None:
    written = as_user(monkeypatch, 1000)
    kernel = Kernel(monkeypatch)
    assert sm.enter_namespaces(["pid"]) == ["pid", "user"]
    assert kernel.unshared == [0x10000000, 0x20000000]
    assert written == {"/proc/self/setgroups": "deny", "/proc/self/uid_map": "1000 1000 1",
                       "/proc/self/gid_map": "1001 1001 1"}  # fmt: skip
    Kernel(monkeypatch, unshare=[True, False, True])
    assert sm.enter_namespaces(["pid"]) == ["net", "user"]
    Kernel(monkeypatch, unshare=[False])
    assert sm.enter_namespaces(["pid"]) == []


def test_a_user_that_cannot_map_itself_gets_no_namespace(monkeypatch) -> None:
    as_user(monkeypatch, 1000, fail_write=True)
    kernel = Kernel(monkeypatch)
    assert sm.enter_namespaces(["pid"]) == []
    assert kernel.unshared == [0x10000000]


# -- hiding the sockets' folders --------------------------------------------------------------------
HIDDEN = ["/tmp", "/var/tmp", "/run", "/dev/shm", "/root", "/home"]


def test_every_sockets_folder_gets_an_empty_tmpfs(monkeypatch) -> None:
    kernel = Kernel(monkeypatch, mount=[True, False])  # the second one refused: not in `done`
    monkeypatch.setattr(os.path, "isdir", lambda p: True)
    monkeypatch.setattr(os.path, "islink", lambda p: p == "/root")  # a link is not hidden
    done = sm._hide_sockets([])
    tmpfs = [m for m in kernel.mounts if m[2] == b"tmpfs"]
    assert [m[1] for m in tmpfs] == [h for h in HIDDEN if h != "/root"]
    assert done == [h for h in HIDDEN if h not in ("/root", "/var/tmp")]
    assert {(m[0], m[3], m[4]) for m in tmpfs} == {(b"tmpfs", 2 | 4, b"mode=1777,size=1m")}


def test_kept_paths_under_a_hidden_folder_are_bound_back_once(monkeypatch, tmp_path) -> None:
    assert str(tmp_path).startswith("/tmp/")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    kernel = Kernel(monkeypatch)
    fds = len(os.listdir("/proc/self/fd"))
    keep = [str(tmp_path / "a" / "b"), str(tmp_path / "link"), str(tmp_path / "f.txt"),
            str(tmp_path / "missing"), "/usr"]  # fmt: skip
    sm._hide_sockets(keep)
    binds = [m for m in kernel.mounts if m[2] is None]
    # /tmp/.../a (through the link) covers a/b; the file is bound itself; what is missing or
    # outside the hidden folders is not.
    assert [m[1] for m in binds] == [str(tmp_path / "a"), str(tmp_path / "f.txt")]
    assert all(m[0].startswith(b"/proc/self/fd/") and m[3] == 4096 | 16384 for m in binds)
    assert len(os.listdir("/proc/self/fd")) == fds  # every descriptor closed


def test_a_path_that_cannot_be_bound_back_is_an_error(monkeypatch, tmp_path) -> None:
    Kernel(monkeypatch, mount=[True] * 6 + [False])
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="bind /tmp/"):
        sm._hide_sockets([str(tmp_path)])
    assert len(os.listdir("/proc/self/fd")) == fds


# -- binds --------------------------------------------------------------------------------------------
def test_binds_open_folders_only_and_close_what_they_opened_on_failure(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        sm._open_binds([(str(tmp_path / "d"), "/x"), (str(tmp_path / "f"), "/y")])
    assert len(os.listdir("/proc/self/fd")) == fds
    opened = sm._open_binds([(str(tmp_path / "d"), "/x")])
    assert [t for _, t in opened] == ["/x"]
    sm._close_binds(opened)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_binds_mount_at_their_targets_in_order_never_through_a_link(monkeypatch, tmp_path) -> None:
    for name in ("src", "t1", "t2", "real"):
        (tmp_path / name).mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    kernel = Kernel(monkeypatch, mount=[True, True, False])
    opened = sm._open_binds([(str(tmp_path / "src"), str(tmp_path / t)) for t in ("t1", "t2")])
    sm._mount_binds(opened)
    assert [(m[2], m[3]) for m in kernel.mounts] == [(None, 4096 | 16384)] * 2
    assert [m[0] for m in kernel.mounts] == [f"/proc/self/fd/{fd}".encode() for fd, _ in opened]
    with pytest.raises(OSError, match="bind at"):
        sm._mount_binds(opened[:1])
    with pytest.raises(OSError):
        sm._mount_binds([(opened[0][0], str(tmp_path / "linked"))])
    sm._close_binds(opened)


def test_a_bind_target_is_judged_as_written_and_as_resolved(monkeypatch, tmp_path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "to_scratch").symlink_to(scratch)
    (tmp_path / "to_proc").symlink_to("/proc")
    assert "holds the scratch" in sm.bind_refusal([("/s", str(tmp_path / "to_scratch"))],
                                                  str(scratch))  # fmt: skip
    assert "under /proc" in sm.bind_refusal([("/s", str(tmp_path / "to_proc"))], str(scratch))
    assert "lies in the scratch" in sm.bind_refusal([("/s", f"{scratch}/x/../y")], str(scratch))
    assert sm.bind_refusal([("/s", f"{tmp_path}/")], str(scratch)).endswith(
        "holds the scratch folder"
    )
    ok = [("/s", str(tmp_path / "other")), ("/t", "/work")]
    assert sm.bind_refusal(ok, str(scratch)) == ""
    assert "holds" in sm.bind_refusal([*ok, ("/s", str(scratch))], str(scratch))  # any one

    realpath = os.path.realpath

    def unresolvable(path: str) -> str:
        if path == "/loop":
            raise OSError(40, "too many links")
        return realpath(path)

    monkeypatch.setattr(os.path, "realpath", unresolvable)
    assert sm.bind_refusal([*ok, ("/s", "/loop")], str(scratch)).startswith(
        "bind target /loop cannot be resolved")  # fmt: skip


# -- the reaper's mount namespace ---------------------------------------------------------------------
def policy(tmp_path: Path, **over) -> SimpleNamespace:
    fields = dict(bind=[], read=[], write=[], python_path=[], triton_cache="",
                  limits=SimpleNamespace(scratch_mb=64))  # fmt: skip
    return SimpleNamespace(**{**fields, **over})


def test_the_reaper_namespace_is_private_then_proc_then_views_then_scratch(
    monkeypatch, tmp_path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "prog.py").write_text("")
    kept: list[list[str]] = []
    monkeypatch.setattr(sm, "_hide_sockets", lambda keep: kept.append(keep) or [])
    kernel = Kernel(monkeypatch)
    scratch = str(tmp_path / "scratch")
    pol = policy(tmp_path, bind=[(str(tmp_path / "src"), str(tmp_path / "target"))],
                 read=["/r"], write=["/w"], python_path=["/p"], triton_cache=str(tmp_path / "cache"))  # fmt: skip
    sm.setup_mounts(pol, scratch, ["python", str(tmp_path / "prog.py"), "/nonexistent"], True)
    assert kernel.unshared == [0x00020000]
    assert kernel.mounts[0] == (b"none", "/", None, 16384 | 262144, None)
    assert kernel.mounts[1] == (b"proc", "/proc", b"proc", 2 | 4 | 8, None)
    assert kernel.mounts[2][1].startswith("/proc/self/fd/")  # the view
    assert kernel.mounts[3] == (b"tmpfs", scratch, b"tmpfs", 2 | 4, b"size=64m,mode=0700")
    (keep,) = kept
    assert keep[:4] == [scratch, "/r", "/w", "/p"]
    assert str(tmp_path / "prog.py") in keep and "/nonexistent" not in keep
    assert "python" not in keep  # not a path
    assert keep[-2:] == [str(tmp_path / "target"), str(tmp_path / "cache")]


def test_without_a_pid_namespace_proc_is_left_and_no_cache_no_view_is_kept(
    monkeypatch, tmp_path
) -> None:
    kept: list[list[str]] = []
    monkeypatch.setattr(sm, "_hide_sockets", lambda keep: kept.append(keep) or [])
    kernel = Kernel(monkeypatch)
    sm.setup_mounts(policy(tmp_path), str(tmp_path), [], False)
    assert [m[0] for m in kernel.mounts] == [b"none", b"tmpfs"]
    assert kept[0][0] == str(tmp_path) and "" not in kept[0]


def test_a_namespace_or_scratch_the_kernel_refuses_is_an_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sm, "_hide_sockets", lambda keep: [])
    Kernel(monkeypatch, unshare=[False])
    with pytest.raises(OSError, match="private mount namespace"):
        sm.setup_mounts(policy(tmp_path), str(tmp_path), [], False)
    Kernel(monkeypatch, mount=[False])
    with pytest.raises(OSError, match="private mount namespace"):
        sm.setup_mounts(policy(tmp_path), str(tmp_path), [], False)
    Kernel(monkeypatch, mount=[True, False])
    with pytest.raises(OSError, match="scratch tmpfs"):
        sm.setup_mounts(policy(tmp_path), str(tmp_path), [], False)


def test_the_views_descriptors_are_closed_even_when_mounting_fails(monkeypatch, tmp_path) -> None:
    (tmp_path / "src").mkdir()
    monkeypatch.setattr(sm, "_hide_sockets", lambda keep: [])
    Kernel(monkeypatch, mount=[True, False])
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="bind at"):
        sm.setup_mounts(policy(tmp_path, bind=[(str(tmp_path / "src"), str(tmp_path))]),
                        str(tmp_path / "scratch"), [], False)  # fmt: skip
    assert len(os.listdir("/proc/self/fd")) == fds


def o_path(proc_fd: str | bytes) -> bool:
    """Whether the descriptor /proc/self/fd/N was opened O_PATH (it opens a socket or a folder
    it may not read; it can be no more than a mount's source or target)."""
    fd = int(os.fsdecode(proc_fd).rsplit("/", 1)[1])
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH)


def test_the_syscalls_answer_whether_the_kernel_said_zero(monkeypatch) -> None:
    class Libc:
        answer = 0

        def unshare(self, flags):
            return self.answer

        def mount(self, *args):
            return self.answer

    libc = Libc()
    monkeypatch.setattr(sm, "_libc", libc)
    assert sm._unshare(0) is True and sm._mount(b"a", "/b", None, 0, None) is True
    libc.answer = -1
    assert sm._unshare(0) is False and sm._mount(b"a", "/b", None, 0, None) is False
    libc.answer = 1
    assert sm._unshare(0) is False and sm._mount(b"a", "/b", None, 0, None) is False


def test_only_real_folders_are_hidden_and_paths_are_bound_back_as_o_path(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(os.path, "isdir", lambda p: p != "/run")  # /run a file: not hidden
    seen: list[bool] = []
    kernel = Kernel(monkeypatch)
    real_mount = kernel.mount

    def mount(src, target, fstype, flags, data):
        if fstype is None:
            seen.append(o_path(src))
        return real_mount(src, target, fstype, flags, data)

    monkeypatch.setattr(sm, "_mount", mount)
    sm._hide_sockets(["/tmp", str(tmp_path), str(tmp_path)])
    assert "/run" not in [m[1] for m in kernel.mounts if m[2] == b"tmpfs"]
    assert [m[1] for m in kernel.mounts if m[2] is None] == ["/tmp"]  # /tmp itself, once
    assert seen == [True]
    kernel.mounts.clear()
    sm._hide_sockets([str(tmp_path), str(tmp_path)])  # the same path twice: bound once
    assert [m[1] for m in kernel.mounts if m[2] is None] == [str(tmp_path)]


def test_a_kept_path_gets_a_mount_point_in_the_empty_tmpfs(monkeypatch, tmp_path) -> None:
    hid = tmp_path / "hid"
    (hid / "d" / "sub").mkdir(parents=True)
    (hid / "f").mkdir()
    (hid / "f" / "x.sock").write_text("")
    monkeypatch.setattr(sm, "HIDDEN", (str(hid),))
    points: list[tuple[str, bool, bool]] = []

    def mount(src, target, fstype, flags, data):
        if fstype == b"tmpfs":  # the folder as the tmpfs leaves it: empty
            hid.rename(tmp_path / "was")
            hid.mkdir()
        else:
            points.append((target, os.path.isdir(target), os.path.isfile(target)))
        return True

    monkeypatch.setattr(sm, "_mount", mount)
    sm._hide_sockets([str(hid / "d" / "sub"), str(hid / "f" / "x.sock")])
    assert points == [
        (str(hid / "d" / "sub"), True, False),
        (str(hid / "f" / "x.sock"), False, True),
    ]


def test_a_bind_target_anywhere_under_proc_is_refused(tmp_path) -> None:
    assert "under /proc" in sm.bind_refusal([("/s", "/proc/sys")], str(tmp_path))


def test_a_relative_argument_is_no_path_to_keep(monkeypatch, tmp_path) -> None:
    (tmp_path / "prog.py").write_text("")
    monkeypatch.chdir(tmp_path)
    kept: list[list[str]] = []
    monkeypatch.setattr(sm, "_hide_sockets", lambda keep: kept.append(keep) or [])
    Kernel(monkeypatch)
    sm.setup_mounts(policy(tmp_path), str(tmp_path / "scratch"), ["prog.py"], False)
    assert "prog.py" not in kept[0]


def test_views_are_opened_and_mounted_as_o_path(monkeypatch, tmp_path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    seen: list[tuple[bool, bool]] = []

    def mount(src, target, fstype, flags, data):
        seen.append((o_path(src), o_path(target)))
        return True

    monkeypatch.setattr(sm, "_mount", mount)
    opened = sm._open_binds([(str(tmp_path / "src"), str(tmp_path / "dst"))])
    sm._mount_binds(opened)
    sm._close_binds(opened)
    assert seen == [(True, True)]

"""The sandbox's namespaces and mounts (sandbox.py's outer enters the namespaces, its reaper
makes the mount namespace): new PID/net/IPC namespaces (a user namespace first when not root),
then a private mount namespace with its own /proc, the folders where unix sockets live hidden
under empty tmpfs mounts, the policy's views (`bind`) and the scratch folder a tmpfs of the
policy's size.

Side of the trust boundary: trusted, staged beside sandbox.py (standard library + ctypes only,
never harnesslab); it runs in the sandbox's outer and reaper processes, before the target.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import sandbox_confine as sc
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import sandbox_confine as sc

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE, MS_BIND = 2, 4, 8, 16384, 1 << 18, 4096
_libc = sc.libc


def _unshare(flags: int) -> bool:
    return _libc.unshare(ctypes.c_int(flags)) == 0


NAMESPACES = {"pid": CLONE_NEWPID, "net": CLONE_NEWNET, "ipc": CLONE_NEWIPC, "mnt": CLONE_NEWNS}


def enter_namespaces(wanted: list[str] | None = None) -> list[str]:
    """New PID/net/IPC/mount namespaces (or the `wanted` ones) for the children of this process
    (a user namespace first when not root). Returns the names applied; empty where the kernel
    refuses."""
    uid, gid = os.getuid(), os.getgid()
    wanted = list(NAMESPACES) if wanted is None else wanted
    flags = 0
    for name in wanted:
        if name != "mnt":  # the reaper makes its own mount namespace: this process keeps the
            flags |= NAMESPACES[name]  # host's view (it removes the scratch folder at the end)
    if uid != 0:
        if not _unshare(CLONE_NEWUSER):
            return []
        try:
            with open("/proc/self/setgroups", "w") as fh:
                fh.write("deny")
            with open("/proc/self/uid_map", "w") as fh:
                fh.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as fh:
                fh.write(f"{gid} {gid} 1")
        except OSError:
            return []
    if _unshare(flags):
        return list(wanted) + (["user"] if uid != 0 else [])
    if _unshare(CLONE_NEWNET):  # some containers allow a network namespace only
        return ["net"] + (["user"] if uid != 0 else [])
    return []


# Folders where unix sockets live (agents, daemons, MPS): an empty tmpfs is mounted over each
# in the sandbox's mount namespace, with the policy's own paths under them bound back in.
HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/root", "/home")


def _hide_sockets(keep: list[str]) -> list[str]:
    """Mount an empty tmpfs over HIDDEN (a connect() to a pathname socket there finds nothing;
    Landlock before ABI 8 does not govern connect), then bind the kept paths back."""
    hidden = [h for h in HIDDEN if os.path.isdir(h) and not os.path.islink(h)]
    saved: list[tuple[str, int]] = []
    for path in keep:
        real = os.path.realpath(path)
        if any(real == h or real.startswith(h + "/") for h in hidden) and os.path.exists(real):
            saved.append((real, os.open(real, os.O_PATH | os.O_CLOEXEC)))
    done = []
    for h in hidden:
        if _mount(b"tmpfs", h, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777,size=1m"):
            done.append(h)
    bound: list[str] = []
    for real, fd in sorted(saved):
        try:
            if any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound):
                continue  # visible already: a folder above it was bound back
            bound.append(real)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(real, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(real), exist_ok=True)
                open(real, "a").close()
            if not _mount(f"/proc/self/fd/{fd}".encode(), real, None, MS_BIND | MS_REC, None):
                raise sc.oserror(f"bind {real}")
        finally:
            os.close(fd)
    return done


def _mount(src: bytes, target: str, fstype: bytes | None, flags: int, data: bytes | None) -> bool:
    return _libc.mount(src, target.encode(), fstype, ctypes.c_ulong(flags), data) == 0


def _private_mounts() -> bool:
    """Nothing mounted in this mount namespace propagates back to the host's (a shared "/",
    systemd's default, would carry the tmpfs mounts below to every process)."""
    return _mount(b"none", "/", None, MS_REC | MS_PRIVATE, None)


def _private_proc() -> bool:
    """In the new mount + PID namespace: a /proc that lists only this namespace's processes."""
    return _mount(b"proc", "/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def _open_binds(binds: Any) -> list[tuple[int, str]]:
    """(descriptor of SOURCE, TARGET) for each bind, opened before the sockets' folders are
    hidden (a SOURCE may sit in /tmp)."""
    out: list[tuple[int, str]] = []
    try:
        for source, target in binds:
            out.append((os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), target))
    except OSError:
        _close_binds(out)
        raise
    return out


def _close_binds(opened: list[tuple[int, str]]) -> None:
    for fd, _ in opened:
        os.close(fd)


def _mount_binds(opened: list[tuple[int, str]]) -> None:
    """Mount each opened SOURCE at its TARGET (an existing folder, its last component not a
    symlink), in order: a later TARGET may lie in an earlier one."""
    for fd, target in opened:
        tfd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            src, dst = f"/proc/self/fd/{fd}".encode(), f"/proc/self/fd/{tfd}"
            if not _mount(src, dst, None, MS_BIND | MS_REC, None):
                raise sc.oserror(f"bind at {target}")
        finally:
            os.close(tfd)


def bind_refusal(binds: Any, scratch: str) -> str:
    """Why these binds may not be applied with this scratch folder ('' when they may): a TARGET
    under /proc would undo the private /proc, one that is, holds or lies in the scratch folder
    the scratch tmpfs (both checked on the path as written and as resolved)."""
    scratch = os.path.realpath(scratch)
    for _, target in binds:
        try:
            paths = {os.path.normpath(target), os.path.realpath(target)}
        except OSError as exc:
            return f"bind target {target} cannot be resolved: {exc}"
        for path in paths:
            if path == "/proc" or path.startswith("/proc/"):
                return f"bind target {target} is under /proc"
            if path == scratch or scratch.startswith(path.rstrip("/") + "/"):
                return f"bind target {target} holds the scratch folder"
            if path.startswith(scratch + "/"):
                return f"bind target {target} lies in the scratch folder"
    return ""


def setup_mounts(policy: Any, scratch: str, argv: list[str], pidns: bool) -> None:
    """The reaper's mount namespace: private, its own /proc, sockets hidden, the policy's views
    (`bind`), the scratch folder a tmpfs of the policy's size (gone with the namespace, whatever
    happens to the outer)."""
    if not (_unshare(CLONE_NEWNS) and _private_mounts()):
        raise OSError("cannot make a private mount namespace")
    if pidns:
        _private_proc()
    binds = _open_binds(policy.bind)
    keep = [scratch, *policy.read, *policy.write, *policy.python_path, *sc.python_paths()]
    keep += [a for a in argv if os.path.isabs(a) and os.path.exists(a)]
    keep += [target for _, target in binds]
    if policy.triton_cache:
        keep.append(policy.triton_cache)
    try:
        _hide_sockets(keep)
        _mount_binds(binds)
    finally:
        _close_binds(binds)
    size = f"size={int(policy.limits.scratch_mb)}m,mode=0700".encode()
    if not _mount(b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV, size):
        raise sc.oserror("scratch tmpfs")


__all__ = ["NAMESPACES", "bind_refusal", "enter_namespaces", "setup_mounts"]

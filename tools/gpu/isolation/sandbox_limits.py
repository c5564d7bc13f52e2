"""Resource limits and leftovers of the sandbox: cgroups, rlimits, scratch folders.

Staged beside sandbox.py (standard library only); run by its trusted outer process and, for the
rlimits, by the target before exec. Three jobs:

- `Cgroup`: one cgroup per sandbox holding the reaper and everything it starts, with the memory
  (swap included) and pids limits. cgroup v2 where the sandbox may make one: the parent of the
  outer's own cgroup when it delegates memory and pids to its children (a systemd delegated
  slice, a container whose cgroup is writable; v2 forbids enabling controllers in a cgroup that
  has processes, so the outer's own cgroup cannot be the parent). Else the v1 memory and pids
  hierarchies, under the outer's own cgroup there. Else none (`Limits.cgroup = "off"` too). The
  outer reads its events (v2 memory.events/pids.events, v1 memory.oom_control/pids.events), so
  what decides "it hit a limit" is never the target's word; a limit hit ends the whole sandbox.
- `apply_rlimits`: file size, CPU time, open files, no core files; pids and memory where no
  cgroup holds them (see sandbox_policy.Limits for why not RLIMIT_AS, and never RLIMIT_DATA on
  a GPU host).
- `Scratch`: the private scratch folder `sbx-<random>` under the scratch root, owned through an
  exclusive flock on `sbx-<random>.lock` beside it (held by the outer and its reaper, released
  by the kernel when both are gone, whatever killed them). `sweep()` removes every folder whose
  lock nobody holds (a SIGKILLed outer's), never one of a live sandbox. Stale cgroups of dead
  outers are found by the pid and start time in their names (`hl-sbx-<pid>-<start>-<rand>`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import signal
import time
from typing import Any

PREFIX = "hl-sbx-"
V1_CONTROLLERS = ("memory", "pids")


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(value)
        return True
    except OSError:
        return False


def _field(text: str, key: str) -> int:
    """`key N` in a flat-keyed cgroup file."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when it is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        return stat.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return ""


def _owner_alive(name: str) -> bool:
    """Whether the outer named in a cgroup's name (`hl-sbx-<pid>-<start>-<rand>`) still runs."""
    parts = name[len(PREFIX) :].split("-")
    if len(parts) != 3 or not parts[0].isdigit():
        return False
    return start_time(int(parts[0])) == parts[1]


# ----------------------------------------------------------------------------------------------
# cgroups


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each cgroup mount of this process."""
    out = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) >= 5 and len(b) >= 3 and b[0] in ("cgroup", "cgroup2"):
            out.append((a[3], a[4], b[0], b[2]))
    return out


def _own(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of `controller` ('' = the v2 one)."""
    for line in _read("/proc/self/cgroup").splitlines():
        num, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if (controller == "" and num == "0" and names == "") or controller in names.split(","):
            return path
    return None


def _under(mount_root: str, mount_point: str, path: str) -> str | None:
    """The folder of cgroup `path` in a hierarchy mounted at `mount_point` from `mount_root`."""
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(mount_point, rel.lstrip("/"))


class Cgroup:
    """One sandbox's cgroup: `dirs` maps each controller to its folder (one folder for v2)."""

    def __init__(self, kind: str, dirs: dict[str, str]) -> None:
        self.kind, self.dirs = kind, dirs

    @property
    def folders(self) -> list[str]:
        return sorted(set(self.dirs.values()))

    @classmethod
    def create(cls, memory_bytes: int, pids: int) -> Cgroup | None:
        """A new cgroup with these limits, or None where this machine offers none."""
        name = f"{PREFIX}{os.getpid()}-{start_time(os.getpid())}-{os.urandom(4).hex()}"
        for make in (cls._v2, cls._v1):
            try:
                group = make(name, memory_bytes, pids)
            except OSError:
                group = None
            if group is not None:
                return group
        return None

    @classmethod
    def _v2(
        cls, name: str, memory_bytes: int, pids: int, place: tuple[str, str, str] | None = None
    ) -> Cgroup | None:
        """`place`: (mount root, mount point, own cgroup path); this process's by default."""
        if place is None:
            own = _own("")
            mount = next(((r, m) for r, m, t, _ in _mounts() if t == "cgroup2"), None)
            if own is None or mount is None:
                return None
            place = (mount[0], mount[1], own)
        here = _under(*place)
        if here is None or place[2] == "/":
            return None
        parent = os.path.dirname(here.rstrip("/"))
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
        if not {"memory", "pids"} <= set(enabled) or not os.access(parent, os.W_OK):
            return None
        sweep_cgroups([parent])
        path = os.path.join(parent, name)
        os.mkdir(path, 0o755)
        group = cls("v2", {"memory": path, "pids": path})
        ok = _write(f"{path}/memory.max", str(memory_bytes)) and _write(
            f"{path}/pids.max", str(pids)
        )
        _write(f"{path}/memory.swap.max", "0")
        _write(f"{path}/memory.oom.group", "1")  # an OOM kills the whole sandbox at once
        if not ok:
            group.remove()
            return None
        return group

    @classmethod
    def _v1(cls, name: str, memory_bytes: int, pids: int) -> Cgroup | None:
        dirs: dict[str, str] = {}
        for controller in V1_CONTROLLERS:
            own = _own(controller)
            mount = next(
                ((r, m) for r, m, t, opts in _mounts()
                 if t == "cgroup" and controller in opts.split(",")),
                None,
            )  # fmt: skip
            if own is None or mount is None:
                return None
            here = _under(mount[0], mount[1], own)
            if here is None or not os.access(here, os.W_OK):
                return None
            dirs[controller] = os.path.join(here, name)
        sweep_cgroups([os.path.dirname(d) for d in dirs.values()])
        group = cls("v1", {})
        for controller, path in dirs.items():
            try:
                os.mkdir(path, 0o755)
            except OSError:
                group.remove()
                return None
            group.dirs[controller] = path
        mem, pid = dirs["memory"], dirs["pids"]
        ok = _write(f"{mem}/memory.limit_in_bytes", str(memory_bytes))
        if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):  # swap counted too
            ok = ok and _write(f"{mem}/memory.memsw.limit_in_bytes", str(memory_bytes))
        ok = ok and _write(f"{pid}/pids.max", str(pids))
        if not ok:
            group.remove()
            return None
        return group

    def add(self, pid: int) -> bool:
        """Move `pid` (of this process's PID namespace) into the cgroup."""
        return all(_write(f"{d}/cgroup.procs", str(pid)) for d in self.folders)

    def hits(self) -> list[str]:
        """The limits hit so far, as the kernel counted them."""
        out = []
        mem, pid = self.dirs.get("memory", ""), self.dirs.get("pids", "")
        if self.kind == "v2":
            if _field(_read(f"{mem}/memory.events"), "oom_kill"):
                out.append("memory")
        elif _field(_read(f"{mem}/memory.oom_control"), "oom_kill"):
            out.append("memory")
        if _field(_read(f"{pid}/pids.events"), "max"):
            out.append("pids")
        return out

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.folders:
            found.update(int(x) for x in _read(f"{d}/cgroup.procs").split() if x.isdigit())
        return sorted(found)

    def kill(self) -> None:
        if self.kind == "v2" and _write(f"{self.folders[0]}/cgroup.kill", "1"):
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Kill what is left in it, wait for it to empty, remove it. False when it stayed."""
        deadline = time.monotonic() + timeout_s
        for d in self.folders:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    self.kill()
                    time.sleep(0.02)
        return True


def sweep_cgroups(parents: list[str]) -> None:
    """Remove the sandbox cgroups under `parents` whose outer process is gone (an outer that
    was SIGKILLed could not remove its own); a cgroup still holding processes stays."""
    for parent in parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if name.startswith(PREFIX) and not _owner_alive(name):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


# ----------------------------------------------------------------------------------------------
# rlimits (in the target, before exec)


def _lower(which: int, value: int) -> None:
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value if which != resource.RLIMIT_CPU else value + 5))


def apply_rlimits(limits: Any, enforced: dict[str, str]) -> None:
    """The rlimits `enforced` names (sandbox.plan_limits decided them), at `limits`' values."""
    mib = 1 << 20
    _lower(resource.RLIMIT_CORE, 0)
    if enforced.get("file") == "rlimit":
        _lower(resource.RLIMIT_FSIZE, limits.file_mb * mib)
    if enforced.get("cpu") == "rlimit":
        _lower(resource.RLIMIT_CPU, limits.cpu_s)
    if enforced.get("open_files") == "rlimit":
        _lower(resource.RLIMIT_NOFILE, limits.open_files)
    if enforced.get("pids") == "rlimit":
        _lower(resource.RLIMIT_NPROC, limits.pids)
    if enforced.get("memory") == "rlimit":
        _lower(resource.RLIMIT_DATA, limits.memory_mb * mib)


def signal_limit(status: int, cpu_s: float, limits: Any) -> str:
    """The limit a process's wait status (and its CPU seconds) says it died of ('' if none)."""
    if not os.WIFSIGNALED(status):
        return ""
    sig = os.WTERMSIG(status)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limits.cpu_s - 0.5):
        return "cpu"
    if sig == signal.SIGXFSZ:
        return "file_size"
    return ""


# ----------------------------------------------------------------------------------------------
# scratch folders


class Scratch:
    """A private scratch folder under `root`, owned while `self.lock` (an flock) is held."""

    def __init__(self, root: str, *, inheritable: bool = False) -> None:
        os.makedirs(root, mode=0o700, exist_ok=True)
        sweep(root)
        while True:  # the lock is held before it has its name: a sweep never sees it free
            name = f"sbx-{os.urandom(6).hex()}"
            lock, tmp = os.path.join(root, name + ".lock"), os.path.join(root, f".{name}.lock")
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                os.link(tmp, lock)
            except (FileExistsError, FileNotFoundError):  # the name is taken, or a sweep took
                os.close(fd)  # the temporary file before it was locked: draw another
                continue
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            break
        if inheritable:  # exec'd in place (no reaper): the target itself holds it
            os.set_inheritable(fd, True)
        self.lock_fd, self.lock = fd, lock
        self.path = os.path.join(root, name)
        os.mkdir(self.path, 0o700)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(self.lock)
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)


def sweep(root: str) -> list[str]:
    """Remove every scratch folder under `root` that no live sandbox owns (its lock file is
    not held, or it has none: a folder left by a version without locks). Returns them."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith("sbx-") or name.endswith(".lock"):
            continue
        folder, lock = os.path.join(root, name), os.path.join(root, name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        except OSError:
            continue
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live sandbox's
            elif time.time() - _mtime(folder) < 60:
                continue  # lock-less and fresh: a sandbox between mkdir and its lock (old code)
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(lock)
            removed.append(folder)
        finally:
            if fd >= 0:
                os.close(fd)
    for name in names:  # a lock whose folder is gone, or the temporary name of one
        lock = os.path.join(root, name)
        if name.startswith(".sbx-") and time.time() - _mtime(lock) < 60:
            continue  # a sandbox between creating its temporary lock file and locking it
        if name.endswith(".lock") and not os.path.exists(lock[:-5].replace("/.sbx-", "/sbx-")):
            with contextlib.suppress(OSError):
                fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(lock)
                finally:
                    os.close(fd)
    return removed


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


__all__ = ["Cgroup", "Scratch", "apply_rlimits", "signal_limit", "sweep", "sweep_cgroups"]

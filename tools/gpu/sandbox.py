"""The sandbox every process that imports or runs agent-written code runs in.

Staged to the GPU host beside runner.py (standard library + ctypes only, never harnesslab).
Trusted side of the boundary up to the exec of the target; the target is hostile. Usage:

    python -I sandbox.py --policy JSON -- TARGET ARGV...     ("{scratch}" in ARGV is replaced)
    python -I sandbox.py --probe                             what this machine can apply (JSON)

The outer process (this file, trusted) makes a private scratch folder (0700) and, where the
kernel allows, new PID, network, IPC and mount namespaces; it forks a reaper that is PID 1 of
the new PID namespace (a fresh /proc is mounted there, so other processes are not listed). The
reaper forks the target, which, before exec:
  - PR_SET_PDEATHSIG(SIGKILL) and PR_SET_NO_NEW_PRIVS;
  - Landlock (ABI >= 1): read + execute only on what Python, torch, triton and CUDA need plus the
    policy's read-only paths; read + write only on the scratch folder and the device files CUDA
    opens; TCP bind/connect denied (ABI >= 4; the new network namespace has no interface up
    anyway); signals and abstract unix sockets scoped to the sandbox (ABI >= 6);
  - seccomp: socket(), io_uring, ptrace, process_vm_*, bpf, mount, namespaces, keyrings,
    kexec, modules, reboot return EPERM (pathname unix sockets are not covered by Landlock
    before ABI 8, so socket() itself is refused);
  - every capability dropped (bounding, ambient, effective, permitted, inheritable);
  - an environment made only of the policy's allowlist plus HOME, TMPDIR and caches (Triton,
    bytecode, CUDA) inside the scratch folder.
When the target exits, the reaper exits with its status: the kernel then kills every process
left in the namespace (a setsid double-fork daemon included). Without a PID namespace the outer
is a subreaper and kills every descendant itself. A killed outer takes the reaper with it
(PDEATHSIG), and the reaper the target; with `"die_with_parent": PID` a dead caller takes the
outer with it too (the value is the caller's pid). The scratch folder is removed at the end.

The first line the outer writes on stdout is `{"event": "sandbox", ...}`: what was applied, so
the caller never has to trust the target's own report. Where nothing can be applied the policy
decides: `"require": true` makes the outer exit 3 with a message instead of running the target.

`"bind": [[SOURCE, TARGET], ...]` (a view): in the sandbox's mount namespace each SOURCE folder
is mounted at TARGET, in order, before anything of the policy is resolved there, so the
target sees SOURCE's files at TARGET's path and the policy's read, write and cwd paths name
TARGETs (a generated server's custom tools see a clean room at the workspace's own path). It
needs a mount namespace: without one the outer exits 126 instead of running the target with
paths that would name the TARGETs themselves.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import shutil
import signal
import struct
import sys
import sysconfig
import tempfile
import time
from typing import Any

# -- Landlock (include/uapi/linux/landlock.h) --------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE_RW = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV

# -- namespaces, prctl, seccomp ---------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_SET_CHILD_SUBREAPER = 22, 38, 47, 36
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MS_BIND = 4096
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# Per architecture: audit arch, capset, and the syscalls refused inside the sandbox.
ARCHES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "audit": 0xC000003E,
        "capset": 126,
        "socket": 41,
        "deny": {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
            "io_uring_setup": 425, "bpf": 321, "userfaultfd": 323, "perf_event_open": 298,
            "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166,
            "pivot_root": 155, "setns": 308, "unshare": 272, "kexec_load": 246,
            "init_module": 175, "finit_module": 313, "reboot": 169, "open_by_handle_at": 304,
        },
    },
    "aarch64": {
        "audit": 0xC00000B7,
        "capset": 91,
        "socket": 198,
        "deny": {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
            "io_uring_setup": 425, "bpf": 280, "userfaultfd": 282, "perf_event_open": 241,
            "keyctl": 219, "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39,
            "pivot_root": 41, "setns": 268, "unshare": 97, "kexec_load": 104,
            "init_module": 105, "finit_module": 273, "reboot": 142, "open_by_handle_at": 265,
        },
    },
}  # fmt: skip

# What Python, torch, triton (its compiler runs ptxas and a C compiler) and CUDA read.
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/sys", "/proc"]
ETC_READ = [
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/alternatives", "/etc/os-release", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
    "/etc/mime.types", "/etc/gcc", "/etc/nvidia",
    # Debian's sitecustomize.py is a link into /etc/python3.X
    f"/etc/python{sys.version_info.major}.{sys.version_info.minor}",
]  # fmt: skip
DEVICES_RW = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
DEVICE_PREFIXES = ("nvidia",)  # /dev/nvidia0, nvidiactl, nvidia-uvm*, nvidia-caps/...
ENV_ALWAYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")

LINUX = sys.platform.startswith("linux")


class _NotLinux:
    """Elsewhere (macOS) none of these calls exist, and a Linux syscall number would mean
    something else: every call fails, so nothing is applied and the report says so."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: -1


_libc: Any = ctypes.CDLL(None, use_errno=True) if LINUX else _NotLinux()
if LINUX:
    _libc.syscall.restype = ctypes.c_long


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    v = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(v) if v > 0 else 0


def _arch() -> dict[str, Any] | None:
    return ARCHES.get(platform.machine())


# ----------------------------------------------------------------------------------------------
# what the target may reach


def python_paths() -> list[str]:
    """The interpreter's own folders (prefix, stdlib, site-packages, include)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(v for k, v in sysconfig.get_paths().items() if k != "scripts")
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(p for p in paths if p and os.path.exists(p))


def read_paths(policy: dict[str, Any], target: str = "") -> list[str]:
    extra = [str(p) for p in policy.get("read", [])]
    venv = os.path.dirname(os.path.dirname(target)) if target else ""
    if venv and os.path.isfile(os.path.join(venv, "pyvenv.cfg")):  # a target in another venv
        extra.append(venv)
    return [p for p in (*SYSTEM_READ, *ETC_READ, *python_paths(), *extra) if os.path.exists(p)]


def device_paths() -> list[str]:
    out = [p for p in DEVICES_RW if os.path.exists(p)]
    try:
        names = os.listdir("/dev")
    except OSError:
        names = []
    for name in sorted(names):
        if name.startswith(DEVICE_PREFIXES):
            path = os.path.join("/dev", name)
            if os.path.isdir(path):
                out += [os.path.join(path, n) for n in sorted(os.listdir(path))]
            else:
                out.append(path)
    return out


# ----------------------------------------------------------------------------------------------
# applying it (the target side, before exec)


def apply_landlock(abi: int, read: list[str], write: list[str], devices: list[str]) -> None:
    handled = FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = struct.pack("QQQ", handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)  # fmt: skip
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise _err("landlock_create_ruleset")
    try:
        # The process's own /proc entry (the CUDA driver writes there: thread names and the
        # like); never the rest of /proc, where root could write kernel parameters.
        own = [f"/proc/{os.getpid()}"]
        for paths, rights in ((read, READ_ONLY), (write, handled), (devices, DEVICE_RW),
                              (own, READ_ONLY | FS_WRITE_FILE | FS_TRUNCATE)):  # fmt: skip
            for path in paths:
                _add_path_rule(int(fd), path, rights & handled)
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise _err("landlock_restrict_self")
    finally:
        os.close(int(fd))


def _add_path_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that vanished grants nothing
    try:
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, pfd), 12)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), rule,
                         ctypes.c_uint32(0)) != 0:  # fmt: skip
            raise _err(f"landlock_add_rule {path}")
    finally:
        os.close(pfd)


def apply_seccomp(allow: list[str] | None = None) -> bool:
    """Refuse the syscalls in ARCHES[...]['deny'] (less `allow`) with EPERM, and socket() for
    every family but AF_UNIX. The CUDA driver opens a unix socket and connects to
    /tmp/nvidia-mps/control at cuInit; it fails on EPERM where it expects ENOENT (seen on an
    H100, driver 580), so connect() stays allowed and the sockets a unix socket could reach
    are hidden instead (_hide_sockets). False where the architecture is unknown."""
    arch = _arch()
    if arch is None:
        return False
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    errno_ret = SECCOMP_RET_ERRNO | errno.EPERM
    deny = sorted(nr for name, nr in arch["deny"].items() if name not in (allow or []))
    prog = [
        (ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq_k, 1, 0, arch["audit"]),
        (ret_k, 0, 0, errno_ret),  # another ABI (x32, i386): refused
        (ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        (jeq_k, 0, 4, arch["socket"]),  # not socket(): to the deny list
        (ld_w_abs, 0, 0, 16),  # socket's first argument (low word): the family
        (jeq_k, 0, 1, 1),  # AF_UNIX
        (ret_k, 0, 0, SECCOMP_RET_ALLOW),
        (ret_k, 0, 0, errno_ret),
    ]
    if "socket" in (allow or []):
        prog[5:9] = [(ret_k, 0, 0, SECCOMP_RET_ALLOW)] * 4
    for i, nr in enumerate(deny):
        prog.append((jeq_k, len(deny) - i, 0, nr))  # match -> the ERRNO return at the end
    prog.append((ret_k, 0, 0, SECCOMP_RET_ALLOW))
    prog.append((ret_k, 0, 0, errno_ret))
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    filt = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filt))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.prctl(PR_SET_SECCOMP, 2, fbuf, 0, 0) != 0:
        raise _err("seccomp")
    return True


def drop_capabilities() -> None:
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last cap: fine
    _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    arch = _arch()
    if arch is not None:
        header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)
        data = ctypes.create_string_buffer(b"\0" * 24, 24)
        if _libc.syscall(arch["capset"], header, data) != 0:
            raise _err("capset")


def target_env(policy: dict[str, Any], scratch: str) -> dict[str, str]:
    keep = {*ENV_ALWAYS, *policy.get("env_allow", [])}
    prefixes = tuple(str(p) for p in policy.get("env_allow_prefixes", []))
    env = {
        k: v for k, v in os.environ.items() if k in keep or (prefixes and k.startswith(prefixes))
    }
    env.update({str(k): str(v) for k, v in (policy.get("env") or {}).items()})
    dirs = {
        "HOME": "home",
        "TMPDIR": "tmp",
        "TRITON_CACHE_DIR": "triton",
        "TRITON_HOME": "home",
        "XDG_CACHE_HOME": "cache",
        "CUDA_CACHE_PATH": "nv",
        "TORCHINDUCTOR_CACHE_DIR": "inductor",
        "MPLCONFIGDIR": "mpl",
        "PYTHONPYCACHEPREFIX": "pycache",
    }
    for var, sub in dirs.items():
        path = os.path.join(scratch, sub)
        os.makedirs(path, mode=0o700, exist_ok=True)
        env[var] = path
    if policy.get("triton_cache"):
        env["TRITON_CACHE_DIR"] = str(policy["triton_cache"])
    if policy.get("installed_bytecode"):
        # The caller made the folder the target runs from and knows it holds no __pycache__ of
        # anyone's (a command task's fresh final folder): read the interpreter's installed
        # bytecode instead of compiling torch from source into an empty prefix (~8 s a run).
        env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["HARNESSLAB_SANDBOXED"] = "1"
    return env


# ----------------------------------------------------------------------------------------------
# namespaces and process lifetime (the outer and the reaper)


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
        if _libc.mount(b"tmpfs", h.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV),
                       b"mode=1777,size=1m") == 0:  # fmt: skip
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
            src = f"/proc/self/fd/{fd}".encode()
            if _libc.mount(src, real.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC), None) != 0:
                raise _err(f"bind {real}")
        finally:
            os.close(fd)
    return done


def _private_mounts() -> bool:
    """Nothing mounted in this mount namespace propagates back to the host's (a shared "/",
    systemd's default, would carry the tmpfs mounts below to every process)."""
    return _libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) == 0


def _private_proc() -> bool:
    """In the new mount + PID namespace: a /proc that lists only this namespace's processes."""
    flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return _libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0


def _exec_target(policy: dict[str, Any], argv: list[str], scratch: str, abi: int) -> None:
    """In the target process: restrict everything, then exec. Never returns."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        env = target_env(policy, scratch)
        if LINUX and _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _err("no_new_privs")
        if abi:
            write = [scratch, *[str(p) for p in policy.get("write", [])]]
            apply_landlock(abi, read_paths(policy, argv[0]), write, device_paths())
        if LINUX and policy.get("seccomp", True):
            apply_seccomp(policy.get("seccomp_allow", []))
        if LINUX and policy.get("drop_caps", True):
            drop_capabilities()
        os.chdir(policy.get("cwd") or scratch)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # the target never ran: say why on stderr, exit 126
        sys.stderr.write(f"sandbox: cannot start the target: {exc}\n")
        sys.stderr.flush()
    os._exit(126)


# ----------------------------------------------------------------------------------------------
# views: a folder mounted at another path (policy "bind")


def _open_binds(binds: list[Any]) -> list[tuple[int, str]]:
    """(descriptor of SOURCE, TARGET) for each bind, opened before the sockets' folders are
    hidden (a SOURCE may sit in /tmp)."""
    out = []
    for source, target in binds:
        out.append((os.open(str(source), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), str(target)))
    return out


def _mount_binds(opened: list[tuple[int, str]]) -> None:
    """Mount each opened SOURCE at its TARGET (an existing folder, its last component not a
    symlink), in order; closes the descriptors."""
    try:
        for fd, target in opened:
            tfd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                src, dst = f"/proc/self/fd/{fd}".encode(), f"/proc/self/fd/{tfd}".encode()
                if _libc.mount(src, dst, None, ctypes.c_ulong(MS_BIND | MS_REC), None) != 0:
                    raise _err(f"bind at {target}")
            finally:
                os.close(tfd)
    finally:
        for fd, _ in opened:
            os.close(fd)


def _reap_until(pid: int) -> int:
    """Wait for `pid` (reaping anything else that exits); its exit status as a shell would."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _kill_descendants() -> None:
    """Without a PID namespace: every process whose parent chain leads here gets SIGKILL (the
    subreaper inherited the orphans, so a setsid double-fork is still a descendant)."""
    me = os.getpid()
    for _ in range(20):
        children = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read().rsplit(b")", 1)[1].split()
                if int(stat[1]) == me:
                    children.append(int(name))
            except (OSError, IndexError, ValueError):
                continue
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in children:
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
        time.sleep(0.01)


def run(policy: dict[str, Any], argv: list[str]) -> int:
    """The outer process: report, make the scratch folder, start the reaper/target, clean up."""
    abi = landlock_abi() if policy.get("landlock", True) else 0
    root = policy.get("scratch_root") or tempfile.gettempdir()
    os.makedirs(root, mode=0o700, exist_ok=True)
    for folder in policy.get("mkdir", []):  # write grants that must exist before Landlock
        os.makedirs(str(folder), mode=0o700, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="sbx-", dir=root)
    argv = [a.replace("{scratch}", scratch) for a in argv]
    wanted = policy.get("namespaces", True)
    if wanted is True:
        namespaces = enter_namespaces()
    elif isinstance(wanted, list) and wanted:
        namespaces = enter_namespaces([n for n in wanted if n in NAMESPACES])
    else:
        namespaces = []
    pidns = "pid" in namespaces
    applied = {
        "landlock_abi": abi,
        "namespaces": namespaces,
        "seccomp": bool(LINUX and policy.get("seccomp", True) and _arch()),
        "no_new_privs": LINUX,
        "capabilities": "dropped" if LINUX else "kept",
        "lifetime": "pid_namespace"
        if pidns
        else "caller"
        if policy.get("fork", True) is False
        else "subreaper",
    }
    applied["level"] = "none" if not abi else "full" if pidns and "net" in namespaces else "partial"
    if policy.get("report", True):
        os.write(1, (json.dumps({"event": "sandbox", **applied}) + "\n").encode())
    if policy.get("require") and applied["level"] == "none":
        sys.stderr.write(
            "sandbox: Landlock is not available on this machine (kernel without it, or "
            "macOS); refusing to run agent-written code unsandboxed. Set "
            "HARNESSLAB_ALLOW_UNSANDBOXED=1 to run it anyway, knowingly.\n"
        )
        shutil.rmtree(scratch, ignore_errors=True)
        return 3
    if policy.get("bind") and "mnt" not in namespaces:
        sys.stderr.write(
            "sandbox: the policy mounts folders at other paths (bind), which needs a mount "
            "namespace this machine does not give; not running the target\n"
        )
        shutil.rmtree(scratch, ignore_errors=True)
        return 126
    if policy.get("fork", True) is False and not namespaces:
        # No reaper: this process becomes the target (its scratch folder is left for the
        # caller's scratch root; its lifetime is its caller's process group).
        _exec_target(policy, argv, scratch, abi)
    if not pidns:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _forward_signals_to: list[int] = []

    def _on_signal(signum, frame):
        for pid in _forward_signals_to:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    parent = policy.get("die_with_parent")
    if parent:
        # A long-lived caller (a generated server; the value is its pid) that dies takes the
        # sandbox with it: TERM here kills the reaper, whose namespace goes with it. The caller
        # starts this process from a thread that lives as long as it does (the kernel signals
        # on the death of the forking thread).
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the line above
            shutil.rmtree(scratch, ignore_errors=True)
            return 1
    child = os.fork()
    if child == 0:  # the reaper: PID 1 of the new namespace (or a plain child without one)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if "mnt" in namespaces and not (_unshare(CLONE_NEWNS) and _private_mounts()):
            sys.stderr.write("sandbox: cannot make a private mount namespace\n")
            os._exit(126)
        if pidns and "mnt" in namespaces:
            _private_proc()
        if "mnt" in namespaces:
            keep = [scratch, *map(str, policy.get("read", [])), *map(str, policy.get("write", []))]
            keep += [p for p in python_paths() if p]
            keep += [a for a in argv if os.path.isabs(a) and os.path.exists(a)]
            if policy.get("triton_cache"):
                keep.append(str(policy["triton_cache"]))
            try:
                binds = _open_binds(policy.get("bind") or [])
                keep += [target for _, target in binds]
                _hide_sockets(keep)
                _mount_binds(binds)
            except OSError as exc:  # the target must not run with half the view it was given
                sys.stderr.write(f"sandbox: {exc}\n")
                os._exit(126)
        target = os.fork()
        if target == 0:
            _exec_target(policy, argv, scratch, abi)
        os._exit(_reap_until(target))
    _forward_signals_to.append(child)
    code = _reap_until(child)
    if not pidns and LINUX:
        _kill_descendants()
    if not policy.get("keep_scratch"):
        shutil.rmtree(scratch, ignore_errors=True)
    return code


def probe() -> dict[str, Any]:
    """What this machine can apply, without applying anything to this process."""
    abi = landlock_abi()
    pid = os.fork()
    if pid == 0:
        ok = enter_namespaces()
        os._exit(0 if ok and "pid" in ok else 1)
    _, status = os.waitpid(pid, 0)
    return {
        "landlock_abi": abi,
        "namespaces": os.waitstatus_to_exitcode(status) == 0,
        "seccomp": _arch() is not None,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "level": "none" if not abi else "full",
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    if len(argv) < 4 or argv[0] != "--policy" or "--" not in argv:
        sys.stderr.write("usage: sandbox.py --policy JSON -- TARGET ARGV... | --probe\n")
        return 2
    split = argv.index("--")
    policy = json.loads(argv[1])
    target = argv[split + 1 :]
    if not target:
        sys.stderr.write("sandbox: no target command\n")
        return 2
    if not os.path.isabs(target[0]):
        found = shutil.which(target[0])
        if found is None:
            sys.stderr.write(f"sandbox: {target[0]}: not found\n")
            return 127
        target[0] = found
    return run(policy, target)


if __name__ == "__main__":
    sys.exit(main())

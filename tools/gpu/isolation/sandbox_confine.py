"""What the sandbox's target applies to itself before exec: Landlock, seccomp, no capabilities.

Staged beside sandbox.py (standard library + ctypes only, never harnesslab); trusted code that
runs in the target process between fork and exec (sandbox.py `_exec_target`).

Landlock (ABI >= 1): read + execute only on what Python, torch, triton and CUDA need plus the
policy's read-only paths and import roots; read + write on the scratch folder, the policy's
write paths and the device files CUDA opens; the process's own /proc entry writable (the CUDA
driver writes thread names there); TCP bind/connect denied (ABI >= 4); signals and abstract unix
sockets scoped to the sandbox (ABI >= 6). /sys: nothing without a GPU; on a GPU host only what
the CUDA driver and NVML read (CPU and NUMA topology, the PCI devices, the nvidia modules).

seccomp: a filter that refuses, beside every other ABI (x32, i386):
  - socket() of any family but AF_UNIX (pathname unix sockets are not covered by Landlock before
    ABI 8; the CUDA driver needs AF_UNIX + connect for its MPS probe, so the folders where
    sockets live are hidden instead: sandbox_mounts.py `_hide_sockets`);
  - clone() with any CLONE_NEW* flag (a user namespace would hand the child a full capability
    set there), and clone3() with ENOSYS, as Docker's default profile does: its flags sit in
    memory a filter cannot read, and glibc falls back to clone() on ENOSYS;
  - DENIED below with EPERM. Reviewed against Docker's default profile (moby
    profiles/seccomp/default.json, without capabilities): what it refuses and a process here
    could reach is refused too: namespaces (unshare, setns), mounts old and new (mount, umount2,
    pivot_root, open_tree, move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr), other
    processes' memory and descriptors (ptrace, process_vm_*, pidfd_getfd, kcmp,
    process_madvise, move_pages, migrate_pages), kernel keyrings, modules, kexec, reboot, BPF,
    perf events, userfaultfd, io_uring, file handles (open_by_handle_at, name_to_handle_at), the
    kernel log, accounting, quotas, swap, clocks, host and domain names, chroot, vhangup, uselib,
    iopl/ioperm, fanotify. Most of these need a capability the target no longer has; the filter
    is the second wall. Docker refuses personality() with unusual arguments and the NUMA policy
    calls without CAP_SYS_NICE; they stay allowed here: they change only the caller's own
    process, and the CUDA driver and libnuma call them.
  - allowed on purpose: pidfd_open (custom_host.py waits on its worker with one inside a
    qualification's sandbox; a pidfd names a process the caller can see anyway, which in the
    sandbox's PID namespace is one of its own, and signals through it are scoped like kill());
    memfd_create (an anonymous file gives nothing ctypes' anonymous executable memory does not
    already give a Python target, executing it is refused by Landlock, which governs files with
    no path under a rule; the guard's CPU arena is a memfd its trusted parent creates, so the
    candidate does not need the call, but torch and the CUDA driver may).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
import sysconfig
from typing import Any

LINUX = sys.platform.startswith("linux")

# -- Landlock (include/uapi/linux/landlock.h) --------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE_RW = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV

# -- prctl, seccomp -----------------------------------------------------------------------------
PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_CAP_AMBIENT = 24, 22, 47
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET (CLONE_NEWTIME is clone3's only)
CLONE_NEW_ANY = 0x7E020000
# Per architecture: audit arch, capset, socket, clone, clone3, and the syscalls refused.
ARCHES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "audit": 0xC000003E, "capset": 126, "socket": 41, "clone": 56, "clone3": 435,
        "deny": {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
            "kcmp": 312, "process_madvise": 440, "move_pages": 279, "migrate_pages": 256,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
            "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
            "request_key": 249, "mount": 165, "umount2": 166, "pivot_root": 155,
            "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "mount_setattr": 442, "setns": 308, "unshare": 272, "chroot": 161,
            "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
            "delete_module": 176, "reboot": 169, "open_by_handle_at": 304,
            "name_to_handle_at": 303, "syslog": 103, "acct": 163, "quotactl": 179,
            "quotactl_fd": 443, "swapon": 167, "swapoff": 168, "settimeofday": 164,
            "clock_settime": 227, "clock_adjtime": 305, "sethostname": 170,
            "setdomainname": 171, "vhangup": 153, "uselib": 134, "iopl": 172, "ioperm": 173,
            "fanotify_init": 300, "lookup_dcookie": 212,
        },
    },
    "aarch64": {
        "audit": 0xC00000B7, "capset": 91, "socket": 198, "clone": 220, "clone3": 435,
        "deny": {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
            "kcmp": 272, "process_madvise": 440, "move_pages": 239, "migrate_pages": 238,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
            "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219, "add_key": 217,
            "request_key": 218, "mount": 40, "umount2": 39, "pivot_root": 41,
            "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "mount_setattr": 442, "setns": 268, "unshare": 97, "chroot": 51,
            "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
            "delete_module": 106, "reboot": 142, "open_by_handle_at": 265,
            "name_to_handle_at": 264, "syslog": 116, "acct": 89, "quotactl": 60,
            "quotactl_fd": 443, "swapon": 224, "swapoff": 225, "settimeofday": 170,
            "clock_settime": 112, "clock_adjtime": 266, "sethostname": 161,
            "setdomainname": 162, "vhangup": 58, "fanotify_init": 262, "lookup_dcookie": 18,
        },
    },
}  # fmt: skip

# What Python, torch, triton (its compiler runs ptxas and a C compiler) and CUDA read.
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/proc"]
# /sys on a GPU host: the CUDA driver and NVML read the CPU and NUMA topology, the PCI devices
# (reached through /sys/bus/pci/devices links into /sys/devices/pci*) and the driver modules;
# torch.profiler's CUPTI (a step task's profile_kernel) lists the clock sources, read-only: a
# clock's name, nothing a candidate could time or change with.
SYS_GPU_READ = [
    "/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/bus/pci", "/sys/module/nvidia",
    "/sys/module/nvidia_uvm", "/sys/kernel/mm/transparent_hugepage",
    "/sys/devices/system/clocksource",
]  # fmt: skip
ETC_READ = [
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/alternatives", "/etc/os-release", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
    "/etc/mime.types", "/etc/gcc", "/etc/nvidia",
    # Debian's sitecustomize.py is a link into /etc/python3.X
    f"/etc/python{sys.version_info.major}.{sys.version_info.minor}",
]  # fmt: skip
DEVICES_RW = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
DEVICE_PREFIXES = ("nvidia",)  # /dev/nvidia0, nvidiactl, nvidia-uvm*, nvidia-caps/...


class _NotLinux:
    """Elsewhere (macOS) none of these calls exist, and a Linux syscall number would mean
    something else: every call fails, so nothing is applied and the report says so."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: -1


libc: Any = ctypes.CDLL(None, use_errno=True) if LINUX else _NotLinux()
if LINUX:
    libc.syscall.restype = ctypes.c_long


def oserror(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    v = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(v) if v > 0 else 0


def arch() -> dict[str, Any] | None:
    return ARCHES.get(platform.machine())


# ----------------------------------------------------------------------------------------------
# what the target may reach


def python_paths() -> list[str]:
    """The interpreter's own folders (prefix, stdlib, site-packages, include)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(v for k, v in sysconfig.get_paths().items() if k != "scripts")
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(p for p in paths if p and os.path.exists(p))


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


def has_gpu(devices: list[str]) -> bool:
    return any(os.path.basename(d).startswith(DEVICE_PREFIXES) for d in devices)


def sys_paths(gpu: bool) -> list[str]:
    """The /sys a target may read: nothing without a GPU, SYS_GPU_READ (and the PCI device
    folders its links lead to) with one."""
    if not gpu:
        return []
    out = list(SYS_GPU_READ)
    try:
        out += [os.path.join("/sys/devices", n) for n in os.listdir("/sys/devices")
                if n.startswith("pci")]  # fmt: skip
    except OSError:
        pass
    return out


def read_paths(extra: list[str], target: str, gpu: bool) -> list[str]:
    extra = list(extra)
    venv = os.path.dirname(os.path.dirname(target)) if target else ""
    if venv and os.path.isfile(os.path.join(venv, "pyvenv.cfg")):  # a target in another venv
        extra.append(venv)
    found = (*SYSTEM_READ, *sys_paths(gpu), *ETC_READ, *python_paths(), *extra)
    return [p for p in found if os.path.exists(p)]


# ----------------------------------------------------------------------------------------------
# applying it (the target side, before exec)


def apply_landlock(abi: int, read: list[str], write: list[str], devices: list[str]) -> None:
    handled = FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = struct.pack("QQQ", handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)  # fmt: skip
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise oserror("landlock_create_ruleset")
    try:
        # The process's own /proc entry (the CUDA driver writes there: thread names and the
        # like); never the rest of /proc, where root could write kernel parameters.
        own = [f"/proc/{os.getpid()}"]
        for paths, rights in ((read, READ_ONLY), (write, handled), (devices, DEVICE_RW),
                              (own, READ_ONLY | FS_WRITE_FILE | FS_TRUNCATE)):  # fmt: skip
            for path in paths:
                _add_path_rule(int(fd), path, rights & handled)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise oserror("landlock_restrict_self")
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
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), rule,
                        ctypes.c_uint32(0)) != 0:  # fmt: skip
            raise oserror(f"landlock_add_rule {path}")
    finally:
        os.close(pfd)


# classic BPF: ld abs word, jeq k, jset k, ret k
LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06


def seccomp_program(allow: list[str] | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter (module docstring) as classic BPF instructions; None for an unknown
    architecture. `allow`: names of DENIED (or "socket") let through."""
    a = arch()
    if a is None:
        return None
    allow = allow or []
    eperm, enosys = SECCOMP_RET_ERRNO | errno.EPERM, SECCOMP_RET_ERRNO | errno.ENOSYS
    deny = sorted(nr for name, nr in a["deny"].items() if name not in allow)
    # Labels are resolved below: ("jeq", k, "label") jumps there when equal.
    body: list[Any] = [
        (LD, 0, 0, 4),  # seccomp_data.arch
        ("jne", a["audit"], "eperm"),  # another ABI (x32, i386): refused
        (LD, 0, 0, 0),  # seccomp_data.nr
        ("jeq", a["clone3"], "enosys"),
        ("jeq", a["clone"], "clone"),
    ]
    if "socket" not in allow:
        body.append(("jeq", a["socket"], "socket"))
    body += [("jeq", nr, "eperm") for nr in deny]
    body.append((RET, 0, 0, SECCOMP_RET_ALLOW))
    body += [
        "clone",
        (LD, 0, 0, 16),
        ("jset", CLONE_NEW_ANY, "eperm"),
        (RET, 0, 0, SECCOMP_RET_ALLOW),
    ]
    body += ["socket", (LD, 0, 0, 16), ("jeq", 1, "allow"), (RET, 0, 0, eperm)]  # 1: AF_UNIX
    body += ["allow", (RET, 0, 0, SECCOMP_RET_ALLOW), "eperm", (RET, 0, 0, eperm)]
    body += ["enosys", (RET, 0, 0, enosys)]
    where: dict[str, int] = {}
    prog: list[Any] = []
    for ins in body:
        if isinstance(ins, str):
            where[ins] = len(prog)
        else:
            prog.append(ins)
    out = []
    for i, ins in enumerate(prog):
        if isinstance(ins[0], str):
            op, k, label = ins
            off = where[label] - i - 1
            if off > 255:
                raise ValueError("seccomp filter jump out of range")
            code = {"jeq": JEQ, "jne": JEQ, "jset": JSET}[op]
            out.append((code, 0, off, k) if op == "jne" else (code, off, 0, k))
        else:
            out.append(ins)
    return out


def apply_seccomp(allow: list[str] | None = None) -> bool:
    """Install `seccomp_program(allow)`; False where the architecture is unknown."""
    prog = seccomp_program(allow)
    if prog is None:
        return False
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    filt = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filt))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if libc.prctl(PR_SET_SECCOMP, 2, fbuf, 0, 0) != 0:
        raise oserror("seccomp")
    return True


def drop_capabilities() -> None:
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last cap: fine
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    a = arch()
    if a is not None:
        header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)
        data = ctypes.create_string_buffer(b"\0" * 24, 24)
        if libc.syscall(a["capset"], header, data) != 0:
            raise oserror("capset")


__all__ = [
    "apply_landlock",
    "apply_seccomp",
    "device_paths",
    "drop_capabilities",
    "has_gpu",
    "landlock_abi",
    "read_paths",
    "seccomp_program",
]

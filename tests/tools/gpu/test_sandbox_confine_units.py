"""The sandbox target's confinement (tools/gpu/isolation/sandbox_confine.py) in this process, with
landlock(2), prctl(2) and capset(2) recorded instead of made, and the seccomp filter run on a
small classic-BPF interpreter: which syscalls each architecture refuses and with what, which
paths get which Landlock rights at each ABI, what the capability drop asks for. (The real
sandbox applying them is tests/tools/integrity/test_sandbox_limits.py and the trust tests; these
pin each rule where a mutant of the staged copy would go unseen.)"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tools.gpu.isolation import sandbox_confine as sc

# Linux's values (linux/landlock.h, linux/prctl.h, linux/seccomp.h, linux/sched.h): the kernel's
# ABI, not ours to choose.
LANDLOCK = {
    "SYS_LANDLOCK_CREATE_RULESET": 444, "SYS_LANDLOCK_ADD_RULE": 445,
    "SYS_LANDLOCK_RESTRICT_SELF": 446, "FS_EXECUTE": 1, "FS_WRITE_FILE": 2, "FS_READ_FILE": 4,
    "FS_READ_DIR": 8, "FS_TRUNCATE": 1 << 14, "FS_IOCTL_DEV": 1 << 15, "NET_BIND_TCP": 1,
    "NET_CONNECT_TCP": 2, "SCOPE_ABSTRACT_UNIX_SOCKET": 1, "SCOPE_SIGNAL": 2,
    "PR_CAPBSET_DROP": 24, "PR_SET_SECCOMP": 22, "PR_CAP_AMBIENT": 47,
    "SECCOMP_RET_ALLOW": 0x7FFF0000, "SECCOMP_RET_ERRNO": 0x00050000,
}  # fmt: skip
CLONE_NEW = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
             "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
             "NEWNET": 0x40000000}  # fmt: skip
# What the filter refuses (module docstring: Docker's default profile, reviewed).
DENIED = {
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "process_madvise",
    "move_pages", "migrate_pages", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "userfaultfd", "perf_event_open", "keyctl", "add_key", "request_key", "mount",
    "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "setns", "unshare", "chroot", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "open_by_handle_at",
    "name_to_handle_at", "syslog", "acct", "quotactl", "quotactl_fd", "swapon", "swapoff",
    "settimeofday", "clock_settime", "clock_adjtime", "sethostname", "setdomainname", "vhangup",
    "fanotify_init", "lookup_dcookie",
}  # fmt: skip
X86_ONLY = {"uselib", "iopl", "ioperm"}  # no such syscalls on arm64
REAL_OPEN = os.open
HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


def test_the_constants_are_linuxs() -> None:
    assert {name: getattr(sc, name) for name in LANDLOCK} == LANDLOCK
    assert sc.CLONE_NEW_ANY == sum(CLONE_NEW.values())
    assert sc.FS_BY_ABI == {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF}
    assert sc.FILE_RIGHTS == 1 | 2 | 4 | (1 << 14) | (1 << 15)  # no directory rights
    assert sc.READ_ONLY == 1 | 4 | 8
    assert sc.DEVICE_RW == 4 | 2 | (1 << 14) | (1 << 15)
    assert (sc.LD, sc.JEQ, sc.JSET, sc.RET) == (0x20, 0x15, 0x45, 0x06)
    assert (
        sc.ARCHES["x86_64"]["audit"] == 0xC000003E and sc.ARCHES["aarch64"]["audit"] == 0xC00000B7
    )


def test_each_architecture_refuses_the_reviewed_list() -> None:
    assert set(sc.ARCHES["x86_64"]["deny"]) == DENIED | X86_ONLY
    assert set(sc.ARCHES["aarch64"]["deny"]) == DENIED
    assert set(sc.ARCHES) == {"x86_64", "aarch64"}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_the_syscall_numbers_are_the_kernel_headers(machine: str) -> None:
    if not HEADERS[machine].is_file():
        pytest.skip(f"no {HEADERS[machine]} (linux-libc-dev) here")
    text = HEADERS[machine].read_text()
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}
    a = sc.ARCHES[machine]
    named = {**a["deny"], **{k: a[k] for k in ("capset", "socket", "clone", "clone3")}}
    assert named == {name: numbers[name] for name in named}


def test_the_paths_a_target_reads_are_the_reviewed_ones() -> None:
    assert sc.SYSTEM_READ == ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/proc"]
    assert sc.SYS_GPU_READ == [
        "/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/bus/pci",
        "/sys/module/nvidia", "/sys/module/nvidia_uvm", "/sys/kernel/mm/transparent_hugepage",
        "/sys/devices/system/clocksource",
    ]  # fmt: skip
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert sc.ETC_READ == [
        "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
        "/etc/alternatives", "/etc/os-release", "/etc/nsswitch.conf", "/etc/passwd",
        "/etc/group", "/etc/mime.types", "/etc/gcc", "/etc/nvidia", f"/etc/python{version}",
    ]  # fmt: skip
    assert sc.DEVICES_RW == ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
    assert sc.DEVICE_PREFIXES == ("nvidia",)


def test_libc_is_this_processs_with_a_long_syscall_result() -> None:
    assert sc.LINUX is sys.platform.startswith("linux")
    if sc.LINUX:
        assert isinstance(sc.libc, ctypes.CDLL) and sc.libc.syscall.restype is ctypes.c_long
    off = sc._NotLinux()
    assert off.syscall(1, 2, x=3) == -1 and off.prctl() == -1  # nothing is applied elsewhere


@pytest.mark.skipif(not sc.LINUX, reason="Linux's syscall(2)")
def test_a_failed_call_leaves_its_errno_for_the_error() -> None:
    assert sc.libc.syscall(-1) == -1  # no such syscall: ENOSYS, nothing done
    assert sc.oserror("syscall").errno == errno.ENOSYS


def test_an_error_names_the_call_and_the_errno(monkeypatch) -> None:
    monkeypatch.setattr(ctypes, "get_errno", lambda: errno.EPERM)
    e = sc.oserror("landlock_restrict_self")
    assert e.errno == errno.EPERM
    assert str(e) == f"[Errno 1] landlock_restrict_self: {os.strerror(errno.EPERM)}"


# -- recorded syscalls --------------------------------------------------------------------------
def value(arg: Any) -> Any:
    """A ctypes argument as the kernel would read it."""
    if isinstance(arg, ctypes.Array):
        return bytes(arg.raw)
    return arg.value if hasattr(arg, "value") else arg


class Libc:
    """libc.syscall and libc.prctl recorded, each answering from `answers` by syscall number
    (default 0); landlock_create_ruleset answers a real descriptor, as the kernel does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **answers: Any) -> None:
        self.calls: list[tuple] = []
        self.prctls: list[tuple] = []
        self.answers = answers
        self.fds: list[int] = []
        monkeypatch.setattr(sc, "libc", self)

    def syscall(self, nr: int, *args: Any) -> int:
        self.calls.append((nr, *[value(a) for a in args]))
        if nr == 444 and value(args[2]) == 0:
            fd = self.answers.get("create", None)
            if fd is None:
                fd = REAL_OPEN(os.devnull, os.O_RDONLY)
                self.fds.append(fd)
            return fd
        return self.answers.get(str(nr), 0)

    def prctl(self, *args: Any) -> int:
        self.prctls.append(tuple(value(a) for a in args))
        return self.answers.get("prctl", 0) if args[0] == 22 else 0


def test_the_landlock_abi_is_asked_with_the_version_flag(monkeypatch) -> None:
    libc = Libc(monkeypatch)
    for answer, abi in ((6, 6), (1, 1), (0, 0), (-1, 0)):
        libc.answers["444"] = answer
        libc.calls.clear()
        assert sc.landlock_abi() == abi
        assert libc.calls == [(444, None, 0, 1)]  # LANDLOCK_CREATE_RULESET_VERSION


def test_the_architecture_is_the_machines(monkeypatch) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: "aarch64")
    assert sc.arch() is sc.ARCHES["aarch64"]
    monkeypatch.setattr(sc.platform, "machine", lambda: "riscv64")
    assert sc.arch() is None


# -- what the target may reach ------------------------------------------------------------------
def test_python_paths_are_the_interpreters_existing_folders_but_its_scripts(
    monkeypatch, tmp_path
) -> None:
    d = {n: tmp_path / n for n in ("prefix", "base", "exec", "bexec", "lib", "inc", "bin", "real")}
    for p in d.values():
        p.mkdir()
    (d["real"] / "python3").touch()
    (d["bin"] / "python").symlink_to(d["real"] / "python3")
    monkeypatch.setattr(sc.sys, "prefix", str(d["prefix"]))
    monkeypatch.setattr(sc.sys, "base_prefix", str(d["base"]))
    monkeypatch.setattr(sc.sys, "exec_prefix", str(d["exec"]))
    monkeypatch.setattr(sc.sys, "base_exec_prefix", str(d["bexec"]))
    monkeypatch.setattr(sc.sys, "executable", str(d["bin"] / "python"))
    monkeypatch.setattr(sc.sysconfig, "get_paths", lambda: {
        "stdlib": str(d["lib"]), "include": str(d["inc"]), "scripts": str(d["bin"]),
        "purelib": str(d["lib"]), "data": "",
    })  # fmt: skip
    assert sc.python_paths() == sorted(
        str(d[n]) for n in ("prefix", "base", "exec", "bexec", "lib", "inc", "real")
    )
    monkeypatch.setattr(sc.sys, "base_exec_prefix", str(tmp_path / "gone"))
    assert str(tmp_path / "gone") not in sc.python_paths()  # only folders that exist


def fake_fs(monkeypatch: pytest.MonkeyPatch, dirs: dict[str, list[str]], files: set[str]) -> None:
    """os.listdir, os.path.isdir and os.path.exists over the given tree (a missing folder's
    listing fails as the real one does)."""

    def listdir(path: str) -> list[str]:
        if path not in dirs:
            raise FileNotFoundError(path)
        return list(dirs[path])

    monkeypatch.setattr(sc.os, "listdir", listdir)
    monkeypatch.setattr(sc.os.path, "isdir", lambda p: p in dirs)
    monkeypatch.setattr(sc.os.path, "exists", lambda p: p in dirs or p in files)


def test_devices_are_the_existing_plain_ones_and_every_nvidia_node(monkeypatch) -> None:
    with monkeypatch.context() as m:
        fake_fs(m, {"/dev": ["nvidia1", "tty", "nvidia-caps", "nvidiactl", "null", "xnvidia"],
                    "/dev/nvidia-caps": ["nvidia-cap2", "nvidia-cap1"]},
                {"/dev/null", "/dev/urandom", "/dev/zero"})  # fmt: skip
        found = sc.device_paths()
    assert found == ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/nvidia-caps/nvidia-cap1",
                     "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia1", "/dev/nvidiactl"]  # fmt: skip
    with monkeypatch.context() as m:
        fake_fs(m, {}, {"/dev/null"})  # no /dev listing: the plain devices only
        assert sc.device_paths() == ["/dev/null"]


def test_a_gpu_is_an_nvidia_device_node() -> None:
    assert sc.has_gpu(["/dev/null", "/dev/nvidiactl"])
    assert not sc.has_gpu(["/dev/null", "/dev/xnvidia", "/dev/nvidia-x/null"])
    assert not sc.has_gpu([])


def test_sys_is_closed_without_a_gpu_and_the_gpus_folders_with_one(monkeypatch) -> None:
    with monkeypatch.context() as m:
        fake_fs(m, {"/sys/devices": ["pci0000:00", "system", "pci0000:80", "virtual"]}, set())
        assert sc.sys_paths(False) == []
        assert sc.sys_paths(True) == [*sc.SYS_GPU_READ, "/sys/devices/pci0000:00",
                                      "/sys/devices/pci0000:80"]  # fmt: skip
    with monkeypatch.context() as m:
        fake_fs(m, {}, set())
        assert sc.sys_paths(True) == sc.SYS_GPU_READ


def test_read_paths_are_the_existing_system_python_and_extra_ones_and_a_targets_venv(
    monkeypatch, tmp_path
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").touch()
    plain = tmp_path / "plain"
    (plain / "bin").mkdir(parents=True)
    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.setattr(sc, "SYSTEM_READ", [str(tmp_path / "sys_a"), str(tmp_path)])
    monkeypatch.setattr(sc, "ETC_READ", [str(tmp_path / "etc_gone")])
    monkeypatch.setattr(sc, "python_paths", lambda: [str(plain)])
    monkeypatch.setattr(sc, "sys_paths", lambda gpu: [str(extra / "gpu")] if gpu else [])
    (extra / "gpu").mkdir()
    gone = str(tmp_path / "gone")
    base = [str(tmp_path), str(plain), str(extra)]
    assert sc.read_paths([str(extra), gone], str(venv / "bin" / "python"), False) == [
        *base,
        str(venv),
    ]
    assert sc.read_paths([str(extra)], str(plain / "bin" / "python"), False) == base
    assert sc.read_paths([str(extra)], "", True) == [
        str(tmp_path),
        str(extra / "gpu"),
        str(plain),
        str(extra),
    ]


# -- Landlock -----------------------------------------------------------------------------------
def landlock(monkeypatch, tmp_path, abi: int, **answers: Any):
    """apply_landlock on four folders/files, with what each rule's descriptor was opened on."""
    libc = Libc(monkeypatch, **answers)
    opened: list[tuple[int, str]] = []  # in order: a closed descriptor's number is reused

    def open_(path, flags, *a):
        fd = REAL_OPEN(path, flags, *a)
        assert flags & os.O_PATH and flags & os.O_CLOEXEC
        opened.append((fd, str(path)))
        return fd

    read, write, dev = tmp_path / "read", tmp_path / "write", tmp_path / "dev"
    for p in (read, write):
        p.mkdir(parents=True)
    dev.touch()
    own = f"/proc/{os.getpid()}"
    monkeypatch.setattr(sc.os, "open", open_)
    try:
        sc.apply_landlock(abi, [str(read), str(tmp_path / "gone")], [str(write)], [str(dev)])
    finally:
        monkeypatch.setattr(sc.os, "open", REAL_OPEN)
    added = [c for c in libc.calls if c[0] == 445]
    assert len(added) == len(opened)
    got = {}
    for (_nr, ruleset, kind, rule, flags), (fd, path) in zip(added, opened, strict=True):
        assert kind == 1 and flags == 0 and len(rule) == 12  # LANDLOCK_RULE_PATH_BENEATH
        rights, pfd = struct.unpack("=Qi", rule)
        assert pfd == fd and ruleset == libc.fds[0]
        got[path] = rights
    names = {str(read): "read", str(write): "write", str(dev): "dev", own: "own"}
    return libc, {names[k]: v for k, v in got.items()}, opened


@pytest.mark.parametrize(
    ("abi", "handled", "net", "scope", "size"),
    [(1, 0x1FFF, 0, 0, 8), (3, 0x7FFF, 0, 0, 8), (4, 0x7FFF, 3, 0, 16), (5, 0xFFFF, 3, 0, 16),
     (6, 0xFFFF, 3, 3, 24), (7, 0xFFFF, 3, 3, 24)],
)  # fmt: skip
def test_the_ruleset_handles_what_the_abi_knows(monkeypatch, tmp_path, abi, handled, net, scope,
                                                 size) -> None:  # fmt: skip
    libc, got, opened = landlock(monkeypatch, tmp_path, abi)
    create = libc.calls[0]
    assert create[0] == 444 and create[2] == size and create[3] == 0
    assert create[1] == struct.pack("QQQ", handled, net, scope)[:size]
    assert got == {
        "read": 1 | 4 | 8,
        "write": handled,  # every right the ABI handles on the scratch and write paths
        "dev": (4 | 2 | (1 << 14) | (1 << 15)) & handled,  # a file: file rights only
        "own": (1 | 4 | 8 | 2 | (1 << 14)) & handled,
    }
    fd = libc.fds[0]
    assert libc.calls[-1] == (446, fd, 0)  # restrict_self on the ruleset, last
    with pytest.raises(OSError):
        os.fstat(fd)  # the ruleset is closed
    for pfd, _ in opened:
        with pytest.raises(OSError):
            os.fstat(pfd)  # and every path's descriptor


def test_a_rule_on_a_file_keeps_only_file_rights(monkeypatch, tmp_path) -> None:
    libc = Libc(monkeypatch)
    f = tmp_path / "f"
    f.touch()
    sc._add_path_rule(7, str(f), 0xFFFF)
    sc._add_path_rule(7, str(tmp_path), 0xFFFF)
    sc._add_path_rule(7, str(tmp_path / "gone"), 0xFFFF)  # vanished: no rule, no error
    got = [struct.unpack("=Qi", c[3])[0] for c in libc.calls]
    assert [c[:3] for c in libc.calls] == [(445, 7, 1), (445, 7, 1)]
    assert got == [sc.FILE_RIGHTS, 0xFFFF]


def test_each_refused_landlock_call_is_an_error_and_closes_the_ruleset(
    monkeypatch, tmp_path
) -> None:
    with pytest.raises(OSError, match="landlock_create_ruleset"):
        landlock(monkeypatch, tmp_path / "a", 6, create=-1)
    for nr, what in (("445", "landlock_add_rule"), ("446", "landlock_restrict_self")):
        sub = tmp_path / nr
        sub.mkdir()
        libc = Libc(monkeypatch, **{nr: -1})
        with pytest.raises(OSError, match=what):
            sc.apply_landlock(6, [str(sub)], [], [])
        with pytest.raises(OSError):
            os.fstat(libc.fds[0])
        if nr == "445":
            assert [c[0] for c in libc.calls] == [444, 445]  # stopped at the first refusal


# -- seccomp ------------------------------------------------------------------------------------
def run_bpf(prog: list[tuple[int, int, int, int]], nr: int, audit: int, arg0: int = 0) -> int:
    """A classic BPF filter on one seccomp_data (nr, arch, ip, args), in canonical form (a load
    or a return carries no jump offsets, as libseccomp and the kernel's own filters write it)."""
    data = struct.pack("=iIQ6Q", nr, audit, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        assert code in (0x15, 0x45) or jt == jf == 0, prog[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x15:
            pc += jt if acc == k else jf
        elif code == 0x45:
            pc += jt if acc & k else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unknown instruction {code:#x}")
        pc += 1


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS


@pytest.mark.parametrize("machine", sorted(sc.ARCHES))
def test_the_filter_refuses_each_denied_syscall_and_nothing_else(monkeypatch, machine) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: machine)
    a = sc.ARCHES[machine]
    prog = sc.seccomp_program()
    assert prog is not None
    run = lambda nr, arg=0: run_bpf(prog, nr, a["audit"], arg)  # noqa: E731
    for name, nr in a["deny"].items():
        assert run(nr) == EPERM, name
    special = set(a["deny"].values()) | {a["socket"], a["clone"], a["clone3"]}
    for nr in set(range(460)) - special:
        assert run(nr) == ALLOW, nr
        assert run(nr, sc.CLONE_NEW_ANY | 2) == ALLOW, nr  # only clone's flags are read
    assert run(a["clone3"]) == ENOSYS  # glibc falls back to clone()
    assert run(a["socket"], 1) == ALLOW  # AF_UNIX
    for family in (2, 10, 16, 17):  # AF_INET, AF_INET6, AF_NETLINK, AF_PACKET
        assert run(a["socket"], family) == EPERM
    assert run(a["clone"], 0x01200011) == ALLOW  # fork()'s flags: SIGCHLD|CHILD_SETTID|...
    for flag, bit in CLONE_NEW.items():
        assert run(a["clone"], bit | 0x11) == EPERM, flag
    assert run_bpf(prog, 0, 0x40000003) == EPERM  # i386 on x86_64
    other = sc.ARCHES["aarch64" if machine == "x86_64" else "x86_64"]["audit"]
    assert run_bpf(prog, 0, other) == EPERM
    assert prog[0] == (0x20, 0, 0, 4) and prog[2] == (0x20, 0, 0, 0)  # arch first, then nr


def test_allowed_names_let_a_denied_syscall_or_any_socket_through(monkeypatch) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: "x86_64")
    a = sc.ARCHES["x86_64"]
    prog = sc.seccomp_program(["ptrace", "socket"])
    assert prog is not None
    assert run_bpf(prog, a["deny"]["ptrace"], a["audit"]) == ALLOW
    assert run_bpf(prog, a["deny"]["mount"], a["audit"]) == EPERM
    assert run_bpf(prog, a["socket"], a["audit"], 2) == ALLOW
    assert run_bpf(prog, a["clone3"], a["audit"]) == ENOSYS
    assert run_bpf(prog, a["clone"], a["audit"], CLONE_NEW["NEWUSER"]) == EPERM


def test_an_unknown_architecture_has_no_filter(monkeypatch) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: "riscv64")
    assert sc.seccomp_program() is None
    libc = Libc(monkeypatch)
    assert sc.apply_seccomp() is False and libc.prctls == []


def test_a_jump_past_255_instructions_is_refused(monkeypatch) -> None:
    def arch_with(n: int) -> dict[str, Any]:
        return {"audit": 7, "capset": 1, "socket": 2, "clone": 3, "clone3": 4,
                "deny": {f"s{i}": 100 + i for i in range(n)}}  # fmt: skip

    longest = {}
    for n in range(240, 260):
        monkeypatch.setattr(sc, "arch", lambda n=n: arch_with(n))
        try:
            prog = sc.seccomp_program()
        except ValueError as e:
            assert "jump out of range" in str(e)
            continue
        assert prog is not None
        longest[n] = max(max(jt, jf) for code, jt, jf, k in prog if code in (0x15, 0x45))
        assert run_bpf(prog, 100 + n - 1, 7) == EPERM and run_bpf(prog, 99, 7) == ALLOW
    assert max(longest.values()) == 255 and 259 not in longest  # every jump that fits is kept


def test_the_filter_is_installed_as_a_seccomp_mode_2_program(monkeypatch) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: "x86_64")
    seen: list[bytes] = []

    class Prctl(Libc):
        def prctl(self, option, mode, fbuf, *rest):
            n, addr = struct.unpack("HxxxxxxQ", bytes(fbuf.raw))
            seen.append(ctypes.string_at(addr, 8 * n))
            return super().prctl(option, mode, fbuf, *rest)

    libc = Prctl(monkeypatch)
    assert sc.apply_seccomp(["ptrace"]) is True
    (option, mode, _fprog, *rest) = libc.prctls[0]
    assert (option, mode, rest) == (22, 2, [0, 0])  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    prog = sc.seccomp_program(["ptrace"])
    assert prog is not None
    assert seen == [b"".join(struct.pack("HBBI", *ins) for ins in prog)]
    libc.answers["prctl"] = -1
    with pytest.raises(OSError, match="seccomp"):
        sc.apply_seccomp()


def test_capabilities_are_dropped_from_the_bounding_and_ambient_sets_then_capset(
    monkeypatch,
) -> None:
    monkeypatch.setattr(sc.platform, "machine", lambda: "aarch64")
    libc = Libc(monkeypatch)
    sc.drop_capabilities()
    assert libc.prctls == [*[(24, cap, 0, 0, 0) for cap in range(64)], (47, 4, 0, 0, 0)]
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    assert libc.calls == [(91, header, b"\0" * 24)]  # no effective, permitted, inheritable
    libc = Libc(monkeypatch, **{"91": -1})
    with pytest.raises(OSError, match="capset"):
        sc.drop_capabilities()
    monkeypatch.setattr(sc.platform, "machine", lambda: "riscv64")
    libc = Libc(monkeypatch)
    sc.drop_capabilities()
    assert libc.calls == [] and len(libc.prctls) == 65

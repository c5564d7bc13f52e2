"""The sandbox every process that imports or runs agent-written code runs in.

Staged to the GPU host beside runner.py with sandbox_policy.py, sandbox_confine.py,
sandbox_limits.py and sandbox_mounts.py (namespaces and mounts; standard library + ctypes only,
never harnesslab). Trusted side of the boundary up to the exec of the target; the target is
hostile. Usage:

    python -I sandbox.py --policy-stdin -- TARGET ARGV...   the policy: a frame on stdin first
    python -I sandbox.py --policy JSON -- TARGET ARGV...    by hand only (argv is visible inside)
    python -I sandbox.py --probe                            what this machine can apply (JSON)

The toolkit starts it only through `sandbox_policy.command()`: the policy (a typed
`sandbox_policy.Policy`; unknown keys are refused) travels on stdin, so no sandboxed process
sees it in a command line. The outer process (this file, trusted, not dumpable: a same-user
process can read neither its memory nor its environment) takes a private scratch folder
(sandbox_limits.Scratch: owned through a lock, so a folder whose outer was killed is swept by
the next sandbox, never a live one's), a cgroup with the memory and pids limits where it can
make one, and, where the kernel allows, new PID, network, IPC and mount namespaces; it forks a
reaper that is PID 1 of the new PID namespace (a fresh /proc is mounted there, so other
processes are not listed) and moves it into the cgroup. The reaper mounts an empty tmpfs over
the folders where sockets live and a size-limited tmpfs on the scratch folder, then forks the
target, which, before exec:
  - PR_SET_PDEATHSIG(SIGKILL) and PR_SET_NO_NEW_PRIVS;
  - rlimits: file size, CPU time, open files, no core files (and pids or memory where no cgroup
    holds them: sandbox_policy.Limits);
  - Landlock, seccomp and no capabilities (sandbox_confine.py says what each allows and why);
  - an environment made only of the policy's allowlist, a minimal PATH, the import roots, and
    HOME, TMPDIR and caches (Triton, bytecode, CUDA) inside the scratch folder.
When the target exits, the reaper exits with its status: the kernel then kills every process
left in the namespace (a setsid double-fork daemon included). Without a PID namespace the outer
is a subreaper and kills every descendant itself. A killed outer takes the reaper with it
(PDEATHSIG), and the reaper the target; with `die_with_parent` (the caller's pid) a dead caller
takes the outer with it too. A limit hit (the cgroup's own counters, a SIGXCPU/SIGXFSZ death, a
full scratch) ends the whole sandbox at once. At the end the outer removes the cgroup and the
scratch folder.

Reports, on stdout or the policy's `report_fd`: first `{"event": "sandbox", ...}` (what was
applied, written before the target runs, so the caller never has to trust the target's own
report), last `{"event": "sandbox_exit", "token", "status", "limits_hit"}` (written after every
process of the sandbox is gone; the token is the policy's, which the target never sees). A setup
that fails before the target runs reports `{"event": "sandbox_failed", "error"}` instead. Where
nothing can be applied the policy decides: `require` makes the outer exit 3 with a message
instead of running the target.

Views (`bind`, (SOURCE, TARGET) pairs): in the reaper's mount namespace each SOURCE folder is
mounted at TARGET, in order, after the socket folders are hidden and before the scratch tmpfs
and anything of the target, so the policy's read, write and cwd paths name TARGETs (a generated
server's custom tools see a clean room at the workspace's own path). A TARGET under /proc, or
that is, holds or lies in the scratch folder, is refused (the binds never undo the private
/proc or the scratch tmpfs); without a mount namespace the outer exits 126 instead of running
the target with paths that would name the TARGETs themselves.
"""

from __future__ import annotations

import json
import os
import platform
import select
import signal
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))


# Staged siblings: from this package when the host imports this file, by plain name when run
# as a script on the GPU host (the sibling import rule: runner.py's docstring).
if TYPE_CHECKING or __package__:
    from . import sandbox_confine as sc
    from . import sandbox_limits as sl
    from . import sandbox_mounts as sm
    from . import sandbox_policy as sp
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import sandbox_confine as sc
    import sandbox_limits as sl
    import sandbox_mounts as sm
    import sandbox_policy as sp

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36
ENV_ALWAYS = ("LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/cuda/bin")
LINUX = sc.LINUX
# The outer's exit when its own setup failed (scratch, namespaces, cgroup) before the target
# ran; its report channel carries `{"event": "sandbox_failed", "error"}` instead of the report.
SETUP_FAILED = 125
_libc = sc.libc
Policy = sp.Policy


def target_path(policy: Any) -> str:
    """The target's PATH: the policy's, or the interpreter's folder and the system's (never the
    caller's, which names its home, tools and users)."""
    if policy.path:
        return str(policy.path)
    dirs = [os.path.dirname(sys.executable), *SYSTEM_PATH]
    return os.pathsep.join(d for d in dict.fromkeys(dirs) if os.path.isdir(d))


def target_env(policy: Any, scratch: str) -> dict[str, str]:
    keep = {*ENV_ALWAYS, *policy.env_allow}
    prefixes = tuple(policy.env_allow_prefixes)
    env = {
        k: v for k, v in os.environ.items() if k in keep or (prefixes and k.startswith(prefixes))
    }
    env["PATH"] = target_path(policy)
    if policy.python_path:
        # `python -I` children of the toolkit read them through BOOT; a plain `python` (a
        # command task's objective) through PYTHONPATH, which names only what lies outside
        # the interpreter's own installation (another interpreter would misread its stdlib).
        env.update(sp.import_env(list(policy.python_path), list(policy.python_sites)))
        extra = [r for r in policy.python_path if not sp.own_install(r)]
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(extra)
    env.update(policy.env)
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
    if policy.triton_cache:
        env["TRITON_CACHE_DIR"] = policy.triton_cache
    if policy.installed_bytecode:
        # The caller made the folder the target runs from and knows it holds no __pycache__ of
        # anyone's (a command task's fresh final folder): read the interpreter's installed
        # bytecode instead of compiling torch from source into an empty prefix (~8 s a run).
        env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["HARNESSLAB_SANDBOXED"] = "1"
    return env


# ----------------------------------------------------------------------------------------------
# limits and the target


def plan_limits(policy: Any, cgroup: Any, namespaces: list[str], gpu: bool) -> dict[str, str]:
    """What enforces each limit here (the report's `limits.by`)."""
    kind = f"cgroup-{cgroup.kind}" if cgroup is not None else ""
    own_user = os.getuid() != 0 and "user" in namespaces  # RLIMIT_NPROC exempts root
    return {
        "memory": kind or ("rlimit" if not gpu else "none"),
        "pids": kind or ("rlimit" if own_user else "none"),
        "file": "rlimit",
        "cpu": "rlimit",
        "open_files": "rlimit",
        "scratch": "tmpfs" if "mnt" in namespaces else "none",
    }


def _exec_target(
    policy: Any, argv: list[str], scratch: str, abi: int, enforced: dict[str, str]
) -> None:
    """In the target process: restrict everything, then exec. Never returns."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        env = target_env(policy, scratch)
        sl.apply_rlimits(policy.limits, enforced)
        if LINUX and _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise sc.oserror("no_new_privs")
        if abi:
            devices = sc.device_paths()
            read = sc.read_paths([*policy.read, *policy.python_path], argv[0], sc.has_gpu(devices))
            sc.apply_landlock(abi, read, [scratch, *policy.write], devices)
        if LINUX and policy.seccomp:
            sc.apply_seccomp(list(policy.seccomp_allow))
        if LINUX and policy.drop_caps:
            sc.drop_capabilities()
        os.chdir(policy.cwd or scratch)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # the target never ran: say why on stderr, exit 126
        sys.stderr.write(f"sandbox: cannot start the target: {exc}\n")
        sys.stderr.flush()
    os._exit(126)


def _status_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _reaper(policy: Any, argv: list[str], scratch: str, abi: int, enforced: dict[str, str],
            namespaces: list[str], go: int, result: int) -> None:  # fmt: skip
    """PID 1 of the new namespace (or a plain child without one): wait for the outer's go,
    make the mounts, run the target, reap everything, tell the outer which limit ended it."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if os.read(go, 1) != b"g":  # the outer is gone or refused
        os._exit(1)
    os.close(go)
    try:
        if "mnt" in namespaces:
            sm.setup_mounts(policy, scratch, argv, "pid" in namespaces)
    except OSError as exc:  # the target must not run with half the view it was given
        sys.stderr.write(f"sandbox: {exc}\n")
        os._exit(126)
    target = os.fork()
    if target == 0:
        os.close(result)
        _exec_target(policy, argv, scratch, abi, enforced)
    hits: list[str] = []
    code = 1
    while True:
        try:
            done, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        hit = sl.signal_limit(status, usage.ru_utime + usage.ru_stime, policy.limits)
        if hit and hit not in hits:
            hits.append(hit)
        if done == target:
            code = _status_code(status)
            break
    if enforced.get("scratch") == "tmpfs":
        st = os.statvfs(scratch)
        if st.f_bavail * st.f_frsize < (1 << 20):
            hits.append("scratch")
    os.write(result, json.dumps({"limits_hit": hits}).encode())
    os._exit(code)


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


def _wait_reaper(child: int, cgroup: Any) -> int:
    """Reap until `child` exits (orphans too, as a subreaper); a cgroup limit hit kills it."""
    try:
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        while True:
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 1
            if done == child:
                return _status_code(status)
            if done:
                continue
            if cgroup is not None and cgroup.hits():
                cgroup.kill()
            if pidfd >= 0:
                select.select([pidfd], [], [], 0.1)
            else:
                time.sleep(0.05)
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _emit(fd: int, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        try:
            data = data[os.write(fd, data) :]
        except OSError:
            return  # the caller stopped listening


def run(policy: Any, argv: list[str]) -> int:
    """The outer process: report, scratch, cgroup, the reaper and its target, clean up."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    out = policy.report_fd if policy.report_fd >= 0 else 1
    if out != 1:
        os.set_inheritable(out, False)
    abi = sc.landlock_abi() if policy.landlock else 0
    in_place = policy.fork is False and not policy.namespaces
    limits = policy.limits
    scratch, cgroup = None, None
    try:
        scratch = sl.Scratch(policy.scratch_root or tempfile.gettempdir(), inheritable=in_place)
        for folder in policy.mkdir:  # write grants that must exist before Landlock
            os.makedirs(folder, mode=0o700, exist_ok=True)
        wanted = policy.namespaces
        if wanted is True:
            namespaces = sm.enter_namespaces()
        elif isinstance(wanted, list) and wanted:
            namespaces = sm.enter_namespaces([n for n in wanted if n in sm.NAMESPACES])
        else:
            namespaces = []
        if not in_place and limits.cgroup != "off" and LINUX:
            cgroup = sl.Cgroup.create(limits.memory_mb << 20, limits.pids)
        enforced = plan_limits(policy, cgroup, namespaces, sc.has_gpu(sc.device_paths()))
    except Exception as exc:  # nothing of the target ran: say why where the caller listens
        if cgroup is not None:
            cgroup.remove()
        if scratch is not None:
            scratch.remove()
        why = f"{type(exc).__name__}: {exc}"[:300]
        if policy.report:
            _emit(out, {"event": "sandbox_failed", "error": why})
        sys.stderr.write(f"sandbox: could not set up ({why}); not running the target\n")
        return SETUP_FAILED
    argv = [a.replace("{scratch}", scratch.path) for a in argv]
    pidns = "pid" in namespaces
    applied = {
        "landlock_abi": abi,
        "namespaces": namespaces,
        "seccomp": bool(LINUX and policy.seccomp and sc.arch()),
        "no_new_privs": LINUX,
        "capabilities": "dropped" if LINUX else "kept",
        "lifetime": "pid_namespace" if pidns else "caller" if in_place else "subreaper",
        "limits": {
            "memory_mb": limits.memory_mb, "pids": limits.pids, "file_mb": limits.file_mb,
            "cpu_s": limits.cpu_s, "open_files": limits.open_files,
            "scratch_mb": limits.scratch_mb, "by": enforced,
        },
    }  # fmt: skip
    applied["level"] = "none" if not abi else "full" if pidns and "net" in namespaces else "partial"

    def finish(code: int, hits: list[str]) -> int:
        if cgroup is not None:
            cgroup.remove()
        scratch.remove()
        if policy.report:
            _emit(out, {"event": "sandbox_exit", "token": policy.token, "status": code,
                        "limits_hit": hits})  # fmt: skip
        return code

    if policy.report:
        _emit(out, {"event": "sandbox", **applied})
    if policy.require and applied["level"] == "none":
        sys.stderr.write(
            "sandbox: Landlock is not available on this machine (kernel without it, or "
            "macOS); refusing to run agent-written code unsandboxed. Set "
            "HARNESSLAB_ALLOW_UNSANDBOXED=1 to run it anyway, knowingly.\n"
        )
        return finish(3, [])
    refusal = sm.bind_refusal(policy.bind, scratch.path)
    if policy.bind and "mnt" not in namespaces:
        refusal = "the policy mounts folders at other paths (bind), which needs a mount namespace"
    if refusal:
        sys.stderr.write(f"sandbox: {refusal}; not running the target\n")
        return finish(126, [])
    if in_place:
        # No reaper: this process becomes the target (its lock goes with it; its lifetime is
        # its caller's process group).
        _exec_target(policy, argv, scratch.path, abi, enforced)
    if not pidns:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    reaper: list[int] = []

    def _on_signal(signum, frame):
        for pid in reaper:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if policy.die_with_parent:
        # A long-lived caller (a generated server; the value is its pid) that dies takes the
        # sandbox with it: TERM here kills the reaper, whose namespace goes with it. The caller
        # starts this process from a thread that lives as long as it does (the kernel signals
        # on the death of the forking thread).
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != policy.die_with_parent:  # it died before the line above
            return finish(1, [])
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    child = os.fork()
    if child == 0:
        for fd in (go_w, res_r, out) if out != 1 else (go_w, res_r):
            os.close(fd)
        _reaper(policy, argv, scratch.path, abi, enforced, namespaces, go_r, res_w)
    reaper.append(child)
    os.close(go_r)
    os.close(res_w)
    if cgroup is not None and not cgroup.add(child):
        os.close(go_w)  # the report promised the cgroup's limits: never run without them
        sys.stderr.write("sandbox: cannot move the sandbox into its cgroup\n")
        os.waitpid(child, 0)
        return finish(126, [])
    os.write(go_w, b"g")
    os.close(go_w)
    code = _wait_reaper(child, cgroup)
    if not pidns and LINUX:
        _kill_descendants()
    hits: list[str] = []
    try:
        said = json.loads(os.read(res_r, 4096) or b"{}")
        hits = [h for h in said.get("limits_hit", []) if isinstance(h, str)]
    except (OSError, ValueError, AttributeError):
        pass
    os.close(res_r)
    if cgroup is not None:
        hits = [*cgroup.hits(), *[h for h in hits if h not in cgroup.hits()]]
    return finish(code, hits)


def probe() -> dict[str, Any]:
    """What this machine can apply, without applying anything to this process."""
    abi = sc.landlock_abi()
    pid = os.fork()
    if pid == 0:
        ok = sm.enter_namespaces()
        os._exit(0 if ok and "pid" in ok else 1)
    _, status = os.waitpid(pid, 0)
    group = sl.Cgroup.create(64 << 20, 64) if LINUX else None
    if group is not None:
        group.remove()
    return {
        "landlock_abi": abi,
        "namespaces": os.waitstatus_to_exitcode(status) == 0,
        "seccomp": sc.arch() is not None,
        "cgroup": group.kind if group is not None else "none",
        "machine": platform.machine(),
        "kernel": platform.release(),
        "level": "none" if not abi else "full",
    }


def read_policy(fd: int) -> Any:
    """The policy frame at the start of `fd` (sandbox_policy.frame), read to its last byte and
    no further: what follows is the target's."""

    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise ValueError("the policy frame ended early")
            buf += chunk
        return buf

    size = int(exact(8), 16)
    if not 0 < size <= sp.MAX_POLICY_BYTES:
        raise ValueError("the policy frame has a bad length")
    data = exact(size + 1)
    if data[-1:] != b"\n":
        raise ValueError("the policy frame is not terminated")
    return Policy.from_json(data[:-1])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    if "--" not in argv or argv[0] not in ("--policy", "--policy-stdin"):
        sys.stderr.write("usage: sandbox.py --policy-stdin -- TARGET ARGV... | --probe\n")
        return 2
    split = argv.index("--")
    try:
        if argv[0] == "--policy-stdin":
            policy = read_policy(0)
        else:
            policy = Policy.from_json(argv[1] if split > 1 else "")
    except ValueError as exc:
        sys.stderr.write(f"sandbox: {exc}\n")
        return 2
    target = argv[split + 1 :]
    if not target:
        sys.stderr.write("sandbox: no target command\n")
        return 2
    if not os.path.isabs(target[0]):
        import shutil

        found = shutil.which(target[0])
        if found is None:
            sys.stderr.write(f"sandbox: {target[0]}: not found\n")
            return 127
        target[0] = found
    return run(policy, target)


if __name__ == "__main__":
    sys.exit(main())

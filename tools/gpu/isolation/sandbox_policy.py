"""The sandbox's policy, typed, and the one way to start anything inside the sandbox.

Staged to the GPU host beside sandbox.py (standard library only, never harnesslab) and imported by
the host too: the launcher, the guarded verify's parent (guard.py), the clean room and the custom
tools' host all build a `Policy` and hand it to `command()`, which gives the argv and the bytes to
write first on the sandbox's stdin. Trusted side of the boundary.

The policy never travels on a command line (a sandboxed process could read it in
/proc/<pid>/cmdline): sandbox.py reads it as one frame from its stdin (`frame()`: 8 hex digits of
length, the JSON, a newline) before anything else, and the target inherits stdin after it.
sandbox.py refuses a policy with a key it does not know (`Policy.from_json`): a new key is a field
here and its use in sandbox.py, staged together (the staged copies are hash-checked against the
installed package on every call), so an old sandbox never ignores a rule it cannot apply. A
custom tool's write set is its `write`; `bind` ((source, target) pairs of absolute paths) mounts
folders at other paths in the sandbox's mount namespace, where sandbox.py makes its tmpfs mounts.

Import roots: children run `python -I` (no PYTHONPATH, no user site: nothing of the environment
decides what they import), so the toolkit passes the folders its own interpreter imports from
(`import_roots()`: the standard library, site folders, and every sys.path entry that is an
installation: it holds a *.dist-info, or provides a module the toolkit's children import) as
HARNESSLAB_IMPORT_PATH, and `python_argv()` starts the program through `BOOT`, which puts them
first on sys.path. The sandbox grants read access to exactly those folders.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any

IMPORT_PATH_VAR = "HARNESSLAB_IMPORT_PATH"
IMPORT_SITES_VAR = "HARNESSLAB_IMPORT_SITES"
# Modules the toolkit's children import (the runner: torch, triton; generated servers and their
# tests: harnesslab, mcp, pydantic, anyio, pytest): a sys.path entry that provides one is an
# import root even without a *.dist-info (a source checkout on PYTHONPATH).
CHILD_MODULES = ("harnesslab", "torch", "triton", "numpy", "mcp", "pydantic", "anyio", "pytest")
MAX_POLICY_BYTES = 1 << 20

# `python -I -B -c BOOT PROGRAM...`: PROGRAM is `script.py ARGS`, `-m module ARGS` or `-c code
# ARGS`, run as `python -I -B PROGRAM` would, with the import roots first on sys.path and the
# .pth files of the site folders -I skipped (a --user install) processed.
BOOT = (
    "import os,sys\n"
    f"p=[d for d in os.environ.get({IMPORT_PATH_VAR!r},'').split(os.pathsep) if os.path.isabs(d)]\n"
    "sys.path[:]=p+[d for d in sys.path if d not in p]\n"
    f"for d in os.environ.get({IMPORT_SITES_VAR!r},'').split(os.pathsep):\n"
    " if os.path.isabs(d):\n"
    "  import site;site.addsitedir(d)\n"
    "import runpy\n"
    "a=sys.argv[1:]\n"
    "if a[:1]==['-m']:\n"
    " sys.argv=a[1:];runpy.run_module(a[1],run_name='__main__',alter_sys=True)\n"
    "elif a[:1]==['-c']:\n"
    " sys.argv=['-c',*a[2:]];exec(compile(a[1],'<string>','exec'),{'__name__':'__main__'})\n"
    "else:\n"
    " sys.argv=a;runpy.run_path(a[0],run_name='__main__')\n"
)


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. The memory and pids limits are a cgroup's (v2, else v1) where
    this machine lets the sandbox make one; elsewhere pids falls back to RLIMIT_NPROC (only for a
    non-root user in its own user namespace: the kernel exempts root) and memory to RLIMIT_DATA
    (only without a GPU: RLIMIT_AS and RLIMIT_DATA count the address space CUDA reserves, tens of
    GiB, so on a GPU host memory is a cgroup's or none). File size, CPU time and open files are
    rlimits everywhere; scratch is a tmpfs of `scratch_mb` in the sandbox's mount namespace (its
    pages count as the sandbox's memory). The sandbox's report says what enforced each one."""

    pids: int = 1024  # processes and threads (torch starts one thread per core)
    memory_mb: int = 8192
    file_mb: int = 1024  # the largest file it may write (RLIMIT_FSIZE)
    cpu_s: int = 3600  # CPU seconds per process (RLIMIT_CPU)
    open_files: int = 4096  # RLIMIT_NOFILE
    scratch_mb: int = 1024
    cgroup: str = "auto"  # "auto": a cgroup where one can be made; "off": rlimits only

    @classmethod
    def from_dict(cls, raw: Any) -> Limits:
        return _build(cls, raw, "limits")


@dataclass(frozen=True)
class Policy:
    """What sandbox.py applies to one target (every field optional; see sandbox.py)."""

    read: list[str] = field(default_factory=list)  # read + execute, beside the system's
    write: list[str] = field(default_factory=list)  # read + write (folders that exist)
    mkdir: list[str] = field(default_factory=list)  # made by the outer before it grants them
    scratch_root: str = ""  # where the private scratch folder is made (default: the temp dir)
    cwd: str = ""  # default: the scratch folder
    env: dict[str, str] = field(default_factory=dict)  # set in the target
    env_allow: list[str] = field(default_factory=list)  # kept from the outer's environment
    env_allow_prefixes: list[str] = field(default_factory=list)
    path: str = ""  # the target's PATH (default: the interpreter's folder and the system's)
    python_path: list[str] = field(default_factory=list)  # import roots (read-only, on sys.path)
    python_sites: list[str] = field(default_factory=list)  # of them, the .pth folders -I skips
    triton_cache: str = ""  # TRITON_CACHE_DIR (default: inside the scratch folder)
    installed_bytecode: bool = False  # read the interpreter's own __pycache__
    require: bool = False  # exit 3 instead of running the target where Landlock is missing
    landlock: bool = True
    namespaces: bool | list[str] = True  # True: pid, net, ipc, mnt; or the names wanted
    seccomp: bool = True
    seccomp_allow: list[str] = field(default_factory=list)  # refused syscalls let through
    drop_caps: bool = True
    fork: bool = True  # False (profiling): exec the target in place, no reaper
    die_with_parent: int = 0  # the caller's pid: its death ends the sandbox
    report: bool = True  # the first line on stdout (or report_fd) says what was applied
    report_fd: int = -1  # the reports' descriptor (framed callers); -1: stdout
    token: str = ""  # echoed in the exit report, which the target cannot forge without it
    limits: Limits = field(default_factory=Limits)
    # (SOURCE, TARGET) folders: SOURCE mounted at TARGET in the sandbox, in order, before the
    # paths above are resolved there (they name TARGETs); needs a mount namespace
    bind: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Policy:
        """The policy in `text`; ValueError for anything but an object of known keys with values
        of the right types."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"policy is not JSON: {exc}") from None
        return _build(cls, raw, "policy")

    def with_limits(self, limits: Limits) -> Policy:
        return dataclasses.replace(self, limits=limits)


def _build(cls: Any, raw: Any, what: str) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        kind = str(known[name].type)
        if kind == "Limits":
            values[name] = Limits.from_dict(value)
        elif kind == PAIRS:
            values[name] = _pairs(value, f"{what}.{name}")
        elif not _fits(kind, value):
            raise ValueError(f"{what}.{name}: {value!r} is not {kind}")
        else:
            values[name] = value
    return cls(**values)


PAIRS = "tuple[tuple[str, str], ...]"


def _pairs(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """`value` as (source, target) pairs of absolute paths (ValueError for anything else)."""
    if not isinstance(value, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(p, str) and os.path.isabs(p) for p in pair)
        for pair in value
    ):
        raise ValueError(f"{where}: {value!r} is not a list of [SOURCE, TARGET] absolute paths")
    return tuple((source, target) for source, target in value)


def _fits(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "dict[str, str]":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if kind == "bool | list[str]":
        return _fits("bool", value) or _fits("list[str]", value)
    return False


# ----------------------------------------------------------------------------------------------
# starting something in the sandbox


@dataclass(frozen=True)
class Launch:
    """How to start one sandboxed target: run `argv`, write `stdin` first on its stdin (the
    policy frame), then whatever the target reads. `token` identifies the sandbox's own exit
    report (`exit_report`)."""

    argv: list[str]
    stdin: bytes
    token: str

    @property
    def stdin_line(self) -> str:
        """The policy frame as a line (for senders that add the newline themselves)."""
        return self.stdin[:-1].decode()


def frame(policy: Policy) -> bytes:
    data = policy.to_json().encode()
    return b"%08x" % len(data) + data + b"\n"


def command(python: str, sandbox_py: str, policy: Policy, target: list[str]) -> Launch:
    """The one way to start `target` inside sandbox.py (at `sandbox_py`, run by `python`)."""
    token = policy.token or os.urandom(16).hex()
    policy = dataclasses.replace(policy, token=token)
    argv = [python, "-I", "-B", sandbox_py, "--policy-stdin", "--", *target]
    return Launch(argv=argv, stdin=frame(policy), token=token)


def exit_report(line: str, token: str) -> dict[str, Any] | None:
    """The sandbox's exit report in `line` when it carries `token`, else None."""
    if '"sandbox_exit"' not in line or not token:
        return None
    try:
        report = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(report, dict) or report.get("event") != "sandbox_exit":
        return None
    return report if report.get("token") == token else None


def take_reports(stdout: str, token: str) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(the sandbox's first report, its exit report or None, the target's own stdout) from the
    whole stdout of a sandboxed command that reported there."""
    first, _, rest = stdout.partition("\n")
    try:
        start = json.loads(first)
    except (ValueError, RecursionError):
        start = None
    if not isinstance(start, dict) or start.get("event") != "sandbox":
        start, rest = {}, stdout
    else:
        start = {k: v for k, v in start.items() if k != "event"}
    body, _, last = rest.rstrip("\n").rpartition("\n")
    end = exit_report(last, token)
    if end is not None:
        rest = body + "\n" if body else ""
    return start, end, rest


def limit_hit(report: dict[str, Any] | None) -> str:
    """The limit that ended a sandboxed run, from its exit report ('' when none did)."""
    hits = (report or {}).get("limits_hit")
    return str(hits[0]) if isinstance(hits, list) and hits else ""


# ----------------------------------------------------------------------------------------------
# Python children: import roots and the bootstrap


def python_argv(python: str, program: list[str]) -> list[str]:
    """`python -I -B PROGRAM` (a script and its arguments, `-m module ...` or `-c code ...`)
    with the import roots of IMPORT_PATH_VAR first on sys.path (`BOOT`)."""
    return [python, "-I", "-B", "-c", BOOT, *program]


def own_install(entry: str) -> bool:
    """Inside the interpreter's own installation (its standard library, lib-dynload, the
    venv's site-packages)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return any(entry == p or entry.startswith(p.rstrip(os.sep) + os.sep) for p in prefixes if p)


def _is_installation(entry: str) -> bool:
    try:
        names = os.listdir(entry)
    except OSError:
        return False
    if any(n.endswith((".dist-info", ".egg-info")) for n in names):
        return True
    provided = {n.removesuffix(".py") for n in names}
    return any(m in provided for m in CHILD_MODULES)


def import_roots(path: list[str] | None = None) -> list[str]:
    """This interpreter's import roots, in sys.path order: the standard library, its site
    folders and every entry that is an installation (a *.dist-info inside, or a module the
    toolkit's children import). Never '' or a project folder (the workspace a server was
    started from): nothing in them is the toolkit's."""
    import site

    keep = set(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    out: list[str] = []
    for entry in sys.path if path is None else path:
        if not entry or not os.path.isabs(entry) or entry in out or not os.path.exists(entry):
            continue
        if entry in keep or entry == user or own_install(entry) or _is_installation(entry):
            out.append(entry)
    return out


def import_sites(roots: list[str]) -> list[str]:
    """Of `roots`, the site folders whose .pth files `python -I` does not process (the user
    site), so the bootstrap does: an editable `pip install --user -e` lives in one."""
    import site

    user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    return [r for r in roots if r == user]


def import_env(roots: list[str], sites: list[str] | None = None) -> dict[str, str]:
    """The variables that give a bootstrapped child (`python_argv`) these import roots (and
    `sites`, default `import_sites(roots)`: the folders whose .pth files it processes)."""
    env = {IMPORT_PATH_VAR: os.pathsep.join(roots)}
    sites = import_sites(roots) if sites is None else sites
    if sites:
        env[IMPORT_SITES_VAR] = os.pathsep.join(sites)
    return env


def python_policy(roots: list[str]) -> dict[str, Any]:
    """Policy fields for a Python target with these import roots (see Policy)."""
    return {"python_path": list(roots), "python_sites": import_sites(roots)}


__all__ = [
    "BOOT",
    "IMPORT_PATH_VAR",
    "Launch",
    "Limits",
    "Policy",
    "command",
    "exit_report",
    "frame",
    "import_env",
    "import_roots",
    "limit_hit",
    "own_install",
    "python_argv",
    "python_policy",
    "take_reports",
]


if (
    __name__ == "__main__"
):  # the launcher asks a remote host's interpreter: sandbox_policy.py --import-roots
    if sys.argv[1:] == ["--import-roots"]:
        print(json.dumps(import_roots()))

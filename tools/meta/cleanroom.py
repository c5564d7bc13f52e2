"""The clean room qualification runs in, and the MCP session it drives there.

A clean room is a fresh workspace made from the task's template (the way `harnesslab init` makes
one) plus only the reusable `.harnesslab/` bundle of the server under test: its server folder and
its skill, never history, checkpoints or telemetry. Anything the server needs from the dirty
workspace that is not in the bundle is missing there, which is the point.

`ProtocolSession` drives `python -m harnesslab.servers.qualify_client` (a real MCP client on the
official SDK; this library never imports mcp) over JSON lines. The driver and the server share
one process group, started in a new session: every step is bounded, and `close()` kills the
whole group whatever state it is in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from .. import gpu
from ..catalog import QUALIFY_CLIENT_MODULE, SERVERS_MODULE
from ..errors import UsageError
from ..execution import ProcessGroup
from ..execution.executor import inherited_env
from ..gpu import wire
from ..gpu.isolation.sandbox_policy import (
    Launch,
    Limits,
    Policy,
    command,
    import_roots,
    limit_hit,
    python_policy,
    take_reports,
)
from ..settings import Settings
from ..state import workspace_files as wf
from ..state.storage import atomic_write_json
from ..state.trusted_store import TrustedStore
from ..state.workspace import STATE, init_workspace
from ..task.kinds import kind_of
from ..task.spec import list_tasks, load_task
from .qualify_checks import ENV_ALLOW, RUN_MARK

# Never copied into a clean room, never scanned: caches and qualification's own reports.
SKIP_NAMES = frozenset({"__pycache__", ".pytest_cache", "qualification.json", "failure_report.md"})
MAX_REPLY_BYTES = 8 << 20


def copy_bundle_item(src: Path, dest: Path) -> None:
    shutil.copytree(
        src, dest, ignore=lambda _d, names: [n for n in names if n in SKIP_NAMES], symlinks=False
    )


def make_clean_room(
    ws_template: str | Path,
    dest: Path,
    bundle: dict[str, Path],
    settings: Settings,
    *,
    shown: Path | None = None,
) -> Path:
    """A fresh workspace at `dest` from `ws_template` (a task name, a task folder, a workspace
    of a shipped task, or any plain folder), plus each bundle item copied to its relative
    destination (e.g. ".harnesslab/mcp/<name>"). Its trusted store goes under
    `settings.state_dir` (qualification passes a private one), under the key of `shown` too
    when its sandbox shows the room at that path (a store is keyed by the workspace's path)."""
    template = Path(ws_template) if not isinstance(ws_template, Path) else ws_template
    # The private state dir exists from the start: a sandbox grants write access only to a
    # folder that exists, and a command task copied as a plain folder creates none (its self-test
    # then failed with "Permission denied" on opening the workspace).
    settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if isinstance(ws_template, str) and not template.is_dir():
        init_workspace(ws_template, dest, settings)
    elif (template / "task.toml").is_file() and (
        kind_of(task := load_task(template)).template(task) is not None
        or (template / "workspace").is_dir()
    ):
        init_workspace(template, dest, settings)
    elif _shipped_task_of(template):
        init_workspace(_shipped_task_of(template), dest, settings)
    elif template.is_dir():  # a command task that is its own folder, or any plain folder
        shutil.copytree(template, dest, ignore=shutil.ignore_patterns(STATE, "__pycache__"))
    else:
        raise UsageError(
            f"workspace template {ws_template!s} is neither a task nor a folder.",
            next_step="pass a task name (rmsnorm_gate), a task folder or a workspace folder",
        )
    for rel, src in bundle.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            copy_bundle_item(src, target)
        elif src.is_file():
            shutil.copy2(src, target)
    store = TrustedStore.location(settings, dest)
    if shown is not None and store.is_dir():
        shutil.copytree(store, TrustedStore.location(settings, shown), dirs_exist_ok=True)
    return dest


def _shipped_task_of(folder: Path) -> str:
    """The shipped task a workspace folder's task view names ('' when none): a view is the
    agent's to edit, so only a shipped task's name is taken from it."""
    try:
        name = wf.read_json(folder, f"{STATE}/task.json").get("task")
    except (UsageError, AttributeError):
        return ""
    return name if isinstance(name, str) and name in list_tasks() else ""


def kill_marked(token: str, *, rounds: int = 5) -> list[int]:
    """SIGKILL every process of this user whose environment carries RUN_MARK=`token` (what a
    qualification started and left behind, setsid children included); bounded rounds, so a
    process forking as fast as it is killed cannot hold this up."""
    mark = f"{RUN_MARK}={token}".encode()
    killed: list[int] = []
    for _ in range(rounds):
        found = []
        for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or another user's
                continue
            if mark in environ.split(b"\0"):
                found.append(int(entry.name))
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            break
    return killed


# -- the sandbox around the agent's own processes in a clean room ------------------------------

SANDBOX_PY = gpu.FOLDER / "isolation" / "sandbox.py"
# What the toolkit's own code needs to be imported inside the sandbox (its folders, wherever
# the installation put them: site-packages, or the source tree of an editable install).
TOOLKIT_PACKAGES = (
    "harnesslab.tools",
    SERVERS_MODULE,
    "harnesslab.tasks",
    "harnesslab.skills",
)


def toolkit_paths() -> list[str]:
    out: list[str] = []
    for name in TOOLKIT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None:
            out += [str(p) for p in spec.submodule_search_locations or []]
    return sorted(set(out))


def sandboxed(
    argv: list[str], room: Path, state_dir: Path, env: dict[str, str], *, python: str,
    require: bool, limits: Limits, shown: Path | None = None,
) -> Launch:  # fmt: skip
    """`argv` run in the sandbox (tools/gpu/isolation/sandbox.py): the clean room and its private state dir
    writable, nothing else; the toolkit, its import roots, Python and the system read-only; no
    network; only `env` on top of the sandbox's short allowlist; the sandbox's `limits`;
    nothing left running after it. Its first stdout line is the sandbox's report, its last
    the exit report (`sandbox_report`). A Python `argv` is built with `python_argv`. `shown`:
    the path the room is mounted at in the sandbox (the served workspace's; `argv` names that
    path)."""
    seen = shown or room
    policy = Policy(
        read=toolkit_paths(),
        write=[str(seen), str(state_dir)],
        cwd=str(seen),
        env=env,
        require=require,
        limits=limits,
        bind=((str(room), str(seen)),) if seen != room else (),
        **python_policy(import_roots()),
    )
    return command(python, str(SANDBOX_PY), policy, argv)


def sandbox_report(stdout: str, token: str = "") -> tuple[dict[str, Any], str, str]:
    """(the sandbox's report, the limit that ended the run or '', the rest of stdout) from a
    sandboxed command's output."""
    start, end, rest = take_reports(stdout, token)
    return start, limit_hit(end), rest


def describe_sandbox(report: dict[str, Any]) -> str:
    """ "full (Landlock ABI 7, namespaces pid+net+ipc+mnt)", or "none"."""
    level = report.get("level")
    if level not in ("full", "partial"):
        return "none"
    spaces = "+".join(report.get("namespaces") or []) or "none"
    return f"{level} (Landlock ABI {report.get('landlock_abi')}, namespaces {spaces})"


def bundle_files(bundle: dict[str, Path]) -> list[tuple[str, Path]]:
    """(relative path in the clean room, source file) for every file of the bundle."""
    out: list[tuple[str, Path]] = []
    for rel, src in bundle.items():
        if src.is_file():
            out.append((rel, src))
            continue
        for path in sorted(src.rglob("*")):
            if path.is_file() and not SKIP_NAMES.intersection(path.relative_to(src).parts):
                out.append((f"{rel}/{path.relative_to(src).as_posix()}", path))
    return out


class ProtocolSession:
    """One MCP session with a server under test, through the qualify_client driver."""

    def __init__(self, python: str, workdir: Path) -> None:
        self.python = python
        self.workdir = workdir
        self.group: ProcessGroup | None = None
        self.stdout: BufferedByteReceiveStream | None = None
        self.noise: list[str] = []
        self.exit_code: int | None = None
        self.dead = False
        self.server_stderr = workdir / "server.stderr"
        self.driver_stderr = workdir / "driver.stderr"

    async def start(
        self, argv: list[str], cwd: Path, env: dict[str, str], startup_timeout_s: float
    ) -> dict[str, Any]:
        """Spawn the driver (which spawns the server); its first line says whether the server
        answered initialize within `startup_timeout_s`."""
        launch = self.workdir / "launch.json"
        atomic_write_json(
            launch,
            {
                "argv": argv,
                "cwd": str(cwd),
                "env": env,
                "stderr_path": str(self.server_stderr),
                "startup_timeout_s": startup_timeout_s,
            },
        )
        self.group = await ProcessGroup.spawn(
            [self.python, "-m", QUALIFY_CLIENT_MODULE, str(launch)],
            cwd=cwd,
            env={**inherited_env(ENV_ALLOW), **env},
            stderr=self.driver_stderr,
        )
        assert self.group.process.stdout is not None
        self.stdout = BufferedByteReceiveStream(self.group.process.stdout)
        # The driver imports the SDK (~1 s) before it starts the server.
        reply = await self._read(startup_timeout_s + 15.0)
        return reply or {"started": False, "error": "the MCP client driver did not answer"}

    async def request(self, op: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send one command; None when the driver did not answer in time (then it is killed)."""
        if self.dead or self.group is None or self.group.process.stdin is None:
            return None
        try:
            await self.group.process.stdin.send((json.dumps(op) + "\n").encode())
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.dead = True
            return None
        reply = await self._read(timeout_s)
        if reply is None:
            await self.kill()
        return reply

    async def _read(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.stdout is not None
        with anyio.move_on_after(timeout_s):
            try:
                line = await self.stdout.receive_until(b"\n", MAX_REPLY_BYTES)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, OSError):
                self.dead = True
                return None
            return wire.json_object(line)  # the generated server's: hostile
        return None

    async def kill(self) -> None:
        self.dead = True
        if self.group is not None and self.group.returncode is None:
            await self.group.terminate(grace_s=1.0)
        if self.group is not None:
            await self.group.release()

    async def close(self) -> None:
        """Ask the driver to stop the server and report its noise; bounded, then kill."""
        if self.group is None:
            return
        try:
            if not self.dead and self.group.process.stdin is not None:
                await self.group.process.stdin.send(b'{"op": "close"}\n')
                for _ in range(4):  # skip late replies to timed-out commands
                    reply = await self._read(10.0)
                    if reply is None:
                        break
                    if reply.get("closed"):
                        self.noise = [str(x) for x in reply.get("noise", [])]
                        self.exit_code = reply.get("exit_code")
                        break
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            # The whole group (TERM, then KILL); a straggler outside it (a runner) is not ours to
            # wait on.
            await self.group.kill(grace_s=1.0)

    def stderr_tail(self, lines: int = 25) -> str:
        text = ""
        for path in (self.server_stderr, self.driver_stderr):
            if path.is_file():
                text += path.read_text(errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])


__all__ = [
    "SKIP_NAMES",
    "ProtocolSession",
    "bundle_files",
    "copy_bundle_item",
    "describe_sandbox",
    "kill_marked",
    "make_clean_room",
    "sandbox_report",
    "sandboxed",
    "toolkit_paths",
]

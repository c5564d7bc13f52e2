"""The trusted host of a generated server's custom tools: one sandboxed worker per server.

Trusted side of the boundary. It runs in the generated server's process (toolkit code only) and
never imports the agent's modules: tools/meta/custom_worker.py does, inside tools/gpu/isolation/sandbox.py, with
read access to the workspace (the clean room in qualification), the server's bundle folder and
the worker's own two files, write access only to the server's declared write set
(tools/meta/writeset.py: its output folder `.harnesslab/out/<name>/` and the task's editable
files it names) and a private scratch folder, no network, nothing outliving it, and only the
sandbox's environment allowlist. Where the sandbox has a mount namespace the worker sees the
workspace at `seen_at` (qualification: the served workspace's own path, the clean room mounted
there) and the bundle at `<workspace>/.harnesslab/mcp/<name>`, in qualification and when
served alike. Requests and replies are wire.py frames; what comes back is hostile input
(bounded in size and time, and annotations are only ever mapped through a fixed table, never
evaluated).

    worker = CustomWorker(bundle, workspace, python=sys.executable, require=True)
    shapes = worker.describe([{"file": "diag.py", "function": "summary"}])   # at startup
    signature = public_signature("summary", shapes[0])                       # for the SDK
    result = await worker.call("diag.py", "summary", {"verbose": True})      # per call
    await worker.aclose()

A call that is cancelled (its time limit included) kills the worker; the next call starts a new
one. This module never imports mcp.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import inspect
import json
import keyword
import os
import select
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Union

import anyio

from .. import gpu
from ..errors import EnvironmentProblem, HarnesslabError, UsageError
from ..gpu import wire
from ..gpu.isolation.sandbox_policy import (
    Limits,
    Policy,
    command,
    exit_report,
    import_roots,
    limit_hit,
    python_argv,
    python_policy,
)
from ..state import workspace_files as wf
from .writeset import is_output

HERE = Path(__file__).resolve().parent
SANDBOX_PY = gpu.FOLDER / "isolation" / "sandbox.py"
WORKER_PY = HERE / "custom_worker.py"
WIRE_PY = gpu.FOLDER / "wire.py"
# The one value the server fills in; `state` (the server's own objects) cannot cross.
INJECTED = "workspace"
REFUSED = "state"
MAX_REPLY_BYTES = 16 << 20
REPORT_LINE_BYTES = 4096
CLOSE_GRACE_S = 2.0


class CustomToolFailed(HarnesslabError):
    """The custom function raised: `kind` is its exception's type, `message` its text."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WorkerGone(EnvironmentProblem):
    """The worker died, broke the protocol, or could not start."""


def state_refusal(where: str) -> UsageError:
    return UsageError(
        f"{where} asks for `state`, the server's own objects, which cannot cross into the "
        "sandbox custom tools run in.",
        next_step="take `workspace` (the workspace root, a Path) instead, or bind a built-in "
        "tool with presets for what needs the server (runs, sweeps, verification)",
    )


# -- annotations: text in, a type from a fixed table out ---------------------------------------

_NAMES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "None": type(None),
    "NoneType": type(None),
    "Path": str,
    "PurePath": str,
    "Any": Any,
    "object": Any,
    "list": list[Any],
    "List": list[Any],
    "Sequence": list[Any],
    "tuple": list[Any],
    "Tuple": list[Any],
    "set": list[Any],
    "dict": dict[str, Any],
    "Dict": dict[str, Any],
    "Mapping": dict[str, Any],
}
_MODULES = ("typing.", "pathlib.", "collections.abc.", "builtins.", "typing_extensions.")
_LISTS = ("list", "List", "Sequence", "tuple", "Tuple", "set")
MAX_ANNOTATION_DEPTH = 6
MAX_ANNOTATION_CHARS = 500
MAX_DOC_CHARS = 2000


def annotation_type(text: str) -> Any:
    """The type a custom parameter's annotation stands for, from a fixed table: str, int,
    float, bool, None, Path (as str), list[...], dict[...], Optional/Union/`|`, Literal of
    constants; Any for everything else (an unknown class, a string that does not parse)."""
    if not text or len(text) > MAX_ANNOTATION_CHARS:
        return Any
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Any
    return _convert(node, 0)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted forward ref
        return node.value.strip()
    return ""


def _bare(name: str) -> str:
    for prefix in _MODULES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _convert(node: ast.expr, depth: int) -> Any:
    if depth > MAX_ANNOTATION_DEPTH:
        return Any
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return annotation_type(node.value) if depth < 2 else Any
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_convert(node.left, depth + 1), _convert(node.right, depth + 1)])
    if isinstance(node, ast.Name | ast.Attribute):
        return _NAMES.get(_bare(_dotted(node)), Any)
    if not isinstance(node, ast.Subscript):
        return Any
    base = _bare(_dotted(node.value))
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base in _LISTS:
        inner = [_convert(a, depth + 1) for a in args if not isinstance(a, ast.Constant)]
        return list.__class_getitem__(inner[0] if len(inner) == 1 and base != "tuple" else Any)
    if base in ("dict", "Dict", "Mapping") and len(args) == 2:
        key = _convert(args[0], depth + 1)
        value = _convert(args[1], depth + 1)
        return dict.__class_getitem__((key if key in (str, int) else str, value))
    if base == "Optional" and len(args) == 1:
        return _union([_convert(args[0], depth + 1), type(None)])
    if base == "Union":
        return _union([_convert(a, depth + 1) for a in args])
    if base == "Literal":
        values = [a.value for a in args if isinstance(a, ast.Constant)]
        if values and len(values) == len(args):
            if all(v is None or isinstance(v, str | int | bool) for v in values):
                return Literal[tuple(values)]  # type: ignore[valid-type]
    return Any


def _union(types: list[Any]) -> Any:
    if any(t is Any for t in types):
        return Any
    unique = list(dict.fromkeys(types))
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007


def return_type(text: str) -> Any:
    """The return annotation the server declares: a dict as dict[str, Any] (structured output),
    other mapped types as they are, nothing (unstructured) for None or an unknown type."""
    mapped = annotation_type(text)
    if not text or mapped is Any or mapped is type(None):
        return inspect.Signature.empty
    if getattr(mapped, "__origin__", None) is dict:
        return dict[str, Any]
    return mapped


# -- describe ------------------------------------------------------------------------------------


@dataclass
class ParamShape:
    name: str
    kind: str
    annotation: str = ""
    has_default: bool = False
    default: Any = None


@dataclass
class ToolShape:
    doc: str = ""
    params: list[ParamShape] = field(default_factory=list)
    returns: str = ""


def _shape(raw: Any) -> ToolShape:
    if not isinstance(raw, dict) or not isinstance(raw.get("params"), list):
        raise WorkerGone("the custom worker's description is malformed")
    params = []
    for p in raw["params"]:
        name = str(p.get("name", "")) if isinstance(p, dict) else ""
        if not name.isidentifier() or keyword.iskeyword(name):
            raise WorkerGone("the custom worker's description is malformed")
        params.append(
            ParamShape(
                name=name,
                kind=str(p.get("kind", "")),
                annotation=str(p.get("annotation") or ""),
                has_default=bool(p.get("has_default")),
                default=p.get("default"),
            )
        )
    doc = str(raw.get("doc") or "")[:MAX_DOC_CHARS]
    return ToolShape(doc=doc, params=params, returns=str(raw.get("returns") or ""))


def public_signature(where: str, shape: ToolShape) -> inspect.Signature:
    """The signature the model sees: `workspace` hidden, every annotation mapped. UsageError
    for what cannot be served: `state`, positional-only parameters."""
    params = []
    for p in shape.params:
        if p.name == REFUSED:
            raise state_refusal(where)
        if p.name == INJECTED or p.kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if p.kind == "POSITIONAL_ONLY":
            raise UsageError(
                f"{where}: parameter {p.name!r} is positional-only.",
                next_step="make it an ordinary parameter (tools are called by keyword)",
            )
        params.append(
            inspect.Parameter(
                p.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=p.default if p.has_default else inspect.Parameter.empty,
                annotation=annotation_type(p.annotation),
            )
        )
    try:
        return inspect.Signature(params, return_annotation=return_type(shape.returns))
    except ValueError as exc:  # two parameters of one name, and the like
        raise UsageError(
            f"{where}: its parameters cannot be served ({exc}).",
            next_step="give it plain, distinct keyword parameters",
        ) from None


# -- the worker process --------------------------------------------------------------------------


@functools.cache
def mounts_available(python: str) -> bool:
    """Whether the sandbox gets its namespaces on this machine (`sandbox.py --probe`): only
    then can it mount a view (a user namespace refused, as in a nested sandbox, gives none)."""
    try:
        out = subprocess.run(
            [python, "-I", "-B", str(SANDBOX_PY), "--probe"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return bool(json.loads(out.stdout).get("namespaces"))
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        return False


def holds_toolkit(python: str, path: Path) -> bool:
    """Whether `path` holds the interpreter or the toolkit (a virtualenv inside the workspace):
    nothing may then be mounted over it, or the sandboxed process would not find them."""
    mine = (Path(python).absolute(), Path(python).resolve(), HERE.parents[1])
    return any(p == path or path in p.parents for p in mine)


@dataclass
class View:
    """Where the worker sees the workspace and the bundle, and the mounts that put them there."""

    workspace: Path
    bundle: Path
    binds: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class CustomWorker:
    """One sandboxed worker for the custom tools of one server (started on demand). `writes`:
    the checked write set, relative to the workspace (tools/meta/writeset.py); `seen_at`: the
    path the worker sees the workspace at (default: its own); `name`: the server's."""

    bundle: Path
    workspace: Path
    python: str
    require: bool = True
    startup_timeout_s: float = 30.0
    report: Path | None = None
    limits: Limits = field(default_factory=Limits)
    writes: list[str] = field(default_factory=list)
    seen_at: Path | None = None
    name: str = ""
    shown: View | None = None  # the view the running worker got
    sandbox: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    reports: int = -1  # the sandbox's reports: a pipe only its outer process writes
    token: str = ""

    def view(self) -> View:
        """The workspace mounted at `seen_at` (or at its own path: the same mounts whether
        qualified or served), the bundle at `<seen>/.harnesslab/mcp/<name>` where the workspace
        has that folder; with no mount namespace, both where they are (`seen_at` unused: the
        worker must never be granted the path of a workspace it is not shown)."""
        if not mounts_available(self.python):
            return View(self.workspace, self.bundle)
        seen = self.seen_at or self.workspace
        if holds_toolkit(self.python, seen):
            seen = self.workspace
        view = View(seen, self.bundle, [(str(self.workspace), str(seen))])
        rel = f"{wf.STATE}/mcp/{self.name}"
        if self.name and wf.is_dir(self.workspace, rel):
            view.bundle = seen / rel
            view.binds.append((str(self.bundle), str(view.bundle)))
        return view

    def policy(self, view: View) -> Policy:
        """The workspace (as `view` shows it), the bundle and the worker's two files readable,
        only the write set writable, no environment beyond the sandbox's short list, the
        sandbox's limits, and the server's own import roots (the custom code may import what
        the toolkit's Python has)."""
        return Policy(
            read=[str(view.workspace), str(view.bundle), str(WORKER_PY), str(WIRE_PY)],
            write=[str(view.workspace / rel) for rel in self.writes],
            cwd=str(view.workspace),
            require=self.require,
            die_with_parent=os.getpid(),
            limits=self.limits,
            bind=tuple(view.binds),
            **python_policy(import_roots()),
        )

    def _prepare(self) -> View:
        """The output folders of the write set, made in the workspace (through no symlink: a
        sandbox grant follows one), and the view the worker gets."""
        for rel in self.writes:
            if is_output(self.name, rel):
                wf.real_dir(self.workspace, rel)
        self.shown = self.view()
        return self.shown

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Started from the server's event-loop thread, which lives as long as the server:
        # the sandbox dies with it (die_with_parent).
        view = self._prepare()
        reports, report_w = os.pipe()
        program = python_argv(self.python, [str(WORKER_PY), str(WIRE_PY), str(view.bundle)])
        policy = replace(self.policy(view), report_fd=report_w)
        launch = command(self.python, str(SANDBOX_PY), policy, program)
        try:
            proc = subprocess.Popen(
                launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
                pass_fds=(report_w,),
            )  # fmt: skip
        except OSError:
            os.close(reports)
            raise
        finally:
            os.close(report_w)
        assert proc.stdout is not None and proc.stdin is not None
        try:
            os.write(proc.stdin.fileno(), launch.stdin)  # the policy, before any request
        except OSError:
            pass  # it died at once: the report says so
        self._close_reports()
        self.reports, self.token = reports, launch.token
        for fd in (proc.stdout.fileno(), proc.stdin.fileno(), reports):
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        return proc

    def _close_reports(self) -> None:
        if self.reports >= 0:
            os.close(self.reports)
            self.reports = -1

    def _limit(self) -> str:
        """The limit that ended the worker's sandbox, from its exit report ('' if none): read
        after its outer process is gone, so every line it wrote is there."""
        if self.reports < 0:
            return ""
        data = b""
        try:
            while chunk := os.read(self.reports, 1 << 16):
                data += chunk
        except OSError:
            pass
        for line in data.decode(errors="replace").splitlines():
            end = exit_report(line, self.token)
            if end is not None:
                return limit_hit(end)
        return ""

    def _started(self, line: bytes) -> None:
        """The sandbox's own report (its first line, written before the worker runs)."""
        report = wire.json_object(line)
        if report is None or report.get("event") != "sandbox":
            raise WorkerGone("the custom tools' sandbox did not start")
        self.sandbox = {k: v for k, v in report.items() if k != "event"}
        if self.report is not None:
            with open(self.report, "a") as fh:
                fh.write(json.dumps(report) + "\n")
        if self.sandbox.get("level") not in ("full", "partial") and self.require:
            raise WorkerGone(
                "no sandbox can be applied on this machine (no Landlock), so the custom tools "
                "(agent-written code) are not run.",
                next_step="run the server on Linux with Landlock, or set "
                "HARNESSLAB_ALLOW_UNSANDBOXED=1 to run them anyway, knowingly",
            )

    # -- synchronous use at startup (before the event loop serves anything) ------------------

    def describe(self, tools: list[dict[str, str]]) -> list[ToolShape]:
        """Import each custom module in the worker and describe its functions, in order."""
        if self.proc is None:
            self.proc = self._spawn()
            try:
                self._started(self._report_line_sync(self.startup_timeout_s))
            except wire.WireError:
                raise self._gone("did not start") from None
            except WorkerGone:
                self.kill_now()
                raise
        deadline = time.monotonic() + self.startup_timeout_s
        self._send_sync({"op": "describe", "tools": tools}, deadline)
        try:
            head = self._read_sync(4, deadline)
            reply = wire.decode(self._read_sync(self._size(head), deadline))
        except wire.WireError as exc:
            self.kill_now()
            if exc.kind == "timeout":
                raise UsageError(
                    f"importing the custom tools' modules took more than "
                    f"{self.startup_timeout_s:g}s.",
                    next_step="do no slow work at import time (move it into the function)",
                ) from None
            raise self._gone("stopped while importing the custom tools' modules") from None
        shapes = self._result(reply, "describe")
        if not isinstance(shapes, list) or len(shapes) != len(tools):
            raise WorkerGone("the custom worker's description is malformed")
        return [_shape(s) for s in shapes]

    def _report_line_sync(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        out = bytearray()
        while not out.endswith(b"\n"):
            if len(out) > REPORT_LINE_BYTES:
                raise wire.WireError("protocol", "report line too long")
            select.select([self.reports], [], [], max(deadline - time.monotonic(), 0))
            try:
                chunk = os.read(self.reports, 1)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise wire.WireError("timeout") from None
                continue
            if not chunk:
                raise wire.WireError("eof")
            out += chunk
        return bytes(out)

    def _out(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def _in(self) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        return self.proc.stdin.fileno()

    def _send_sync(self, obj: Any, deadline: float) -> None:
        view = memoryview(wire.encode(obj))
        while view:
            try:
                view = view[os.write(self._in(), view) :]
            except BlockingIOError:
                select.select([], [self._in()], [], max(deadline - time.monotonic(), 0))
                if time.monotonic() > deadline:
                    raise self._gone("did not read its request") from None
            except OSError:
                raise self._gone("is gone") from None

    def _read_sync(self, n: int, deadline: float) -> bytes:
        return wire.read_exact(self._out(), n, max(deadline - time.monotonic(), 0.0))

    @staticmethod
    def _size(head: bytes) -> int:
        (size,) = struct.unpack(">I", head)
        if size > MAX_REPLY_BYTES:
            raise wire.WireError("protocol", f"reply of {size} bytes")
        return size

    def _gone(self, what: str) -> WorkerGone:
        code = self.proc.poll() if self.proc is not None else None
        self.kill_now()
        limit = self._limit()
        self._close_reports()
        if limit:
            return WorkerGone(
                f"the custom tools' worker hit its sandbox's {limit} limit "
                f"(resource_limit: {limit}) and was stopped.",
                next_step="make the custom function use less (memory, processes, disk, CPU "
                "time); the limits are the operator's HARNESSLAB_SANDBOX_* settings",
            )
        return WorkerGone(
            f"the custom tools' worker {what}"
            + (f" (exit {code})" if code is not None else "")
            + ".",
            next_step="read the server's stderr for the custom code's own output",
        )

    def kill_now(self) -> None:
        """Stop the worker at once (its sandbox takes every process it started with it)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the outer kills its reaper: the namespace goes
            try:
                proc.wait(timeout=CLOSE_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for fh in (proc.stdin, proc.stdout):
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass

    @staticmethod
    def _result(reply: Any, what: str) -> Any:
        if not isinstance(reply, dict):
            raise WorkerGone(f"the custom worker's {what} reply is malformed")
        if reply.get("ok") is True:
            return reply.get("tools" if what == "describe" else "result")
        err = reply.get("error")
        err = err if isinstance(err, dict) else {}
        raise CustomToolFailed(str(err.get("type") or "Error")[:200], str(err.get("message") or ""))

    # -- asynchronous use per call -----------------------------------------------------------

    async def call(self, file: str, function: str, args: dict[str, Any]) -> Any:
        """Run one custom function with JSON `args`; its JSON result. CustomToolFailed when it
        raised, WorkerGone when the worker died; a cancelled call (a time limit) kills the
        worker."""
        async with self.lock:
            try:
                if self.proc is None:
                    self.proc = self._spawn()
                    self._started(await self._read_line(self.reports))
                assert self.shown is not None
                request = {
                    "op": "call",
                    "file": file,
                    "function": function,
                    "args": args,
                    "workspace": str(self.shown.workspace),
                }
                await self._send(request)
                head = await self._read_exact(4)
                reply = wire.decode(await self._read_exact(self._size(head)))
            except wire.WireError as exc:
                raise self._gone(f"broke the protocol ({exc.kind})") from None
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._kill()
                raise
        return self._result(reply, "call")

    async def _send(self, obj: Any) -> None:
        view = memoryview(wire.encode(obj))
        while view:
            try:
                view = view[os.write(self._in(), view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._in())
            except OSError:
                raise self._gone("is gone") from None

    async def _read_exact(self, n: int, fd: int | None = None) -> bytes:
        fd = self._out() if fd is None else fd
        out = bytearray()
        while len(out) < n:
            try:
                chunk = os.read(fd, min(n - len(out), 1 << 20))
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            if not chunk:
                raise self._gone("exited")
            out += chunk
        return bytes(out)

    async def _read_line(self, fd: int) -> bytes:
        out = bytearray()
        with anyio.fail_after(self.startup_timeout_s):
            while not out.endswith(b"\n"):
                if len(out) > REPORT_LINE_BYTES:
                    raise self._gone("did not start")
                out += await self._read_exact(1, fd)
        return bytes(out)

    async def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            await _exited(proc, CLOSE_GRACE_S)
        self.kill_now()

    async def aclose(self) -> None:
        """Ask the worker to exit (its sandbox then ends every process it left), bounded."""
        proc = self.proc
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self._send({"op": "exit"})
            except (WorkerGone, OSError):
                pass
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            await _exited(proc, CLOSE_GRACE_S)
            self.kill_now()
            self._close_reports()


async def _exited(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `proc` to exit (a pidfd turns readable when it does)."""
    if proc.poll() is not None:
        return True
    fd = os.pidfd_open(proc.pid)  # ours until we reap it: the pid cannot be reused meanwhile
    try:
        with anyio.move_on_after(timeout_s):
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)
    return proc.poll() is not None


__all__ = [
    "CustomToolFailed",
    "CustomWorker",
    "ParamShape",
    "ToolShape",
    "View",
    "WorkerGone",
    "annotation_type",
    "holds_toolkit",
    "mounts_available",
    "public_signature",
    "return_type",
    "state_refusal",
]

"""The process a generated server's custom tools run in: it imports the agent's modules.

Untrusted side of the boundary: it runs inside sandbox.py (started by tools/meta/custom_host.py)
and everything it does after the first import is the agent's code. Standard library only (it
never imports harnesslab); wire.py is loaded by path, since the folder it sits in is not
readable from the sandbox.

    python -I -B custom_worker.py WIRE_PY BUNDLE_DIR

Frames (wire.py) on the stdin/stdout it started with; the custom code's own prints go to
stderr (fd 1 is pointed there before anything is imported), so they can never pass for a frame
by accident. Requests and replies:

    {"op": "describe", "tools": [{"file", "function"}]}
        -> {"ok": true, "tools": [{"doc", "params": [{"name", "kind", "annotation",
            "has_default", "default"}], "returns"}]}
    {"op": "call", "file", "function", "args", "workspace"}
        -> {"ok": true, "result": JSON}
    any failure -> {"ok": false, "error": {"type", "message"}}
    {"op": "exit"} or end of input: the worker exits.

A parameter named `workspace` gets the workspace root (a Path). Annotations come back as text,
never as objects: the server maps them to types from a fixed list and never evaluates them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

MAX_TEXT = 2000


def _load_wire(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("_harnesslab_wire", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"custom worker: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, type):
        if value.__module__ == "builtins":
            return value.__qualname__
        return f"{value.__module__}.{value.__qualname__}"[:MAX_TEXT]
    return repr(value)[:MAX_TEXT]


def _plain(value: Any) -> Any:
    """JSON-ready: models dumped, paths and anything else unknown as text."""

    def fallback(obj: Any) -> Any:
        dump = getattr(obj, "model_dump", None)
        if callable(dump):
            return dump(mode="json")
        if isinstance(obj, set | frozenset):
            return sorted(obj, key=repr)
        return str(obj)

    return json.loads(json.dumps(value, default=fallback))


class Worker:
    def __init__(self, bundle: str) -> None:
        self.bundle = Path(bundle)
        self.modules: dict[str, Any] = {}
        # Sibling imports (`from helpers import x`) resolve in the bundle, as they did when
        # the server ran the file itself.
        sys.path.insert(0, bundle)

    def function(self, file: str, name: str) -> Any:
        if os.sep in file or not file.endswith(".py"):
            raise ValueError(f"{file!r} is not a module of the server's folder")
        module = self.modules.get(file)
        if module is None:
            path = self.bundle / file
            spec = importlib.util.spec_from_file_location(f"_custom_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {file}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            self.modules[file] = module
        fn = getattr(module, name, None)
        if fn is None or not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{file} has no async function {name!r}")
        return fn

    def describe(self, req: dict[str, Any]) -> dict[str, Any]:
        out = []
        for tool in req.get("tools") or []:
            fn = self.function(str(tool["file"]), str(tool["function"]))
            sig = inspect.signature(fn)
            params = []
            for p in sig.parameters.values():
                has_default = p.default is not inspect.Parameter.empty
                params.append(
                    {
                        "name": p.name,
                        "kind": p.kind.name,
                        "annotation": _annotation(p.annotation),
                        "has_default": has_default,
                        "default": _plain(p.default) if has_default else None,
                    }
                )
            out.append(
                {
                    "doc": (inspect.getdoc(fn) or "")[:MAX_TEXT],
                    "params": params,
                    "returns": _annotation(sig.return_annotation),
                }
            )
        return {"ok": True, "tools": out}

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        fn = self.function(str(req["file"]), str(req["function"]))
        kwargs = dict(req.get("args") or {})
        if "workspace" in inspect.signature(fn).parameters:
            kwargs["workspace"] = Path(str(req["workspace"]))
        return {"ok": True, "result": _plain(asyncio.run(fn(**kwargs)))}


def main(argv: list[str]) -> int:
    # `python -I` never read it; the sandbox sets it for plain `python` targets, and only where
    # the sandbox's own interpreter does not hold the import roots (a qualification's clean room
    # and a served workspace can differ there). The custom code sees the same environment in both.
    os.environ.pop("PYTHONPATH", None)
    wire = _load_wire(argv[0])
    # The protocol keeps the pipes it started with; fd 0 and 1 become /dev/null and stderr.
    fd_in, fd_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    worker = Worker(argv[1])
    while True:
        try:
            req = wire.recv(fd_in)
        except wire.WireError:
            return 0  # the server is gone, or closed its end
        if not isinstance(req, dict) or req.get("op") == "exit":
            return 0
        try:
            handler = {"describe": worker.describe, "call": worker.call}[str(req.get("op"))]
            reply = handler(req)
        except BaseException as exc:  # the agent's code failed (SystemExit too): type, message
            reply = {
                "ok": False,
                "error": {"type": type(exc).__name__[:200], "message": _text(exc)},
            }
        try:
            wire.send(fd_out, reply)
        except OSError:
            return 0


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_TEXT]
    except Exception:  # a hostile __str__
        return "(no message)"


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # threads the custom code left behind do not keep the worker alive

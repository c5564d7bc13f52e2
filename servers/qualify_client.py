"""The protocol half of qualification: a real MCP client (the official SDK) that talks to a
server over stdio, driven line by line by tools/meta/qualification.py (which never imports mcp).

    python -m harnesslab.servers.qualify_client LAUNCH.json

LAUNCH.json: {"argv", "cwd", "env", "stderr_path", "startup_timeout_s"}. The server starts in
this process's process group, so killing the driver's group (the caller starts it in a new
session) also kills the server. The server's raw stdout is read here line by line: a line that
is not a JSON-RPC message is recorded as noise and dropped, so the session goes on and the
noise becomes evidence. Commands arrive as JSON lines on stdin; each gets one JSON line on stdout:

    (first line)                                   {"started": true, "startup_s"} or
                                                   {"started": false, "error"}
    {"op": "tools"}                                {"ok": true, "tools": [{name, description,
                                                   input_schema, output_schema}]}
    {"op": "call", "tool", "args", "timeout_s"}    {"ok", "is_error", "timed_out", "text",
                                                   "structured", "duration_s"}
    {"op": "ping", "timeout_s"}                    {"ok"}
    {"op": "close"} or end of input                {"closed": true, "noise": [...], "exit_code"}
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp import Client
from mcp.shared.message import SessionMessage

log = logging.getLogger("harnesslab.qualify_client")

MAX_TEXT = 4000
MAX_STRUCTURED = 64_000
MAX_NOISE_LINES = 50


class _Streams:
    """A Transport over streams this module already bridges to the server's pipes."""

    def __init__(self, read: Any, write: Any) -> None:
        self.streams = (read, write)

    async def __aenter__(self) -> Any:
        return self.streams

    async def __aexit__(self, *exc: object) -> None:
        return None


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


class Noise(list[str]):
    """Lines of the server's stdout that are not JSON-RPC; `framed` is set once one of them is a
    Content-Length header."""

    def __init__(self) -> None:
        super().__init__()
        self.framed = anyio.Event()

    def add(self, text: str) -> None:
        if text.strip().lower().startswith("content-length:"):
            self.framed.set()
        if len(self) < MAX_NOISE_LINES:
            self.append(text[:300])


async def _reader(process: Process, sink: Any, noise: Noise, done: anyio.Event) -> None:
    """Server stdout -> session; anything that is not JSON-RPC is noise. Keeps draining after
    the session is gone so that output printed at exit is seen too."""
    assert process.stdout is not None
    deliver, pending = True, b""

    async def handle(raw: bytes) -> None:
        nonlocal deliver
        text = raw.decode(errors="replace").rstrip("\r")
        try:
            message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except ValueError:
            noise.add(text)
            return
        if deliver:
            try:
                await sink.send(SessionMessage(message))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                deliver = False

    try:
        async for chunk in process.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                await handle(raw)
        if pending:
            await handle(pending)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass
    finally:
        await sink.aclose()
        done.set()


async def _writer(process: Process, source: Any) -> None:
    assert process.stdin is not None
    try:
        async for message in source:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            await process.stdin.send(data.encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass


async def _stop(process: Process) -> None:
    """Close stdin, give the server 2 s to exit, then TERM and KILL it (bounded)."""
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and process.returncode is None:
            try:
                process.send_signal(sig)
            except ProcessLookupError:
                pass
        with anyio.move_on_after(2.0):
            await process.wait()
        if process.returncode is not None:
            return


def _text(result: types.CallToolResult) -> str:
    parts = [getattr(c, "text", "") or "" for c in result.content]
    return "\n".join(p for p in parts if p)[:MAX_TEXT]


async def _call(client: Client, op: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    timeout_s = float(op.get("timeout_s", 60))
    out: dict[str, Any] = {"ok": False, "is_error": False, "timed_out": False, "text": ""}
    with anyio.move_on_after(timeout_s) as scope:
        try:
            result = await client.call_tool(op["tool"], op.get("args") or {})
        except Exception as exc:  # a protocol error (unknown tool, bad arguments, closed)
            out.update(
                is_error=True, text=f"protocol error: {type(exc).__name__}: {exc}"[:MAX_TEXT]
            )
        else:
            structured = result.structured_content
            if structured is not None and len(json.dumps(structured, default=str)) > MAX_STRUCTURED:
                structured = {"_truncated": True}
            out.update(
                ok=not result.is_error,
                is_error=result.is_error,
                text=_text(result),
                structured=structured,
            )
    if scope.cancelled_caught:
        out.update(timed_out=True, text=f"no answer within {timeout_s:g}s")
    out["duration_s"] = round(time.perf_counter() - started, 3)
    return out


async def _serve_commands(client: Client) -> None:
    stdin = anyio.wrap_file(sys.stdin)
    while True:
        line = await stdin.readline()
        if not line:
            return
        try:
            op = json.loads(line)
        except json.JSONDecodeError:
            _emit({"ok": False, "error": "not JSON"})
            continue
        kind = op.get("op")
        if kind == "close":
            return
        if kind == "tools":
            try:
                listed = await client.list_tools()
                tools = [
                    {
                        "name": t.name,
                        "description": t.description or "",
                        "input_schema": t.input_schema,
                        "output_schema": t.output_schema,
                    }
                    for t in listed.tools
                ]
                _emit({"ok": True, "tools": tools})
            except Exception as exc:
                _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        elif kind == "call":
            _emit(await _call(client, op))
        elif kind == "ping":
            with anyio.move_on_after(float(op.get("timeout_s", 5))):
                try:
                    await client.send_ping()
                    _emit({"ok": True})
                    continue
                except Exception as exc:
                    _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                    continue
            _emit({"ok": False, "error": "no answer to ping"})
        else:
            _emit({"ok": False, "error": f"unknown op {kind!r}"})


async def _session(from_server: Any, to_server: Any, startup_timeout_s: float) -> str | None:
    """initialize within the startup limit (the deadline is lifted once it answers), then
    serve commands until the caller closes. Returns why it never started (None once it did)."""
    client = Client(_Streams(from_server, to_server), mode="legacy", cache=None)
    started_at, started = time.perf_counter(), False
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + startup_timeout_s) as scope:
            async with client:
                scope.deadline = math.inf
                started = True
                _emit({"started": True, "startup_s": round(time.perf_counter() - started_at, 3)})
                await _serve_commands(client)
    except Exception as exc:  # the server died or answered garbage during the handshake
        return None if started else f"{type(exc).__name__}: {exc}"
    if not started and scope.cancelled_caught:
        return f"no answer to initialize within {startup_timeout_s:g}s"
    return None


FRAMING_ERROR = (
    "the server frames its messages with Content-Length headers (LSP-style, as HarnessGym's "
    "servers did); MCP's stdio transport is one JSON-RPC message per line with no headers, so "
    "no MCP client can talk to it"
)
FRAMING_PROBE_S = 3.0


async def _speaks_content_length(process: Process, noise: Noise) -> bool:
    """Whether a server that never answered initialize speaks Content-Length framing: it printed
    such a header already, or it answers one framed initialize with one. (Such a server read
    the client's newline-delimited initialize as a header line and kept waiting for a blank
    line; the framed message ends that header block, so it answers.)"""
    if noise.framed.is_set():
        return True
    if process.returncode is not None or process.stdin is None:
        return False
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "framing-probe",
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "harnesslab-qualify", "version": "0"},
            },
        }
    ).encode()
    try:
        await process.stdin.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return False
    with anyio.move_on_after(FRAMING_PROBE_S):
        await noise.framed.wait()
    return noise.framed.is_set()


async def drive(launch: dict[str, Any]) -> int:
    noise = Noise()
    env = {**os.environ, **launch.get("env", {})}
    with open(launch["stderr_path"], "ab") as errlog:
        try:
            process = await anyio.open_process(
                launch["argv"], cwd=launch["cwd"], env=env, stderr=errlog
            )
        except OSError as exc:
            _emit({"started": False, "error": f"could not start {launch['argv'][0]!r}: {exc}"})
            _emit({"closed": True, "noise": [], "exit_code": None})
            return 0
        to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](32)
        to_server, from_session = anyio.create_memory_object_stream[SessionMessage](32)
        reader_done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_reader, process, to_session, noise, reader_done)
            tg.start_soon(_writer, process, from_session)
            try:
                why = await _session(
                    from_server, to_server, float(launch.get("startup_timeout_s", 30))
                )
                if why is not None:
                    framed = await _speaks_content_length(process, noise)
                    _emit(
                        {"started": False, "error": FRAMING_ERROR if framed else why}
                        | ({"framing": "content-length"} if framed else {})
                    )
            finally:
                with anyio.CancelScope(shield=True):
                    await to_server.aclose()
                    await _stop(process)
                    with anyio.move_on_after(2.0):
                        await reader_done.wait()
                tg.cancel_scope.cancel()
    _emit({"closed": True, "noise": noise, "exit_code": process.returncode})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with open(args[0]) as fh:
        launch = json.load(fh)
    return anyio.run(drive, launch)


if __name__ == "__main__":
    sys.exit(main())

"""Session limits of the shared HTTP server (servers/http_sessions.py): a flood of sessions
from one client leaves the others served. Unit tests drive the middleware over a stand-in for
the SDK's app with a fake clock; one test floods a real server (uvicorn, the SDK, the task
server) from 127.0.0.2 and serves an MCP client from 127.0.0.1."""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harnesslab.servers.http_sessions import SessionLimits
from harnesslab.servers.serve_cmd import http_app, listening_socket
from harnesslab.servers.task_server import build_task_server

from .support import CannedLauncher, kernel_workspace, serving_url, settings, state_for


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MODERN = b"2026-07-28"  # a protocol era whose requests are stateless


class FakeSDK:
    """Stands in for the SDK's app: a POST without a session id opens one, DELETE closes it,
    an unknown id is 404. `hold` keeps a request in flight until set."""

    def __init__(self) -> None:
        self.open: set[str] = set()
        self.deleted: list[str] = []
        self.hold: anyio.Event | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        sid = dict(scope["headers"]).get(b"mcp-session-id", b"").decode()
        modern = dict(scope["headers"]).get(b"mcp-protocol-version", b"") == MODERN
        headers: list[tuple[bytes, bytes]] = []
        if modern:  # a stateless request: no session
            status = 200
        elif not sid:
            sid = uuid.uuid4().hex
            self.open.add(sid)
            headers.append((b"mcp-session-id", sid.encode()))
            status = 200
        elif sid not in self.open:
            status = 404
        elif scope["method"] == "DELETE":
            self.open.discard(sid)
            self.deleted.append(sid)
            status = 200
        else:
            status = 200
            if self.hold is not None:
                await self.hold.wait()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def request(
    app: SessionLimits, client: str, method: str = "POST", sid: str = "", version: bytes = b""
) -> tuple[int, dict[bytes, bytes]]:
    headers = [(b"host", b"127.0.0.1:8765")]
    if version:
        headers.append((b"mcp-protocol-version", version))
    if sid:
        headers.append((b"mcp-session-id", sid.encode()))
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers,
             "client": (client, 40000)}  # fmt: skip
    got: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            got["headers"] = dict(message.get("headers") or [])

    await app(scope, receive, send)
    return got["status"], got["headers"]


def limits(**kw: Any) -> tuple[SessionLimits, FakeSDK, Clock]:
    sdk, clock = FakeSDK(), Clock()
    values = {"max_sessions": 8, "per_client": 3, "idle_s": 600.0, **kw}
    return SessionLimits(sdk, clock=clock, **values), sdk, clock


@pytest.mark.anyio
async def test_a_client_over_its_share_gets_429_with_retry_after_and_others_still_open_sessions():
    app, sdk, clock = limits()
    for _ in range(3):
        assert (await request(app, "10.0.0.2"))[0] == 200
    clock.now += 100  # its sessions have been idle 100 s of the 600 s timeout
    status, headers = await request(app, "10.0.0.2")
    assert status == 429
    assert headers[b"retry-after"] == b"500"  # when its oldest idle session expires
    assert (await request(app, "10.0.0.1"))[0] == 200  # another client is served
    assert len(sdk.open) == 4


@pytest.mark.anyio
async def test_a_full_table_closes_the_session_idle_longest_to_admit_a_new_one():
    app, sdk, clock = limits(max_sessions=4, per_client=2)
    sids = []
    for client in ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"):
        status, headers = await request(app, client)
        sids.append(headers[b"mcp-session-id"].decode())
        clock.now += 10
    # The first session of 10.0.0.1 was used a moment ago: the idlest is its second one.
    assert (await request(app, "10.0.0.1", sid=sids[0]))[0] == 200
    status, _ = await request(app, "10.0.0.3")
    assert status == 200
    assert sdk.deleted == [sids[1]]  # closed through the SDK (a DELETE), the idlest first
    assert app.evicted == 1 and len(app.sessions) == 4


@pytest.mark.anyio
async def test_busy_sessions_are_never_closed_a_full_busy_table_answers_503():
    app, sdk, _ = limits(max_sessions=2, per_client=2)
    sids = [(await request(app, "10.0.0.1"))[1][b"mcp-session-id"].decode() for _ in range(2)]
    sdk.hold = anyio.Event()
    async with anyio.create_task_group() as tg:
        for sid in sids:  # a request in flight on each (a tool call, an open stream)
            tg.start_soon(request, app, "10.0.0.1", "POST", sid)
        await anyio.wait_all_tasks_blocked()
        status, headers = await request(app, "10.0.0.2")
        sdk.hold.set()
    assert status == 503 and int(headers[b"retry-after"]) > 0
    assert sdk.deleted == [] and sdk.open == set(sids)


@pytest.mark.anyio
async def test_sessions_idle_past_the_timeout_or_closed_no_longer_count_against_the_client():
    app, _, clock = limits(per_client=2, idle_s=60.0)
    first = (await request(app, "10.0.0.1"))[1][b"mcp-session-id"].decode()
    await request(app, "10.0.0.1")
    assert (await request(app, "10.0.0.1"))[0] == 429
    assert (await request(app, "10.0.0.1", "DELETE", first))[0] == 200  # the client closes one
    assert (await request(app, "10.0.0.1"))[0] == 200
    assert (await request(app, "10.0.0.1"))[0] == 429
    clock.now += 61  # the SDK reaps both (the same idle timeout): the account forgets them
    assert (await request(app, "10.0.0.1"))[0] == 200


@pytest.mark.anyio
async def test_stateless_requests_of_a_later_era_take_no_place_and_evict_nothing():
    app, sdk, _ = limits(max_sessions=2, per_client=2)
    for _ in range(2):
        await request(app, "10.0.0.1")
    for _ in range(5):  # the table is full and the client at its share: still served
        assert (await request(app, "10.0.0.1", version=MODERN))[0] == 200
    assert sdk.deleted == [] and len(app.sessions) == 2
    assert (await request(app, "10.0.0.1", version=b"2025-06-18"))[0] == 429  # a session era


async def open_raw_session(http: httpx2.AsyncClient, url: str) -> int:
    """An initialize POST whose session is never closed (what the flood does)."""
    return (await raw_session(http, url))[0]


async def raw_session(http: httpx2.AsyncClient, url: str) -> tuple[int, str]:
    """(status, session id) of an initialize POST whose session is left open."""
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "flood", "version": "0"}},
    }  # fmt: skip
    headers = {"accept": "application/json, text/event-stream"}
    async with http.stream("POST", url, json=body, headers=headers) as res:
        await res.aread()
        return res.status_code, res.headers.get("mcp-session-id", "")


def client_from(address: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address=address))


@pytest.mark.anyio
async def test_a_flood_of_sessions_from_one_client_does_not_lock_out_another(tmp_path):
    ws = kernel_workspace(tmp_path)
    state = state_for(ws.root, tmp_path, CannedLauncher(settings(tmp_path)))
    cfg = state.settings.model_copy(
        update={"http_max_sessions": 16, "http_max_sessions_per_client": 4}
    )
    app = http_app(build_task_server(state), "127.0.0.1", None, cfg)
    sock = listening_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    flood = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address="127.0.0.2"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(60):
                codes = [await open_raw_session(flood, url) for _ in range(40)]
                async with Client(streamable_http_client(url), mode="legacy") as client:
                    res = await client.call_tool("inspect_context", {})
                assert not res.is_error and res.structured_content["task"]
                assert codes[:4] == [200] * 4 and set(codes[4:]) == {429}, codes
            server.should_exit = True
    finally:
        await flood.aclose()
        await state.aclose()


@pytest.mark.anyio
async def test_a_full_table_closes_the_idlest_session_in_the_sdk_and_serves_the_newcomer(
    tmp_path,
):
    ws = kernel_workspace(tmp_path)
    state = state_for(ws.root, tmp_path, CannedLauncher(settings(tmp_path)))
    cfg = state.settings.model_copy(
        update={"http_max_sessions": 4, "http_max_sessions_per_client": 2}
    )
    app = http_app(build_task_server(state), "127.0.0.1", None, cfg)
    sock = listening_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    clients = [client_from(f"127.0.0.{i}") for i in (2, 3)]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(60):
                opened = [await raw_session(c, url) for c in clients for _ in range(2)]
                assert [status for status, _ in opened] == [200] * 4  # the table is full
                async with Client(streamable_http_client(url), mode="legacy") as client:
                    res = await client.call_tool("inspect_context", {})
                assert not res.is_error
                # The idlest (the first opened) was closed in the SDK itself: its id is gone.
                probe = await clients[0].post(
                    url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                    headers={"mcp-session-id": opened[0][1],
                             "accept": "application/json, text/event-stream"},
                )  # fmt: skip
                assert probe.status_code == 404
            server.should_exit = True
    finally:
        for c in clients:
            await c.aclose()
        await state.aclose()


@pytest.mark.anyio
async def test_the_serving_line_comes_once_the_socket_listens(tmp_path):
    """Scripts connect the moment they read "serving on URL": it must not be refused (10 of 10
    immediate connections were, when the line came between bind and listen)."""
    ws = kernel_workspace(tmp_path)
    argv = [sys.executable, "-m", "harnesslab.servers", "serve", "-w", str(ws.root),
            "--transport", "http", "--port", "0"]  # fmt: skip
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    async with await anyio.open_process(argv, env=env) as proc:
        try:
            with anyio.fail_after(60):
                url = await serving_url(proc)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            for _ in range(10):  # at once: no sleep, no retry
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
        finally:
            proc.terminate()
            with anyio.move_on_after(10):
                await proc.wait()

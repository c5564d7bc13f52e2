"""Session limits of the shared HTTP server: one client cannot lock everyone else out.

The MCP SDK keeps streamable-HTTP sessions in one table (10,000 by default, each reaped after
30 idle minutes) and answers 503 to everyone once it is full: opening sessions without closing
them (~40 kB each) filled it in about 20 s. `SessionLimits` is ASGI middleware in front of the
SDK's app (behind the bearer-token check, so only holders of the token count) that keeps its own
account of the sessions the SDK opens:

- per client (its address: every process of one machine shares its address's share) at most
  `per_client` sessions: the one more is answered 429 with Retry-After, the seconds until that
  client's own oldest idle session expires;
- at most `max_sessions` in all: when the table is full, the session idle longest (no request in
  flight, no open stream) is closed to make room (through the SDK, as a DELETE);
  with none idle, 503 with Retry-After;
- a session idle for `idle_s` is closed by the SDK (the same idle timeout is passed to it).

Side of the trust boundary: serving (no decision about any candidate). Nothing here reads a
request body; the bookkeeping is per request headers and response status only.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

log = logging.getLogger("harnesslab.serve")

SESSION_HEADER = b"mcp-session-id"
VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode()
# Protocol versions whose requests the SDK serves in sessions (as its session manager routes
# them); a request naming any other version is stateless and takes no place in the table.
SESSION_ERAS = frozenset(HANDSHAKE_PROTOCOL_VERSIONS)
# Headers an eviction's DELETE copies from the request that opened the session: what the SDK's
# transport security checked then (Host, Origin) passes again.
KEPT_HEADERS = (b"host", b"origin")
BUSY_RETRY_S = 30  # every session busy: how long to wait before opening another


@dataclass
class Session:
    client: str
    opened: float
    last_active: float
    inflight: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def idle_for(self, now: float) -> float:
        return 0.0 if self.inflight else now - self.last_active


class SessionLimits:
    """ASGI middleware over the SDK's streamable-HTTP app (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        max_sessions: int,
        per_client: int,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.max_sessions = max_sessions
        self.per_client = min(per_client, max_sessions)
        self.idle_s = idle_s
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.opening: dict[str, int] = {}  # client -> opening requests in flight
        self.refused = 0  # 429s and 503s answered (the load test reads it)
        self.evicted = 0

    # -- bookkeeping ----------------------------------------------------------------------------
    def held_by(self, client: str) -> int:
        held = sum(1 for s in self.sessions.values() if s.client == client)
        return held + self.opening.get(client, 0)

    def expire(self) -> None:
        """Forget sessions the SDK has closed for idleness (the same timeout)."""
        now = self.clock()
        for sid in [sid for sid, s in self.sessions.items() if s.idle_for(now) >= self.idle_s]:
            del self.sessions[sid]

    def retry_after(self, client: str) -> int:
        """Seconds until `client`'s oldest idle session expires (its whole idle timeout when
        none of them is idle)."""
        now = self.clock()
        idle = [s.idle_for(now) for s in self.sessions.values() if s.client == client]
        idle = [i for i in idle if i > 0]
        wait = self.idle_s - max(idle) if idle else self.idle_s
        return max(1, math.ceil(wait))

    def idlest(self) -> tuple[str, Session] | None:
        now = self.clock()
        idle = [(sid, s) for sid, s in self.sessions.items() if s.inflight == 0]
        return max(idle, key=lambda kv: kv[1].idle_for(now)) if idle else None

    # -- ASGI -----------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        sid = headers.get(SESSION_HEADER, b"").decode("latin-1")
        version = headers.get(VERSION_HEADER, b"").decode("latin-1")
        if sid:
            await self._in_session(sid, scope, receive, send)
        elif scope.get("method") == "POST" and (not version or version in SESSION_ERAS):
            await self._opening(scope, receive, send)
        else:  # a stateless request of a later protocol era: it never opens a session
            await self.app(scope, receive, send)

    async def _in_session(self, sid: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        session = self.sessions.get(sid)
        if session is not None:
            session.inflight += 1
        status = 0

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if session is not None:
                session.inflight -= 1
                session.last_active = self.clock()
            gone = status == 404 or (scope.get("method") == "DELETE" and 200 <= status < 300)
            if gone:
                self.sessions.pop(sid, None)

    async def _opening(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A request without a session id (an initialize opens one): admitted within the
        client's share and the table's size, or refused with Retry-After."""
        client = (scope.get("client") or ("?", 0))[0]
        self.expire()
        if self.held_by(client) >= self.per_client:
            wait = self.retry_after(client)
            log.warning("refusing a session to %s: %d open (limit %d)", client,
                        self.held_by(client), self.per_client)  # fmt: skip
            await self._refuse(
                send, 429, wait,
                f"too many open sessions from {client}: {self.per_client} is the limit per "
                f"client. Close sessions you no longer use (HTTP DELETE), or retry in {wait} s.",
            )  # fmt: skip
            return
        if len(self.sessions) + sum(self.opening.values()) >= self.max_sessions:
            victim = self.idlest()
            if victim is None or not await self._evict(*victim):
                await self._refuse(
                    send, 503, BUSY_RETRY_S,
                    f"all {self.max_sessions} sessions of this server are busy; retry in "
                    f"{BUSY_RETRY_S} s.",
                )  # fmt: skip
                return
        self.opening[client] = self.opening.get(client, 0) + 1
        opened: list[str] = []
        kept = [(k, v) for k, v in scope.get("headers") or [] if k in KEPT_HEADERS]

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                sid = dict(message.get("headers") or []).get(SESSION_HEADER, b"")
                if sid:
                    now = self.clock()
                    self.sessions[sid.decode("latin-1")] = Session(client, now, now, 1, kept)
                    opened.append(sid.decode("latin-1"))
                    self.opening[client] -= 1
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if opened:
                session = self.sessions.get(opened[0])
                if session is not None:
                    session.inflight -= 1
                    session.last_active = self.clock()
            else:
                self.opening[client] -= 1
            if not self.opening.get(client):
                self.opening.pop(client, None)

    async def _evict(self, sid: str, session: Session) -> bool:
        """Close `sid` through the SDK (a DELETE with the headers that opened it)."""
        status = 0

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "DELETE", "scheme": "http", "path": "/mcp", "raw_path": b"/mcp",
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 0), "server": None,
            "headers": [*session.headers, (SESSION_HEADER, sid.encode("latin-1"))],
        }  # fmt: skip
        await self.app(scope, receive, send)
        if status in (200, 202, 204, 404):  # closed now, or already gone
            self.sessions.pop(sid, None)
            self.evicted += 1
            log.info("closed idle session of %s to make room (table full)", session.client)
            return True
        log.warning("could not close idle session %s: HTTP %d", sid[:8], status)
        return False

    async def _refuse(self, send: Any, status: int, retry_after: int, message: str) -> None:
        self.refused += 1
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


__all__ = ["SessionLimits"]

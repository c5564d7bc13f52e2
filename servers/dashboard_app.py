"""The dashboard's web app (ASGI, Starlette): the page, its live sections, a candidate's diff,
the lab's and compare's plots, and the package's own stylesheet and script. Read-only: no route
changes anything but the login cookie.

Guards, the same as `harnesslab serve --transport http`'s:
- Host/Origin: bound on loopback, a request must name a loopback host (the MCP SDK's DNS
  rebinding check, with the lists it uses for the MCP route); off loopback the token guards it.
- the token (when one is set; binding off loopback requires one): `Authorization: Bearer T`, or
  the cookie that POST /dashboard/login sets after checking T (a browser cannot send a header on
  a navigation). The cookie holds an HMAC of the token, not the token; it is HttpOnly,
  SameSite=Strict and sent to /dashboard only.
Every answer carries a Content-Security-Policy that allows the package's own files only. An
error is logged with its traceback and answered with a line that says what failed.

Side of the trust boundary: the operator's. It serves tools/dashboard's data, which holds no
hidden case.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import anyio
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from harnesslab.tools.dashboard import Source

from .dashboard_page import BASE, diff_html, error_html, login_html, page_html, sections
from .serve_cmd import is_loopback

log = logging.getLogger("harnesslab.dashboard")
COOKIE = "harnesslab_dashboard"
LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
STATIC = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
LOGIN_BODY_MAX = 4096

Handler = Callable[[Request], Awaitable[Response]]


def cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"harnesslab-dashboard", hashlib.sha256).hexdigest()


def _headers(response: Response, cache: bool = False) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "private, max-age=60" if cache else "no-store"
    return response


class Guard:
    """The Host/Origin check and the token, for every dashboard request."""

    def __init__(self, host: str, token: str | None) -> None:
        protect = is_loopback(host)  # as serve_http: off loopback, Host headers vary
        self.security = TransportSecurityMiddleware(
            TransportSecuritySettings(
                enable_dns_rebinding_protection=protect,
                allowed_hosts=LOOPBACK_HOSTS,
                allowed_origins=LOOPBACK_ORIGINS,
            )
        )
        self.token = token
        self.cookie = cookie_value(token) if token else ""

    def token_ok(self, request: Request) -> bool:
        if not self.token:
            return True
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), self.token):
            return True
        return hmac.compare_digest(request.cookies.get(COOKIE, ""), self.cookie)

    async def check(self, request: Request) -> Response | None:
        refused = await self.security.validate_request(request, is_post=False)
        if refused is not None:
            return refused
        if not self.token_ok(request):
            return HTMLResponse(
                login_html(
                    "This dashboard needs the token its server was started with (--token or "
                    "$HARNESSLAB_TOKEN)."
                ),
                status_code=403,
            )
        return None


def dashboard_app(source: Source, *, host: str, token: str | None) -> Starlette:
    """The dashboard's routes under /dashboard, guarded (see the module docstring)."""
    guard = Guard(host, token)

    def guarded(handler: Handler, cache: bool = False, public: bool = False) -> Handler:
        """`handler` behind the guard (`public`: the Host/Origin check only, for the package's
        own stylesheet, script and icon, which the login page needs too)."""

        async def endpoint(request: Request) -> Response:
            if public:
                refused = await guard.security.validate_request(request, is_post=False)
            else:
                refused = await guard.check(request)
            if refused is not None:
                return _headers(refused)
            try:
                return _headers(await handler(request), cache)
            except Exception as exc:  # boundary: the page says what failed, the log has why
                log.exception("dashboard: %s failed", request.url.path)
                message = f"the dashboard could not read this: {type(exc).__name__} (see the log)"
                if request.url.path.endswith("/live"):
                    return _headers(
                        JSONResponse({"v": "", "error": message, "sections": {}}, status_code=200)
                    )
                return _headers(HTMLResponse(error_html(message), status_code=200))

        return endpoint

    async def page(request: Request) -> Response:
        version, snap = await anyio.to_thread.run_sync(
            lambda: (source.fingerprint(), source.snapshot())
        )
        return HTMLResponse(page_html(snap, version))

    async def live(request: Request) -> Response:
        version = await anyio.to_thread.run_sync(source.fingerprint)
        if request.query_params.get("v") == version:
            return Response(status_code=204)
        snap = await anyio.to_thread.run_sync(source.snapshot)
        return JSONResponse({"v": version, "now": snap.generated_at, "sections": sections(snap)})

    async def diff(request: Request) -> Response:
        candidate = request.query_params.get("candidate", "")[:80]
        return HTMLResponse(diff_html(await anyio.to_thread.run_sync(source.diff, candidate)))

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("no such file", status_code=404)
        data = resources.files("harnesslab.servers").joinpath("dashboard_static", name)
        return Response(data.read_bytes(), media_type=STATIC[name])

    async def lab_file(request: Request) -> Response:
        path = await anyio.to_thread.run_sync(
            source.lab_file, int(request.path_params["index"]), request.path_params["name"]
        )
        return FileResponse(path) if path else Response("no such plot", status_code=404)

    async def compare_file(request: Request) -> Response:
        path = source.compare_plot(int(request.path_params["index"]))
        return FileResponse(path) if path else Response("no such plot", status_code=404)

    async def login(request: Request) -> Response:
        refused = await guard.security.validate_request(request, is_post=False)
        if refused is not None:
            return _headers(refused)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > LOGIN_BODY_MAX:
                return _headers(Response("request too large", status_code=413))
        given = (parse_qs(body.decode(errors="replace")).get("token") or [""])[0]
        if not token or not hmac.compare_digest(given, token):
            return _headers(HTMLResponse(login_html("Wrong token."), status_code=403))
        response = Response(status_code=303, headers={"Location": BASE})
        response.set_cookie(COOKIE, guard.cookie, path=BASE, httponly=True, samesite="strict")
        return _headers(response)

    routes = [
        Route(BASE, guarded(page)),
        Route(f"{BASE}/", guarded(page)),
        Route(f"{BASE}/live", guarded(live)),
        Route(f"{BASE}/diff", guarded(diff)),
        Route(f"{BASE}/static/{{name}}", guarded(static, cache=True, public=True)),
        Route(f"{BASE}/file/lab/{{index:int}}/{{name}}", guarded(lab_file, cache=True)),
        Route(f"{BASE}/file/compare/{{index:int}}/scores.png", guarded(compare_file, cache=True)),
        Route(f"{BASE}/login", login, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def is_dashboard_path(path: str) -> bool:
    return path == BASE or path.startswith(BASE + "/")


def mount_dashboard(app: Any, source: Source, *, host: str, token: str | None) -> Any:
    """`app` with /dashboard... answered by the dashboard (its own guards, the same token) and
    everything else passed on: what `harnesslab serve --transport http` mounts."""
    dashboard = dashboard_app(source, host=host, token=token)

    async def routed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and is_dashboard_path(scope.get("path", "")):
            await dashboard(scope, receive, send)
        else:
            await app(scope, receive, send)

    return routed


__all__ = ["COOKIE", "cookie_value", "dashboard_app", "is_dashboard_path", "mount_dashboard"]

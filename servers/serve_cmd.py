"""`harnesslab serve` (the kernel task server over stdio or streamable HTTP, or its self-test)
and `harnesslab config claude|codex` (the client entry that starts it; `config --prune` takes out
of the workspace's client files every server, hook, approval and skill harnesslab did not write).
Both report such entries (tools/meta/client_audit.py): a client runs them outside every sandbox.

stdio: stdout carries the protocol and nothing else; logs go to stderr. HTTP binds 127.0.0.1
unless told otherwise, and binding anything else requires a bearer token (--token, or the
HARNESSLAB_TOKEN environment variable so that it stays out of `ps`); a token given on loopback
is enforced too.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harnesslab.tools.catalog import SERVERS_MODULE, TASK_SERVER
from harnesslab.tools.dashboard import Source
from harnesslab.tools.errors import UsageError
from harnesslab.tools.gpu.isolation.sandbox_policy import import_env, import_roots, python_argv
from harnesslab.tools.meta.client_audit import audit_workspace, prune, prune_command
from harnesslab.tools.meta.client_setup import approve, client_status
from harnesslab.tools.meta.skills import project_skills
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import open_workspace
from harnesslab.tools.state.owned_config import OwnedConfig
from harnesslab.tools.state.projection import (
    ServerEntry,
    render_codex_toml,
    render_mcp_json,
    write_codex_toml,
    write_mcp_json,
)

from .cli_support import add_executor_args, command, executor_flags, run_async

log = logging.getLogger("harnesslab.serve")
TOKEN_ENV = "HARNESSLAB_TOKEN"


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", type=Path, help="workspace folder (default .)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address to bind (default loopback)")
    p.add_argument("--port", type=port_number, default=8765, help="http: port (0 = any free port)")
    p.add_argument("--token", help=f"http: bearer token clients must send (or ${TOKEN_ENV})")
    p.add_argument(
        "--max-sessions",
        type=int,
        help="http: open sessions in all (default 1000; when full, the idlest is closed)",
    )
    p.add_argument(
        "--max-sessions-per-client",
        type=int,
        help="http: open sessions per client address (default 64; one more gets 429)",
    )
    p.add_argument(
        "--session-idle-min",
        type=float,
        help="http: minutes a session may stay idle before it is closed (default 10)",
    )
    p.add_argument("--name", default=TASK_SERVER, help="server name shown to clients")
    p.add_argument(
        "--self-test",
        action="store_true",
        help="call every tool in process on a temporary workspace; exit 0 only if all work",
    )
    p.add_argument("--task", default=None, help="self-test: task template (default rmsnorm_gate)")
    add_executor_args(p)


def port_number(text: str) -> int:
    """argparse type of --port: 0..65535 (a one-line usage error otherwise)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0..65535; 0 = any free one)")
    return port


# serve's session flags -> their settings field (validated there: bounds, types).
SESSION_FLAGS = {
    "max_sessions": "http_max_sessions",
    "max_sessions_per_client": "http_max_sessions_per_client",
    "session_idle_min": "http_session_idle_min",
}


def session_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """`settings` with serve's session flags applied and checked (UsageError names the flag)."""
    updates = {f: v for a, f in SESSION_FLAGS.items() if (v := getattr(args, a, None)) is not None}
    if not updates:
        return settings
    try:
        return Settings.model_validate({**settings.model_dump(), **updates})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err.get("loc") else "?"
        flag = "--" + next((a for a, f in SESSION_FLAGS.items() if f == field), field)
        raise UsageError(
            f"{flag.replace('_', '-')}={err.get('input')!r}: {err['msg']}.",
            next_step=f"see `harnesslab serve --help` for {flag.replace('_', '-')}",
        ) from exc


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@command("serve", "Serve the kernel task MCP tools for a workspace (stdio or HTTP).", _serve_args)
def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    if args.self_test:
        from .self_test import run_self_test  # noqa: PLC0415

        return run_async(run_self_test, settings, args.task, args.name)
    workspace = args.workspace or Path(".")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    settings = session_settings(args, settings)
    if args.transport == "http" and not is_loopback(args.host) and not token:
        raise UsageError(
            f"refusing to bind {args.host} without a bearer token.",
            next_step=f"pass --token T (or set {TOKEN_ENV}), or bind 127.0.0.1",
        )
    from .builtin import ServerState  # noqa: PLC0415 - the MCP SDK import costs ~0.8 s
    from .task_server import build_task_server  # noqa: PLC0415

    state = ServerState.open(workspace, settings, name=args.name)
    warn_foreign(state.workspace.root, settings)
    server = build_task_server(state)

    async def stdio() -> None:
        try:
            await server.run_stdio_async()
        finally:
            await state.aclose()

    async def http() -> None:
        try:
            page = Source(state.workspace.root, settings)  # the operator's, at /dashboard
            await serve_http(server, args.host, args.port, token, settings=settings, dashboard=page)
        finally:
            await state.aclose()

    run_async(stdio if args.transport == "stdio" else http)
    return 0


def warn_foreign(root: Path, settings: Settings) -> int:
    """Say on stderr what the workspace's client files hold that harnesslab did not write (a
    client runs those outside every sandbox); the number of such entries."""
    try:
        found = audit_workspace(root, settings)
    except UsageError as exc:
        print(f"harnesslab: cannot check the client files: {exc.message}", file=sys.stderr)
        return 0
    for finding in found:
        print(f"warning: not written by harnesslab: {finding.line()}", file=sys.stderr)
    if found:
        print(f"  remove them with: {prune_command(root)}", file=sys.stderr)
    return len(found)


class BearerAuth:
    """ASGI wrapper: HTTP requests need `Authorization: Bearer <token>` (the scheme in any case,
    RFC 7235; the token compared in constant time).

    A missing or wrong token gets 403 with a message saying how to send it, not 401: MCP clients
    answer a 401 by starting OAuth, which this server does not offer (the Inspector then fails
    with "Interactive OAuth requires a TTY", Claude Code with a client-registration error)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    def authorized(self, header: bytes) -> bool:
        scheme, _, given = header.strip().partition(b" ")
        ok = hmac.compare_digest(given.strip(), self.expected)
        return scheme.lower() == b"bearer" and ok

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not self.authorized(got):
                why = "wrong bearer token" if got else "bearer token required"
                body = (
                    f"{why}: send the header `Authorization: Bearer <token>` with the token this "
                    f"server was started with (--token or ${TOKEN_ENV}); e.g. "
                    f"`harnesslab config claude --url URL --token-env {TOKEN_ENV} --write`\n"
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                    }
                )
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await self.app(scope, receive, send)


LISTEN_BACKLOG = 2048  # uvicorn's own default


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and LISTENING (connections wait in its backlog until the
    server accepts them); UsageError when the address cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except (OSError, OverflowError) as exc:
        sock.close()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(
            f"cannot listen on {host}:{port}: {why}.",
            next_step="pick another --port (0 = any free one) or an address of this machine "
            "for --host",
        ) from exc
    return sock


def http_app(server: Any, host: str, token: str | None, settings: Settings) -> Any:
    """The ASGI app of `server` over streamable HTTP: the bearer token (when given), then the
    session limits of `settings` (servers/http_sessions.py), then the SDK's app."""
    from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415

    from .http_sessions import SessionLimits  # noqa: PLC0415

    idle_s = settings.http_session_idle_min * 60
    security = None
    if not is_loopback(host):  # the bearer token guards it; Host headers vary off loopback
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(
        host=host,
        transport_security=security,
        session_idle_timeout=idle_s,
        max_sessions=None,  # SessionLimits keeps the table's bound (with eviction, not 503)
    )
    app = SessionLimits(
        app,
        max_sessions=settings.http_max_sessions,
        per_client=settings.http_max_sessions_per_client,
        idle_s=idle_s,
    )
    return BearerAuth(app, token) if token else app


async def serve_http(
    server: Any,
    host: str,
    port: int,
    token: str | None,
    *,
    settings: Settings,
    dashboard: Source | None = None,
) -> None:
    """Serve `server` over streamable HTTP on host:port until cancelled (http_app); with
    `dashboard`, its page at /dashboard too (servers/dashboard_app.py: the same token and
    Host/Origin checks)."""
    import uvicorn  # noqa: PLC0415

    app = http_app(server, host, token, settings)
    if dashboard is not None:
        from .dashboard_app import mount_dashboard  # noqa: PLC0415 - it imports this module

        app = mount_dashboard(app, dashboard, host=host, token=token)
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    # Tests and scripts read this line to learn the port when --port 0 was asked for; it comes
    # once the socket listens, so a connection made on reading it waits instead of failing.
    print(f"harnesslab: serving on http://{shown}:{bound}/mcp", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


# -- serve-generated ---------------------------------------------------------------------------


def _serve_generated_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a registered generated server of the workspace")
    p.add_argument("-w", "--workspace", type=Path, default=Path("."), help="workspace folder")
    add_executor_args(p)


@command(
    "serve-generated",
    "Serve a registered generated server over stdio: the bundle its qualification passed, kept "
    "in the trusted store and re-hashed first (what .mcp.json and .codex/config.toml start).",
    _serve_generated_args,
)
def cmd_serve_generated(args: argparse.Namespace, settings: Settings) -> int:
    from harnesslab.tools.meta.genserver import check_server_py  # noqa: PLC0415
    from harnesslab.tools.meta.registry import load_registry, qualified_bundle  # noqa: PLC0415

    ws = open_workspace(args.workspace, settings)
    rec = load_registry(ws).servers.get(args.name)
    if rec is None or rec.status != "registered" or not rec.bundle_hash:
        raise UsageError(
            f"{args.name!r} is not a registered server of {ws.root}.",
            next_step="list_servers shows the statuses; qualify (self_test_server) and "
            "register_server it first",
        )
    kept = qualified_bundle(ws, args.name, rec.bundle_hash)  # re-hashed: refused if altered
    server_dir = kept / ".harnesslab" / "mcp" / args.name
    # The server process runs toolkit code only: exactly this toolkit's server.py, in isolated
    # mode (-I: the bundle folder is not on sys.path, so no module of the agent's shadows one
    # it imports). The custom tools run in the sandboxed worker it starts.
    check_server_py(server_dir, args.name)
    # -I also drops PYTHONPATH and the user site: the toolkit's own import roots go explicitly
    # (a `pip install --target` or `--user` toolkit, environment modules).
    argv = python_argv(sys.executable, [str(server_dir / "server.py"), "--workspace", str(ws.root)])
    env = {**os.environ, **settings.to_env(), **import_env(import_roots())}
    os.chdir(ws.root)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
    return 0  # pragma: no cover - execve does not return


# -- config -------------------------------------------------------------------------------------


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("client", nargs="?", choices=["claude", "codex"], help="which client's format")
    p.add_argument("-w", "--workspace", type=Path, default=Path("."), help="workspace folder")
    p.add_argument(
        "--write", action="store_true", help="merge into <ws>/.mcp.json or .codex/config.toml"
    )
    p.add_argument(
        "--approve",
        action="store_true",
        help="with --write: also approve the server for the workspace, so the client starts it "
        "(Claude Code: enabledMcpjsonServers in <ws>/.claude/settings.local.json and the "
        "workspace trusted in ~/.claude.json; Codex: the workspace trusted in "
        "~/.codex/config.toml)",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="remove from the workspace's .mcp.json, .claude/settings*.json, .codex/config.toml, "
        ".codex/ and the skill folders every server, hook, approval, setting and skill that "
        "harnesslab did not write (what `doctor` reports as FOREIGN)",
    )
    p.add_argument("--name", default="harnesslab", help="entry name in the client's config")
    p.add_argument("--url", help="connect to a running `serve --transport http` server instead")
    p.add_argument("--token-env", help=f"with --url: env var holding the token (e.g. {TOKEN_ENV})")
    add_executor_args(p)


def harnesslab_command() -> list[str]:
    """How a client starts this installation's CLI (clients may not share our PATH): the
    console script beside our interpreter, else `python -m harnesslab.servers`."""
    beside = Path(sys.executable).parent / "harnesslab"
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-m", SERVERS_MODULE]


def executor_argv(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for flag, attr in executor_flags():
        value = getattr(args, attr, None)
        if value:
            out += [flag, str(value)]
    if getattr(args, "accept_new_host_key", False):
        out.append("--accept-new-host-key")
    return out


def server_entry(args: argparse.Namespace, settings: Settings) -> ServerEntry:
    if args.token_env and not args.url:
        raise UsageError(
            "--token-env only applies to an HTTP server (--url).",
            next_step="add --url http://HOST:PORT/mcp, or drop --token-env (a stdio server "
            "needs no token)",
        )
    if args.url:
        return ServerEntry(name=args.name, url=args.url, token_env_var=args.token_env).checked()
    ws = open_workspace(args.workspace, settings)  # fails early on a folder that is no workspace
    program, *prefix = harnesslab_command()
    argv = [*prefix, "serve", "--workspace", str(ws.root), *executor_argv(args)]
    return ServerEntry(name=args.name, command=program, args=argv).checked()


@command(
    "config",
    "Print (or --write) the .mcp.json / .codex/config.toml entry that starts the task server; "
    "--prune removes what harnesslab did not write there.",
    _config_args,
)
def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    if args.prune:
        root = args.workspace.resolve()
        removed = prune(root, settings)
        for finding in removed:
            print(f"removed {finding.line()}")
        print(f"{len(removed)} entries removed from {root}'s client files")
        return 0
    if args.client is None:
        raise UsageError(
            "which client? `harnesslab config claude` or `harnesslab config codex`.",
            next_step="name the client, or pass --prune",
        )
    if args.approve and not args.write:
        raise UsageError("--approve goes with --write.", next_step="add --write")
    entry = server_entry(args, settings)
    if not args.write:
        print(
            render_mcp_json(entry) if args.client == "claude" else render_codex_toml(entry), end=""
        )
        return 0
    root = (
        open_workspace(args.workspace, settings).root if not args.url else args.workspace.resolve()
    )
    owned = OwnedConfig.of(settings, root)
    writer = write_mcp_json if args.client == "claude" else write_codex_toml
    print(f"wrote {writer(root, entry, owned=owned)}")
    project_skills(root, owned=owned)  # shipped skills into .claude/skills/ and .agents/skills/
    if args.approve:
        for path in approve(args.client, root, entry.name, settings):
            print(f"wrote {path}")
    status = client_status(args.client, root, entry.name, settings)
    program = "claude" if args.client == "claude" else "codex"
    if status.ready:
        print(f"next: cd {root} && {program}   (start the client inside the workspace)")
    else:
        print(f"not ready: {'; '.join(status.missing)}", file=sys.stderr)
        print(f"next: {status.fix}", file=sys.stderr)
    warn_foreign(root, settings)
    return 0


__all__ = [
    "BearerAuth",
    "cmd_config",
    "cmd_serve",
    "http_app",
    "is_loopback",
    "listening_socket",
    "port_number",
    "serve_http",
    "warn_foreign",
]

"""`harnesslab dashboard -w WS`: the operator's live page of a workspace's runs, ledger, tool
usage and generated servers (and, when named, lab and compare reports), served over HTTP until
Ctrl-C. Loopback by default; any other address needs a token, as for `serve --transport http`
(which also serves this page at /dashboard). Read-only.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from harnesslab.tools.dashboard import Source
from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings

from .cli_support import command, run_async
from .serve_cmd import TOKEN_ENV, is_loopback, listening_socket


def _dashboard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", type=Path, default=Path("."), help="workspace folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8765, help="port (0 = any free port)")
    p.add_argument("--token", help=f"token the browser must give (or ${TOKEN_ENV})")
    p.add_argument(
        "--lab",
        type=Path,
        action="append",
        default=[],
        help="a lab report folder (the --out of `harnesslab lab`), or a folder of them: the "
        "latest is shown (repeatable)",
    )
    p.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        help="the --out folder of `harnesslab compare`: its two arms (repeatable)",
    )
    p.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="RUN_ID",
        help="show these runs (default: the 6 most recent)",
    )


@command(
    "dashboard",
    "Serve a live, read-only web page of a workspace's runs, ledger, tools, generated servers "
    "(and lab/compare reports) for the operator.",
    _dashboard_args,
)
def cmd_dashboard(args: argparse.Namespace, settings: Settings) -> int:
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and not token:
        raise UsageError(
            f"refusing to serve the dashboard on {args.host} without a token.",
            next_step=f"pass --token T (or set {TOKEN_ENV}), or bind 127.0.0.1 and use an SSH "
            "tunnel: ssh -L 8765:localhost:8765 HOST",
        )
    source = Source(
        args.workspace, settings, labs=args.lab, compares=args.compare, runs=args.run or None
    )
    from .dashboard_app import dashboard_app  # Starlette and mcp.server: only when serving

    app = dashboard_app(source, host=args.host, token=token)
    run_async(serve, app, args.host, args.port)
    return 0


async def serve(app: Any, host: str, port: int) -> None:
    import uvicorn  # noqa: PLC0415

    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    # Tests and scripts read this line to learn the port when --port 0 was asked for.
    print(f"harnesslab: dashboard serving on http://{shown}:{bound}/dashboard", file=sys.stderr,
          flush=True)  # fmt: skip
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    await uvicorn.Server(config).serve(sockets=[sock])


__all__ = ["cmd_dashboard"]

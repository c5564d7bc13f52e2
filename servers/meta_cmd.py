"""`harnesslab meta` (the meta-server over stdio or streamable HTTP) and `harnesslab qualify PATH`
(qualification of any stdio MCP server folder with a manifest.json, for teams that bring their
own). `qualify` exits 0 only when the server qualifies, 1 when it fails, 2 on bad usage."""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

from harnesslab.tools.catalog import META_SERVER
from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta.qualification import DEFAULT_TIMEOUT_S, qualify, template_for
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import open_workspace

from .cli_support import add_executor_args, command, run_async
from .serve_cmd import TOKEN_ENV, is_loopback, port_number


def _meta_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", type=Path, default=Path("."), help="workspace folder")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address to bind (default loopback)")
    p.add_argument("--port", type=port_number, default=8766, help="http: port (0 = any free port)")
    p.add_argument("--token", help=f"http: bearer token clients must send (or ${TOKEN_ENV})")
    p.add_argument("--name", default=META_SERVER, help="server name shown to clients")
    add_executor_args(p)


@command(
    "meta",
    "Serve the meta-server (generate, qualify, register task-specific MCP servers).",
    _meta_args,
)
def cmd_meta(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace, settings)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.transport == "http" and not is_loopback(args.host) and not token:
        raise UsageError(
            f"refusing to bind {args.host} without a bearer token.",
            next_step=f"pass --token T (or set {TOKEN_ENV}), or bind 127.0.0.1",
        )
    from .meta_server import build_meta_server  # noqa: PLC0415 - the SDK import costs ~1 s

    server = build_meta_server(ws, settings, name=args.name)
    if args.transport == "stdio":
        run_async(server.run_stdio_async)
    else:
        from .serve_cmd import serve_http  # noqa: PLC0415

        run_async(partial(serve_http, settings=settings), server, args.host, args.port, token)
    return 0


def _qualify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, help="server folder with manifest.json")
    p.add_argument(
        "-w",
        "--workspace",
        type=Path,
        help="workspace whose task template makes the clean room (default: the one the "
        "folder sits in, for .harnesslab/mcp/<name>)",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds in all")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--keep", action="store_true", help="keep the clean room (path on stderr)")
    add_executor_args(p)


@command(
    "qualify",
    "Qualify an MCP server folder (manifest.json) in a clean room; exit 0 only if it passes.",
    _qualify_args,
)
def cmd_qualify(args: argparse.Namespace, settings: Settings) -> int:
    sdir = args.path.expanduser().resolve()
    if not (sdir / "manifest.json").is_file():
        raise UsageError(
            f"{sdir} has no manifest.json.",
            next_step="a server folder needs manifest.json: name, command, args, cwd, tools "
            "(name + probe_args), self_test, tests",
        )
    ws_root = args.workspace
    if ws_root is None and sdir.parent.name == "mcp" and sdir.parent.parent.name == ".harnesslab":
        ws_root = sdir.parents[2]
    if ws_root is None:
        raise UsageError(
            f"{sdir} is not inside a workspace.",
            next_step="pass --workspace DIR: the workspace whose task the server works on",
        )
    ws = open_workspace(ws_root, settings)
    report = run_async(_qualify, sdir, ws, settings, args)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        for c in report.checks:
            mark = "ok  " if c.passed else "FAIL"
            first = (c.evidence.strip().splitlines() or [""])[0][:110]
            print(f"{mark} {c.name:<28} {c.duration_s:6.1f}s  {first}")
        verdict = "qualified" if report.passed else "NOT qualified"
        print(
            f"{report.server}: {verdict} in {report.duration_s:.1f}s; report {report.report_path}"
        )
        if report.failure_report_path:
            print(f"repair notes: {report.failure_report_path}")
    if report.clean_room:
        print(f"clean room kept at {report.clean_room}", file=sys.stderr)
    return 0 if report.passed else 1


async def _qualify(sdir: Path, ws, settings: Settings, args: argparse.Namespace):
    def progress(done: float, total: float, message: str) -> None:
        if not args.json:
            print(f"  [{int(done)}/{int(total)}] {message}", file=sys.stderr, flush=True)

    dirty = [ws.root] if sdir.is_relative_to(ws.root) else [ws.root, sdir]
    return await qualify(
        sdir,
        template_for(ws),
        None,
        args.timeout,
        settings=settings,
        dirty_roots=dirty,
        progress=progress,
        keep_clean_room=args.keep,
    )


__all__ = ["cmd_meta", "cmd_qualify"]

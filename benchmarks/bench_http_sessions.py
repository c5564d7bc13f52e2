"""A flood of MCP sessions from one client against the shared HTTP server, on loopback: is
everyone else still served? Prints one table.

    python benchmarks/bench_http_sessions.py [--seconds 20] [--flooders 16] [--per-client 64]
        [--max-sessions 1000]

Starts the real `harnesslab serve --transport http --port 0` on a temporary workspace (CPU,
Triton interpreter; no GPU needed); the client below runs alone for 5 s (its baseline), then
for --seconds at once:
- the flood: --flooders concurrent loops from 127.0.0.2 opening sessions (an initialize each)
  and never closing them, as fast as the server answers (what filled the SDK's 10,000-session
  table in ~20 s and locked every client out with 503 for up to 30 minutes);
- a client from 127.0.0.1 that opens a session as real clients do (the 2025 handshake,
  `mode="legacy"`), calls inspect_context and closes it, again and again.
Bounded: the flood stops after --seconds; every request has a 30 s timeout.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

HARNESSLAB = Path(sys.executable).parent / "harnesslab"
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "flood", "version": "0"}},
}  # fmt: skip


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else 0.0


async def serving_url(proc: anyio.abc.Process) -> str:
    buf = b""
    assert proc.stderr is not None
    async for chunk in proc.stderr:
        buf += chunk
        for line in buf.decode(errors="replace").splitlines():
            if "serving on " in line:
                return line.split("serving on ", 1)[1].strip()
    raise SystemExit(f"server exited: {buf.decode(errors='replace')[-2000:]}")


async def flood(url: str, until: float, codes: Counter[int]) -> None:
    transport = httpx2.AsyncHTTPTransport(local_address="127.0.0.2")
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(transport=transport, timeout=30) as http:
        while time.monotonic() < until:
            try:
                res = await http.post(url, json=INITIALIZE, headers=headers)
                codes[res.status_code] += 1
            except httpx2.HTTPError:
                codes[0] += 1


async def served(url: str, until: float, latencies: list[float], failures: list[str]) -> None:
    while time.monotonic() < until:
        t0 = time.perf_counter()
        try:
            with anyio.fail_after(30):
                async with Client(streamable_http_client(url), mode="legacy") as client:
                    res = await client.call_tool("inspect_context", {})
            if res.is_error:
                failures.append("tool error")
            else:
                latencies.append((time.perf_counter() - t0) * 1e3)
        except Exception as exc:  # report, keep going: this is what the table counts
            failures.append(f"{type(exc).__name__}: {str(exc)[:80]}")
        await anyio.sleep(0.2)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hl-http-flood-"))
    settings = Settings(state_dir=tmp / "state", interpret="always")
    ws = init_workspace("rmsnorm_gate", tmp / "ws", settings)
    argv = [
        str(HARNESSLAB), "serve", "-w", str(ws.root), "--transport", "http", "--port", "0",
        "--max-sessions-per-client", str(args.per_client), "--max-sessions", str(args.max_sessions),
    ]  # fmt: skip
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(settings.state_dir)}
    codes: Counter[int] = Counter()
    latencies: list[float] = []
    failures: list[str] = []
    alone: list[float] = []
    async with await anyio.open_process(argv, env=env) as proc:
        try:
            with anyio.fail_after(60):
                url = await serving_url(proc)
            await served(url, time.monotonic() + 5, alone, failures)
            until = time.monotonic() + args.seconds
            async with anyio.create_task_group() as tg:
                for _ in range(args.flooders):
                    tg.start_soon(flood, url, until, codes)
                tg.start_soon(served, url, until, latencies, failures)
        finally:
            proc.terminate()
            with anyio.move_on_after(10):
                await proc.wait()
    print(f"# bench_http_sessions  {platform.node()}  python {platform.python_version()}  "
          f"{time.strftime('%Y-%m-%d')}  {args.seconds:g} s, {args.flooders} flood loops, "
          f"--max-sessions-per-client {args.per_client} --max-sessions {args.max_sessions}")  # fmt: skip
    print("| who | requests | outcome |")
    print("|---|---|---|")
    total = sum(codes.values())
    outcome = ", ".join(f"HTTP {c}: {n}" if c else f"connection error: {n}"
                        for c, n in sorted(codes.items()))  # fmt: skip
    print(f"| flood (127.0.0.2, sessions never closed) | {total} | {outcome} |")
    calls = len(latencies) + len(failures)
    lat = (f"median {statistics.median(latencies):.0f} ms, p95 {pct(latencies, 0.95):.0f} ms"
           if latencies else "none served")  # fmt: skip
    base = f"median {statistics.median(alone):.0f} ms" if alone else "none served"
    print(f"| client alone, before the flood | {len(alone)} | {len(alone)} served; {base} |")
    print(
        f"| client during the flood (127.0.0.1: open, inspect_context, close) | {calls} | "
        f"{len(latencies)} served, {len(failures)} failed; {lat} |"
    )
    for why, n in Counter(failures).most_common(3):
        print(f"|  failure | {n} | {why} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--flooders", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=64)
    parser.add_argument("--max-sessions", type=int, default=1000)
    anyio.run(main, parser.parse_args())

"""MCP overhead of the kernel task server on the CPU: prints one table.

    python benchmarks/bench_mcp_cpu.py [--calls 200] [--starts 5] [--objectives 5]

1. inspect_context round trip over stdio (real subprocess server, SDK stdio client), median and
   p10/p90 over --calls calls. Target: median <= 5 ms.
2. Server start to first tool result: spawn `harnesslab serve`, handshake, list nothing, call
   inspect_context; median over --starts fresh processes. Target: <= 1.5 s.
3. run_objective overhead: MCP round trip minus the runner process's own wall time (wall_s in
   the result), one dev case on the Triton interpreter. Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

HARNESSLAB = Path(sys.executable).parent / "harnesslab"
SMALL = "1024x1024_fp16"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def params(ws: Path, state: Path) -> StdioServerParameters:
    command = (
        [str(HARNESSLAB)] if HARNESSLAB.is_file() else [sys.executable, "-m", "harnesslab.servers"]
    )
    return StdioServerParameters(
        command=command[0],
        args=[*command[1:], "serve", "--workspace", str(ws)],
        env={
            "HARNESSLAB_STATE_DIR": str(state),
            "HARNESSLAB_INTERPRET": "always",
            **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
        },
    )


async def bench(calls: int, starts: int, objectives: int) -> list[tuple[str, str, str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=tmp / "state")).root
    p = params(ws, tmp / "state")
    rows = []

    start_s = []
    for _ in range(starts):
        t0 = time.perf_counter()
        async with Client(p) as client:
            await client.call_tool("inspect_context", {})
            start_s.append(time.perf_counter() - t0)
    rows.append(
        (
            "server start -> first tool result",
            f"{statistics.median(start_s):.3f} s",
            f"{min(start_s):.3f} / {max(start_s):.3f} s (min/max of {starts})",
            "<= 1.5 s",
        )
    )

    async with Client(p) as client:
        for _ in range(10):  # warm-up: first calls import lazily
            await client.call_tool("inspect_context", {})
        rt = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.call_tool("inspect_context", {})
            rt.append((time.perf_counter() - t0) * 1e3)
        rows.append(
            (
                "inspect_context round trip (stdio)",
                f"{statistics.median(rt):.2f} ms",
                f"p10 {pct(rt, 0.1):.2f} / p90 {pct(rt, 0.9):.2f} ms (n={calls})",
                "median <= 5 ms",
            )
        )

        await client.call_tool("run_objective", {"cases": [SMALL]})  # warm runner/caches
        overhead, walls = [], []
        for _ in range(objectives):
            t0 = time.perf_counter()
            res = await client.call_tool("run_objective", {"cases": [SMALL]})
            total = time.perf_counter() - t0
            wall = float((res.structured_content or {}).get("wall_s", 0.0))
            walls.append(wall)
            overhead.append((total - wall) * 1e3)
        rows.append(
            (
                "run_objective overhead beyond runner",
                f"{statistics.median(overhead):.1f} ms",
                f"min {min(overhead):.1f} / max {max(overhead):.1f} ms; runner "
                f"{statistics.median(walls):.2f} s (n={objectives})",
                "<= 50 ms",
            )
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--objectives", type=int, default=5)
    a = ap.parse_args()
    rows = anyio.run(bench, a.calls, a.starts, a.objectives)
    print(
        f"# bench_mcp_cpu: {platform.node()} {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    widths = [
        max(len(r[i]) for r in [("metric", "median", "spread", "target"), *rows]) for i in range(4)
    ]
    for r in [("metric", "median", "spread", "target"), *rows]:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

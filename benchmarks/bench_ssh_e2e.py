"""End to end over SSH on a GPU machine: the in-process asyncssh server on loopback, the task
server in SSH mode (`harnesslab serve --gpu-host ...` over stdio), an MCP client calling
run_objective and sweep_kernel_config. Prints one table.

- warm run_objective round trip (MCP call to result) vs a fresh runner process per call;
- a 32-config sweep over the dev cases: configs/minute, against compiling and timing the same
  configs serially in one runner process (cold Triton caches for both).

    python benchmarks/bench_ssh_e2e.py [--calls 6] [--configs 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from harnesslab.tools.evaluation.sweep import expand_space
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace


def start_ssh_server(work: Path, triton_cache: Path) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(triton_cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnesslab.tests.ssh_testserver", str(work)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    info = json.loads(proc.stdout.readline())
    return proc, info


async def mcp_calls(
    ws: Path, info: dict, state: Path, *, warm: bool, calls: int, sweep_configs: int
):
    env = {
        **os.environ,
        "HARNESSLAB_STATE_DIR": str(state),
        "HARNESSLAB_WARM_WORKERS": "1" if warm else "0",
    }
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "harnesslab.servers",
            "serve",
            "-w",
            str(ws),
            "--gpu-host",
            f"{info['user']}@{info['host']}:{info['port']}",
            "--ssh-key",
            info["client_key"],
            "--known-hosts",
            info["known_hosts"],
        ],
        env=env,
    )
    times, scores = [], []
    sweep = None
    async with Client(params, mode="legacy") as client:
        for _ in range(calls):
            t0 = time.perf_counter()
            res = await client.call_tool("run_objective", {})
            times.append(time.perf_counter() - t0)
            sc = res.structured_content or {}
            scores.append(sc.get("score"))
            if res.is_error:
                print("run_objective error:", res.content, file=sys.stderr)
        if sweep_configs:
            t0 = time.perf_counter()
            res = await client.call_tool("sweep_kernel_config", {"max_configs": sweep_configs})
            sweep_s = time.perf_counter() - t0
            sc = res.structured_content or {}
            sweep = {
                "wall_s": sweep_s,
                "tried": sc.get("tried"),
                "ok": sc.get("ok"),
                "compile_s": sc.get("compile_s"),
                "timing_s": sc.get("timing_s"),
                "best": (sc.get("best") or {}).get("config"),
                "error": res.is_error,
            }
    return times, scores, sweep


def serial_sweep(
    ws_root: Path, configs: list[dict], triton_cache: Path, state: Path
) -> tuple[float, list[float]]:
    """All configs compiled and timed in ONE runner process, no parallel compile phase."""
    from harnesslab.tools.state.workspace import open_workspace

    settings = Settings(state_dir=state)
    ws = open_workspace(ws_root, settings)
    launcher = Launcher(settings)
    files = ws.editable_files()
    digest = ws.candidate_hash(files)
    launcher._stage_common(ws.task)
    staged = launcher.stage_candidate(files, digest)
    req = {
        "mode": "sweep",
        "candidate_dir": str(launcher.stage / staged),
        "reference": str(launcher.stage / "tasks" / ws.task.name / "reference.py"),
        "entry": ws.task.entry,
        "config_file": ws.task.config_file,
        "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
        "cases": [c.model_dump() for c in ws.task.dev_cases],
        "seed": 1,
        "configs": configs,
        "case_timeout_s": 300,
    }
    path = state / "serial_req.json"
    path.write_text(json.dumps(req))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(launcher.stage / "runner.py"), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_CACHE_DIR": str(triton_cache)},
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        print("serial sweep failed:", out.stderr[-2000:], file=sys.stderr)
    per_config = []
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("event") == "result" and isinstance(msg.get("configs"), list):
            per_config = [float(e.get("wall_s") or 0.0) for e in msg["configs"]]
    return wall, per_config


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--configs", type=int, default=32)
    ap.add_argument(
        "--serial-configs",
        type=int,
        default=8,
        help="configs for the serial baseline (its rate in configs/min is what is compared)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hl-ssh-e2e-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=tmp / "state")).root
    configs = expand_space(
        init_workspace("rmsnorm_gate", tmp / "ws_serial", Settings(state_dir=tmp / "state_serial")),
        None,
        args.configs,
        json.loads((ws / "kernel_config.json").read_text()),
    )
    # 1. serial baseline first, cold Triton cache of its own
    serial_configs = configs[: args.serial_configs]
    serial_s, serial_each = serial_sweep(
        tmp / "ws_serial", serial_configs, tmp / "tc_serial", tmp / "state_serial"
    )
    # 2. over SSH: fresh-process calls, then warm calls + the parallel sweep (cold cache B)
    proc, info = start_ssh_server(tmp / "remote", tmp / "tc_parallel")
    try:
        fresh, _, _ = anyio.run(
            lambda: mcp_calls(ws, info, tmp / "state_fresh", warm=False, calls=3, sweep_configs=0)
        )
        warm, scores, sweep = anyio.run(
            lambda: mcp_calls(
                ws,
                info,
                tmp / "state_warm",
                warm=True,
                calls=args.calls,
                sweep_configs=args.configs,
            )
        )
    finally:
        proc.terminate()
    warm_med = statistics.median(warm[1:])  # the first call starts the worker
    fresh_med = statistics.median(fresh)
    print("metric | value")
    print(
        f"warm run_objective round trip (median of {len(warm) - 1}, first {warm[0]:.2f} s) | {warm_med:.3f} s  (p10-p90 {min(warm[1:]):.3f}-{max(warm[1:]):.3f})"
    )
    print(f"fresh process per call (median of {len(fresh)}) | {fresh_med:.3f} s")
    print(f"warm vs fresh | {fresh_med / warm_med:.1f}x faster")
    if sweep:
        cpm = (sweep["tried"] or 0) / sweep["wall_s"] * 60
        # The serial path pays one process start (torch import, CUDA init); spread over the
        # same number of configs as the sweep, not over the fewer it actually ran.
        startup = serial_s - sum(serial_each) if len(serial_each) == len(serial_configs) else 0.0
        per = (serial_s - startup) / max(len(serial_configs), 1)
        serial_cpm = (sweep["tried"] or 0) / (startup + per * (sweep["tried"] or 0)) * 60
        print(
            f"sweep over SSH: {sweep['tried']} configs ({sweep['ok']} ok) | {sweep['wall_s']:.1f} s = {cpm:.1f} configs/min (compile {sweep['compile_s']:.1f} s, timing {sweep['timing_s']:.1f} s)"
        )
        print(
            f"serial compile+time in one process: {len(serial_configs)} configs | {serial_s:.1f} s (start {startup:.1f} s + {per:.2f} s/config) = {serial_cpm:.1f} configs/min at {sweep['tried']} configs"
        )
        print(f"sweep speedup | {cpm / serial_cpm:.1f}x  best {json.dumps(sweep['best'])}")
    print("scores:", [round(s, 1) if s else s for s in scores])
    return 0


if __name__ == "__main__":
    sys.exit(main())

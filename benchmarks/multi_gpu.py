"""Issue 20: the sweep's fan-out over the GPUs of one host (local executor, `--gpus 0,1`).

    python benchmarks/multi_gpu.py --gpus-sets "0;0,1" --configs 64 [--ssh] [--json OUT.json]

--ssh: the same over SSH (issue 30: the fan-out over SSH), the in-process asyncssh server on
loopback (bench_ssh_e2e.py's) as the GPU host: the launcher's slots are that host's GPUs.

One workspace of rmsnorm_gate, one state dir (so one Triton cache): a first sweep on the first
GPU set warms the compile pool's cache, then each GPU set sweeps the same 64 configs with warm
caches, so the comparison is the timing phase the launcher deals over its slots (the compile
phase runs on the host's CPUs either way). Prints configs/min, the phases, the speed-up over
one GPU and how many configs each GPU timed. Run with harnesslab importable (perf_gpu.sh's
install).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus-sets", default="0;0,1")
    ap.add_argument("--configs", type=int, default=64)
    ap.add_argument("--json", default="")
    ap.add_argument("--ssh", action="store_true", help="over the loopback asyncssh server")
    args = ap.parse_args()

    from harnesslab.tools.evaluation.sweep import sweep
    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.settings import Settings
    from harnesslab.tools.state.workspace import init_workspace

    tmp = Path(tempfile.mkdtemp(prefix="multigpu-"))
    state = tmp / "state"
    remote: dict[str, Any] = {}
    if args.ssh:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_ssh_e2e import start_ssh_server

        proc, info = start_ssh_server(tmp / "remote", tmp / "remote_triton")
        remote = {"gpu_host": f"{info['user']}@{info['host']}:{info['port']}",
                  "ssh_key": info["client_key"], "known_hosts": info["known_hosts"]}  # fmt: skip
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=state))
    sets = [s for s in args.gpus_sets.split(";") if s]
    rows: list[dict[str, Any]] = []

    async def one(gpus: str, label: str) -> None:
        launcher = Launcher(Settings(state_dir=state, gpus=gpus, **remote))
        try:
            t0 = time.perf_counter()
            res = await sweep(ws, launcher, max_configs=args.configs)
            wall = time.perf_counter() - t0
        finally:
            await launcher.aclose()
        per_gpu = collections.Counter(str(r.gpu_index) for r in res.results if r.status == "ok")
        row = {
            "run": label,
            "gpus": gpus,
            "tried": res.tried,
            "ok": res.ok,
            "wall_s": round(wall, 2),
            "compile_s": round(res.compile_s, 2),
            "timing_s": round(res.timing_s, 2),
            "configs_per_min": round(60 * res.tried / wall, 1),
            "timed_per_gpu": dict(per_gpu),
            "meaningful": res.meaningful,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    async def go() -> None:
        await one(sets[0], "warm-up (cold caches)")
        for gpus in sets:
            await one(gpus, f"{len(gpus.split(','))} GPU")

    try:
        anyio.run(go)
    finally:
        if args.ssh:
            proc.terminate()
    base = next(r for r in rows if r["run"] == "1 GPU")
    print("\nrun | wall s | compile s | timing s | configs/min | speed-up (wall, timing) | per GPU")
    for r in rows[1:]:
        print(
            f"{r['run']} | {r['wall_s']} | {r['compile_s']} | {r['timing_s']} | "
            f"{r['configs_per_min']} | {base['wall_s'] / r['wall_s']:.2f}x, "
            f"{base['timing_s'] / max(r['timing_s'], 1e-9):.2f}x | {r['timed_per_gpu']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

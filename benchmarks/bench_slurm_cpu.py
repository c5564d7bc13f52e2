"""The Slurm executor's cost on a CPU machine: a real one-node Slurm started here (the test
cluster, tests/slurm_cluster.py; needs root, slurm-wlm and munge) against the SSH executor to
the asyncssh test server in its own process (as benchmarks/bench_ssh_e2e.py), the runner on the
Triton interpreter. Three arms, one GPU slot each: `ssh` (the SSH backend to that server),
`slurm/ssh` (the Slurm backend reaching its login node through that same server: the like for
like comparison) and `slurm/local` (the Slurm backend with the server on the login node).
Prints one table.

- warm round trip: `Launcher.call` of a health request (no copy measurement) on the slot's warm
  runner: everything a warm call pays besides the runner's own work (connect, staging, sync, the
  GPU lock, the request and its answer through the worker's pipe). Slurm and SSH calls alternate.
- warm run_objective on one dev case (the same, plus the interpreter's work).
- from a pending-free cluster (no job) to the first result: sbatch until the job runs, then the
  first run_objective (the warm runner's step starts, imports torch, evaluates); each round
  starts with a new launcher and ends by releasing its allocation.

    python benchmarks/bench_slurm_cpu.py [--calls 30] [--first 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from harnesslab.tests.slurm_cluster import Cluster, slurm_settings, start_cluster
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.execution.backends import build_executors
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace

CASE = "1024x1024_fp16"
HEALTH = {"mode": "health", "measure_copy": False}


def start_ssh_server(work: Path) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnesslab.tests.ssh_testserver", str(work)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10) if len(values) >= 2 else [values[0]] * 9
    return f"{statistics.median(values) * 1e3:.1f} ms (p10-p90 {q[0] * 1e3:.1f}-{q[-1] * 1e3:.1f})"


def s_(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


async def warm(launchers: dict[str, Launcher], ws: dict[str, Workspace], calls: int) -> dict:
    times: dict[str, dict[str, list[float]]] = {k: {"health": [], "eval": []} for k in launchers}
    for name, launcher in launchers.items():  # start each warm runner on slot 0
        await run_objective(ws[name], launcher, cases=[CASE], save=False)
    for _ in range(calls):
        for name, launcher in launchers.items():
            t0 = time.perf_counter()
            call = await launcher.call(HEALTH, task=ws[name].task, slot=launcher.slots[0])
            times[name]["health"].append(time.perf_counter() - t0)
            assert (call.result or {}).get("status") == "passed", call.failure()
    for _ in range(max(3, calls // 3)):
        for name, launcher in launchers.items():
            t0 = time.perf_counter()
            res = await run_objective(ws[name], launcher, cases=[CASE], save=False)
            times[name]["eval"].append(time.perf_counter() - t0)
            assert res.status == "passed", res.reason
    return times


async def first_result(cluster: Cluster, tmp: Path, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"allocation": [], "first": []}
    for i in range(rounds):
        settings = slurm_settings(cluster, tmp / f"state_first{i}", interpret="always")
        launcher = Launcher(settings, build_executors(settings))
        ws = init_workspace("rmsnorm_gate", tmp / f"ws_first{i}", settings)
        try:
            t0 = time.perf_counter()
            await launcher.executors[0].connect()
            out["allocation"].append(time.perf_counter() - t0)
            res = await run_objective(ws, launcher, cases=[CASE], save=False)
            out["first"].append(time.perf_counter() - t0)
            assert res.status == "passed", res.reason
        finally:
            await launcher.aclose()
        cluster.wait_until(lambda: cluster.jobs() == [], "squeue empty", 30)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30, help="warm round trips per backend")
    ap.add_argument("--first", type=int, default=3, help="rounds of cluster -> first result")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hl-bench-slurm-"))
    cluster = start_cluster()
    slurm_v = cluster.command("srun", "--version").strip()
    proc, info = start_ssh_server(tmp / "remote")
    try:
        common = {"interpret": "always", "worker_max_calls": 10_000}
        login = {
            "gpu_host": f"{info['user']}@{info['host']}:{info['port']}",
            "ssh_key": Path(info["client_key"]),
            "known_hosts": Path(info["known_hosts"]),
            "remote_python": sys.executable,
        }
        arms = {
            "ssh": Settings(
                state_dir=tmp / "state_ssh", remote_root=str(tmp / "root_ssh"), **login, **common
            ),
            "slurm/ssh": slurm_settings(
                cluster,
                tmp / "state_sv",
                slurm_gpus=1,
                remote_root=str(tmp / "root_sv"),
                **login,
                **common,
            ),
            "slurm/local": slurm_settings(cluster, tmp / "state_sl", slurm_gpus=1, **common),
        }
        launchers = {k: Launcher(v, build_executors(v)) for k, v in arms.items()}
        ws = {
            k: init_workspace("rmsnorm_gate", tmp / f"ws_{k}", launchers[k].settings)
            for k in launchers
        }

        async def measure() -> tuple[dict, dict]:
            try:
                times = await warm(launchers, ws, args.calls)
            finally:
                for launcher in launchers.values():
                    await launcher.aclose()
            cluster.wait_until(lambda: cluster.jobs() == [], "squeue empty", 30)
            return times, await first_result(cluster, tmp, args.first)

        times, first = anyio.run(measure)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ssh_med = statistics.median(times["ssh"]["health"])
    print("metric | value")
    for kind, label in (
        ("health", "warm round trip (health request)"),
        ("eval", f"warm run_objective ({CASE})"),
    ):
        for name in ("ssh", "slurm/ssh", "slurm/local"):
            vals = times[name][kind]
            print(f"{label}, {name}, n={len(vals)} | {ms(vals)}")
    for name in ("slurm/ssh", "slurm/local"):
        extra = statistics.median(times[name]["health"]) - ssh_med
        print(f"warm round trip, {name} - ssh (medians) | {extra * 1e3:+.1f} ms (target <= +20 ms)")
    print(f"pending-free cluster -> allocation running, n={args.first} | {s_(first['allocation'])}")
    print(
        f"pending-free cluster -> first run_objective result, n={args.first} | {s_(first['first'])}"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; {slurm_v}; python {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End to end over SSH on a GPU machine: the in-process asyncssh server on loopback, the task
server in SSH mode (`harnesslab serve --gpu-host ...` over stdio), an MCP client calling
run_objective and sweep_kernel_config. Prints one table.

- objective: warm run_objective round trip (MCP call to result); with --breakdown, where its
  seconds go (the host's and the runner's own per-phase timestamps, EvalResult.phases_s) and
  how far two back-to-back evals agree per case;
- fresh: a fresh runner process per call, for comparison;
- sweep: a 32-config sweep over the dev cases on the warm compile pool (twice: a cold pool,
  then the warm pool on a changed candidate, so its Triton cache is cold again), against
  compiling and timing the same configs serially in one runner process (cold cache too).

    python benchmarks/bench_ssh_e2e.py [--parts objective,fresh,sweep] [--calls 6]
        [--configs 32] [--breakdown] [--language triton|cuda] [--json FILE]

--language cuda runs all of it on rmsnorm_gate's CUDA C++ template (kernel.cu through NVRTC).
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
    ws: Path, info: dict, state: Path, *, warm: bool, calls: int, sweeps: int, sweep_configs: int,
    language: str = "triton",
) -> dict:  # fmt: skip
    # The server's state dir holds the workspace's binding (its task and kernel language): bind
    # it there as init did (a workspace first opened in a new state dir is bound to its task's
    # Triton version).
    init_workspace("rmsnorm_gate", ws, Settings(state_dir=state), force=True, language=language)
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
    out: dict = {"times": [], "scores": [], "results": [], "sweeps": []}
    async with Client(params, mode="legacy") as client:
        for _ in range(calls):
            t0 = time.perf_counter()
            res = await client.call_tool("run_objective", {})
            out["times"].append(time.perf_counter() - t0)
            sc = res.structured_content or {}
            out["scores"].append(sc.get("score"))
            out["results"].append(sc)
            if res.is_error:
                print("run_objective error:", res.content, file=sys.stderr)
        for k in range(sweeps):
            if k:  # a changed candidate: new hash, so a cold Triton (or NVRTC) cache on the
                # warm pool
                for name in ("kernel.py", "kernel.cu"):
                    kernel = ws / name
                    if kernel.exists():
                        kernel.write_text(kernel.read_text() + f"\n// sweep {k}\n"
                                          if name.endswith(".cu") else
                                          kernel.read_text() + f"\n# sweep {k}\n")  # fmt: skip
            t0 = time.perf_counter()
            res = await client.call_tool("sweep_kernel_config", {"max_configs": sweep_configs})
            sweep_s = time.perf_counter() - t0
            sc = res.structured_content or {}
            out["sweeps"].append(
                {
                    "wall_s": sweep_s,
                    "tried": sc.get("tried"),
                    "ok": sc.get("ok"),
                    "by_status": sc.get("by_status"),
                    "compile_s": sc.get("compile_s"),
                    "timing_s": sc.get("timing_s"),
                    # compiles and timing overlap: the tool's own span of both, and in how
                    # many timing requests the configs that passed went
                    "overlapped_s": sc.get("wall_s"),
                    "timing_requests": sc.get("timing_requests"),
                    "compile_workers": sc.get("compile_workers"),
                    "best": (sc.get("best") or {}).get("config"),
                    "error": res.is_error,
                    "pool": "cold" if k == 0 else "warm",
                }
            )
            if res.is_error:
                print("sweep error:", res.content, file=sys.stderr)
            # raw, as soon as measured: a run cut by its time limit still shows what it had
            print("measured sweep:", json.dumps(out["sweeps"][-1]), flush=True)
    return out


def serial_sweep(
    ws_root: Path, configs: list[dict], triton_cache: Path, state: Path
) -> tuple[float, list[float]]:
    """All configs compiled and timed in ONE runner process, no parallel compile phase."""
    from harnesslab.tools.state.workspace import open_workspace

    settings = Settings(state_dir=state)
    ws = open_workspace(ws_root, settings)
    launcher = Launcher(settings)
    candidate = ws.snapshot()
    launcher.staging.stage_task(ws.task)
    staged = launcher.stage_candidate(candidate.files, candidate.digest)
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
        [sys.executable, str(launcher.stage / "harness" / "runner.py"), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_CACHE_DIR": str(triton_cache)},
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        print("serial sweep failed:", out.stderr[-2000:], file=sys.stderr)
    per_config, passed = [], 0
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("event") == "result" and isinstance(msg.get("configs"), list):
            per_config = [float(e.get("wall_s") or 0.0) for e in msg["configs"]]
            passed = sum(e.get("status") == "passed" for e in msg["configs"])
    print(f"serial: {passed} of {len(per_config)} configs passed", flush=True)
    return wall, per_config


HOST_PHASES = ("snapshot", "stage", "gpu_lock", "sync", "transport", "result")


def breakdown_table(results: list[dict], times: list[float]) -> list[tuple[str, float]]:
    """Median seconds per phase over the warm calls, plus what the client saw beyond them
    (MCP framing, the server's own work, stdio)."""
    phases: dict[str, list[float]] = {}
    for r in results:
        for k, v in (r.get("phases_s") or {}).items():
            phases.setdefault(k, []).append(float(v))
    order = [k for k in HOST_PHASES if k in phases]
    order[-1:-1] = sorted(k for k in phases if k.startswith("runner_"))
    rows = [(k, statistics.median(phases[k])) for k in order]
    inside = [sum((r.get("phases_s") or {}).values()) for r in results]
    rows.append(("mcp + server (round trip - phases)",
                 statistics.median(t - i for t, i in zip(times, inside, strict=True))))  # fmt: skip
    return rows


def agreement(a: dict, b: dict) -> list[tuple[str, str, float | None, str, float | None]]:
    """Per case of two back-to-back evals: (case, timing method, |a - b| / mean of the two,
    the samples each took "a/b", a's median us)."""
    rows = []
    by_b = {c["name"]: c for c in b.get("cases") or []}
    for c in a.get("cases") or []:
        other = by_b.get(c["name"]) or {}
        x, y = c.get("median_us"), other.get("median_us")
        rel = abs(x - y) / ((x + y) / 2) if x and y else None
        samples = f"{c.get('samples')}/{other.get('samples')}"
        rows.append((c["name"], str(c.get("timing_method")), rel, samples, x))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="objective,fresh,sweep")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--configs", type=int, default=32)
    ap.add_argument("--sweeps", type=int, default=2, help="1: cold pool only; 2: then warm pool")
    ap.add_argument(
        "--serial-configs",
        type=int,
        default=8,
        help="configs for the serial baseline (its rate in configs/min is what is compared)",
    )
    ap.add_argument("--breakdown", action="store_true", help="per-phase seconds of a warm call")
    ap.add_argument("--language", default="triton", help="the template's kernel language")
    ap.add_argument("--json", type=Path, help="write every number measured here to this file")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    report: dict = {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "language": args.language}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="hl-ssh-e2e-"))
    lang = {"language": args.language}
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=tmp / "state"), **lang).root
    configs = expand_space(
        init_workspace(
            "rmsnorm_gate", tmp / "ws_serial", Settings(state_dir=tmp / "state_serial"), **lang
        ),
        None,
        args.configs,
        json.loads((ws / "kernel_config.json").read_text()),
    )
    # 1. serial baseline first, cold Triton cache of its own
    serial_configs = configs[: args.serial_configs]
    serial_s, serial_each = 0.0, []
    if "sweep" in parts:
        serial_s, serial_each = serial_sweep(
            tmp / "ws_serial", serial_configs, tmp / "tc_serial", tmp / "state_serial"
        )
        print(f"measured serial: {len(serial_configs)} configs in {serial_s:.1f} s, per config "
              f"{[round(x, 2) for x in serial_each]}", flush=True)  # fmt: skip
    # 2. over SSH: fresh-process calls, then warm calls + the pooled sweeps (cold caches)
    proc, info = start_ssh_server(tmp / "remote", tmp / "tc_parallel")
    fresh: dict = {"times": []}
    try:
        if "fresh" in parts:
            fresh = anyio.run(
                lambda: mcp_calls(
                    ws,
                    info,
                    tmp / "state_fresh",
                    warm=False,
                    calls=3,
                    sweeps=0,
                    sweep_configs=0,
                    language=args.language,
                )
            )
        warm = anyio.run(
            lambda: mcp_calls(
                ws,
                info,
                tmp / "state_warm",
                warm=True,
                calls=args.calls if "objective" in parts else 0,
                sweeps=args.sweeps if "sweep" in parts else 0,
                sweep_configs=args.configs,
                language=args.language,
            )
        )
    finally:
        proc.terminate()
    print("metric | value")
    times = warm["times"]
    if len(times) >= 2:
        warm_med = statistics.median(times[1:])  # the first call starts the worker
        report["objective"] = {"first_s": times[0], "warm_s": times[1:], "median_s": warm_med,
                               "scores": warm["scores"]}  # fmt: skip
        print(
            f"warm run_objective round trip (median of {len(times) - 1}, first {times[0]:.2f} s) | {warm_med:.3f} s  (p10-p90 {min(times[1:]):.3f}-{max(times[1:]):.3f})"
        )
        if fresh["times"]:
            fresh_med = statistics.median(fresh["times"])
            report["fresh"] = {"times_s": fresh["times"], "median_s": fresh_med}
            print(f"fresh process per call (median of {len(fresh['times'])}) | {fresh_med:.3f} s")
            print(f"warm vs fresh | {fresh_med / warm_med:.1f}x faster")
        if args.breakdown:
            rows = breakdown_table(warm["results"][1:], times[1:])
            report["breakdown_s"] = dict(rows)
            print("-- breakdown of a warm call (median s over the warm calls) --")
            for name, secs in rows:
                print(f"  {name} | {secs * 1e3:.1f} ms")
            agree = agreement(warm["results"][-2], warm["results"][-1])
            report["agreement"] = agree
            print("-- two back-to-back evals, per case: |a-b|/mean (timing method, samples) --")
            for name, method, rel, samples, med in agree:
                pct = "-" if rel is None else f"{100 * rel:.2f}%"
                print(f"  {name} ({method}, {samples}) | {pct} (median {med} us)")
            bw = [r[2] for r in agree if r[1] == "isolated" and r[2] is not None]
            if bw:
                print(f"  worst bandwidth-bound case | {100 * max(bw):.2f}% (target <= 1%)")
    for sweep in warm["sweeps"]:
        cpm = (sweep["tried"] or 0) / sweep["wall_s"] * 60
        sweep["configs_per_min"] = cpm
        print(
            f"sweep over SSH ({sweep['pool']} pool): {sweep['tried']} configs ({sweep['ok']} ok) | {sweep['wall_s']:.1f} s = {cpm:.1f} configs/min (compile {sweep['compile_s'] or 0:.1f} s on {sweep['compile_workers']} workers, timing {sweep['timing_s'] or 0:.1f} s in {sweep['timing_requests']} requests, overlapped: both in {sweep['overlapped_s'] or 0:.1f} s) {sweep['by_status']}"
        )
    if warm["sweeps"]:
        # The serial path pays one process start (torch import, CUDA init); spread over the
        # same number of configs as the sweep, not over the fewer it actually ran.
        tried = warm["sweeps"][0]["tried"] or 0
        startup = serial_s - sum(serial_each) if len(serial_each) == len(serial_configs) else 0.0
        per = (serial_s - startup) / max(len(serial_configs), 1)
        serial_cpm = tried / (startup + per * tried) * 60 if tried else 0.0
        report["serial"] = {"configs": len(serial_configs), "wall_s": serial_s,
                            "startup_s": startup, "per_config_s": per,
                            "configs_per_min_at_sweep_size": serial_cpm}  # fmt: skip
        print(
            f"serial compile+time in one process: {len(serial_configs)} configs | {serial_s:.1f} s (start {startup:.1f} s + {per:.2f} s/config) = {serial_cpm:.1f} configs/min at {tried} configs"
        )
        for sweep in warm["sweeps"]:
            if serial_cpm:
                sweep["speedup_vs_serial"] = sweep["configs_per_min"] / serial_cpm
                print(
                    f"sweep speedup ({sweep['pool']} pool) | {sweep['speedup_vs_serial']:.1f}x (target >= 6x)  best {json.dumps(sweep['best'])}"
                )
        report["sweeps"] = warm["sweeps"]
    print("scores:", [round(s, 1) if s else s for s in warm["scores"]])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the sandbox adds to starting a process: `python -c pass` with and without sandbox.py
in front of it (fork, namespaces, mounts, Landlock, seccomp, reaper, the limits: a cgroup where
one can be made, rlimits, the scratch tmpfs), started as the toolkit starts it (the policy on
stdin), alternating, n runs each; `--cgroup off` measures the sandbox with rlimits only.

    python benchmarks/sandbox_start_cpu.py [--n 20] [--cgroup off]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOX = Path(__file__).resolve().parents[1] / "tools" / "gpu" / "isolation" / "sandbox.py"
sys.path.insert(0, str(SANDBOX.parent))
import sandbox_policy as sp  # noqa: E402 - staged beside sandbox.py, stdlib only


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--cgroup", choices=["auto", "off"], default="auto")
    args = ap.parse_args()
    n = args.n
    policy = sp.Policy(scratch_root=tempfile.mkdtemp(), limits=sp.Limits(cgroup=args.cgroup))
    plain = [sys.executable, "-I", "-c", "pass"]
    times: dict[str, list[float]] = {"plain": [], "sandboxed": []}
    for _ in range(n):
        for name in ("plain", "sandboxed"):
            launch = sp.command(sys.executable, str(SANDBOX), policy, plain)
            argv, stdin = (plain, b"") if name == "plain" else (launch.argv, launch.stdin)
            t0 = time.perf_counter()
            out = subprocess.run(argv, input=stdin, check=True, capture_output=True)
            times[name].append((time.perf_counter() - t0) * 1e3)
    print("limits:", out.stdout.decode().splitlines()[0] if out.stdout else "?")
    for name, xs in times.items():
        xs.sort()
        print(
            f"{name:10s} median {statistics.median(xs):6.1f} ms  p10 {xs[n // 10]:6.1f}  "
            f"p90 {xs[(9 * n) // 10]:6.1f}  (n={n})"
        )
    print(
        f"added by the sandbox: {statistics.median(times['sandboxed']) - statistics.median(times['plain']):.1f} ms per process start"
    )


main()

"""What the sandbox adds to starting a process: `python -c pass` with and without sandbox.py
in front of it (fork, namespaces, mounts, Landlock, seccomp, reaper), alternating, n runs each.

    python benchmarks/sandbox_start_cpu.py [--n 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOX = Path(__file__).resolve().parents[1] / "tools" / "gpu" / "sandbox.py"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    n = ap.parse_args().n
    root = tempfile.mkdtemp()
    policy = json.dumps({"scratch_root": root})
    plain = [sys.executable, "-I", "-c", "pass"]
    boxed = [sys.executable, "-I", str(SANDBOX), "--policy", policy, "--", *plain]
    times: dict[str, list[float]] = {"plain": [], "sandboxed": []}
    for _ in range(n):
        for name, argv in (("plain", plain), ("sandboxed", boxed)):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            times[name].append((time.perf_counter() - t0) * 1e3)
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

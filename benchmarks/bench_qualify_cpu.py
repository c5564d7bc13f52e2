"""Wall time of qualifying generated servers on this machine (Triton CPU interpreter without a
GPU): prints one table. Target (issue 6): a typical generated server qualifies in <= 20 s.

    python benchmarks/bench_qualify_cpu.py [--repeats 3] [--verifier]

Servers, each generated fresh into a new workspace:
  minimal   one custom tool (no runner call): the fixed cost of qualification (process starts,
            the SDK import in each, pytest).
  typical   what an agent builds from an iteration: a sweep preset (2 configs, one small case),
            a numerical-probe preset (one probe, one dtype) and a custom diagnostic.
  verifier  (--verifier) guarded_final_verify under another name: the honest baseline on the
            hidden cases three times (probe, self-test, own tests) plus the cheat corpus.
Each row: median and min/max of the qualification wall time over --repeats runs, the slowest
lane's checks, and whether it qualified.
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
from typing import Any

import anyio

from harnesslab.tools.meta.genserver import generate
from harnesslab.tools.meta.qualification import QualificationReport, qualify_workspace_server
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

SMALL = "1024x1024_fp16"
DIAG = '''
import json
from pathlib import Path


async def config_summary(workspace: Path) -> dict:
    """The launch knobs in kernel_config.json."""
    return json.loads((workspace / "kernel_config.json").read_text())
'''
CUSTOM = {"custom": {"function": "config_summary", "file": "diag.py"}, "read_only": True}
SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"tools": [CUSTOM]},
    "typical": {
        "tools": [
            {
                "builtin": "sweep_kernel_config",
                "name": "sweep_warps",
                "presets": {"space": {"num_warps": [2, 4]}, "cases": [SMALL], "max_configs": 2},
            },
            {
                "builtin": "numerical_probe",
                "name": "probe_fp16",
                "presets": {"dtypes": ["float16"]},
            },
            CUSTOM,
        ]
    },
    "verifier": {"tools": [{"builtin": "guarded_final_verify", "name": "final_check"}]},
}


async def one(kind: str, base: Path, i: int) -> QualificationReport:
    settings = Settings(state_dir=base / "state")
    ws = init_workspace("rmsnorm_gate", base / f"{kind}-{i}", settings)
    spec = {"name": f"bench-{kind}", "description": f"Benchmark server ({kind}).", **SPECS[kind]}
    generate(ws, spec, {"diag.py": DIAG})
    return await qualify_workspace_server(ws, f"bench-{kind}", settings, timeout_s=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verifier", action="store_true", help="also the guarded verifier server")
    args = parser.parse_args()
    kinds = ["minimal", "typical"] + (["verifier"] if args.verifier else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-qualify-") as tmp:
        base = Path(tmp)
        anyio.run(one, "minimal", base, -1)  # warm the staged runner and the file cache
        for kind in kinds:
            walls, last = [], None
            for i in range(args.repeats):
                t0 = time.perf_counter()
                last = anyio.run(one, kind, base, i)
                walls.append(time.perf_counter() - t0)
            assert last is not None
            lanes = {
                c.name: c.duration_s
                for c in last.checks
                if c.name.startswith(("tool:", "verifier:")) or c.name in ("self_test", "own_tests")
            }
            slow = ", ".join(
                f"{k} {v:.1f}s" for k, v in sorted(lanes.items(), key=lambda x: -x[1])[:3]
            )
            rows.append((kind, len(SPECS[kind]["tools"]), walls, last.passed, slow))
    print(f"# bench_qualify_cpu  {platform.node()}  {platform.processor() or platform.machine()}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"# python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load} (1/5/15 min), "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(
        f"{'server':<10} {'tools':>5} {'median_s':>9} {'min_s':>7} {'max_s':>7} {'ok':>3}  slowest checks"
    )
    for kind, n, walls, ok, slow in rows:
        print(
            f"{kind:<10} {n:>5} {statistics.median(walls):>9.1f} {min(walls):>7.1f} "
            f"{max(walls):>7.1f} {'yes' if ok else 'NO':>3}  {slow}"
        )
    target = next(statistics.median(w) for k, _, w, _, _ in rows if k == "typical")
    print(f"typical <= 20 s: {'PASS' if target <= 20 else 'FAIL'} ({target:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

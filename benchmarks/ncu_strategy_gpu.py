"""Nsight Compute on one lab strategy over chosen cases, side by side: every metric
tools/gpu/ncu.py collects for profile_kernel plus issue-stall reasons, per case (median over
--calls launches). Written to see why the CUDA C++ rmsnorm_gate solution reads 20% slower in bf16
than in fp16 although NVRTC emits the same PTX for both but the conversions.

    python benchmarks/ncu_strategy_gpu.py --task rmsnorm_gate --strategy sol:cuda_rmsnorm_gate \
        --cases 4096x4096_fp16,4096x4096_bf16 [--calls 3]

Uses the lab's profiled-target mode (tools/gpu/kernel_lab/lab.py --ncu-target) from a flat copy,
as benchmarks/lab_gpu.py does; needs torch, triton, NVRTC and ncu.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STALLS = [
    "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio",
    "smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio",
    "smsp__average_warp_latency_issue_stalled_wait.ratio",
    "smsp__average_warp_latency_issue_stalled_barrier.ratio",
    "smsp__average_warp_latency_issue_stalled_lg_throttle.ratio",
    "smsp__inst_executed.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="rmsnorm_gate")
    ap.add_argument("--strategy", default="sol:cuda_rmsnorm_gate")
    ap.add_argument("--cases", default="4096x4096_fp16,4096x4096_bf16")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("_hl_gpu", ROOT / "tools" / "gpu" / "__init__.py")
    gpu = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(gpu)  # type: ignore[union-attr]
    flat = gpu.copy_flat(Path(tempfile.mkdtemp(prefix="hl_ncu_")), gpu.LAB)
    nspec = importlib.util.spec_from_file_location("_hl_ncu", flat / "ncu.py")
    ncu = importlib.util.module_from_spec(nspec)  # type: ignore[arg-type]
    nspec.loader.exec_module(ncu)  # type: ignore[union-attr]
    cases = args.cases.split(",")
    target = [sys.executable, str(flat / "lab.py"), "--ncu-target", args.task, "--strategy",
              args.strategy, "--cases", args.cases, "--calls", str(args.calls), "--tasks-root",
              str(ROOT / "tasks"), "--interpret", "never"]  # fmt: skip
    base = ncu.ncu_metrics
    ncu.ncu_metrics = lambda exe, tensor: [*base(exe, tensor), *STALLS]
    log = Path(tempfile.mkdtemp()) / "ncu.csv"
    rec = ncu.profile(target, cases, args.calls, log, args.budget_s, tensor=False)
    if "by_case" not in rec:
        print("ncu:", rec.get("error"))
        return 1
    names = sorted({m for c in rec["by_case"].values() for m in c if m != "kernel"})
    print(f"{'metric':72} " + " ".join(f"{c:>18}" for c in cases))
    for c in cases:
        print(f"kernel {c}: {rec['by_case'][c]['kernel']}")
    for m in names:
        cells = []
        for c in cases:
            v = rec["by_case"][c].get(m, {}).get("value")
            cells.append(f"{v:>18.4g}" if isinstance(v, (int, float)) else f"{'-':>18}")
        print(f"{m:72} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rmsnorm_gate benchmark matrix on a GPU: baseline, solutions, torch eager, torch.compile and a
plain copy moving the same bytes, per shape and dtype; median us, GB/s, % of measured copy
bandwidth. Uses the GPU-side runner's own timing and correctness code (one implementation).

    python benchmarks/bench_rmsnorm_gate.py [--out results.json] [--quick]

Also: --ncu-target runs the solution on 4096x8192 fp16 a few times (for ncu), and --repeat-check
runs the runner's evaluate twice on the dev cases and prints per-case agreement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The GPU-side runner by path (putting tools/ on sys.path would shadow stdlib modules).
_spec = importlib.util.spec_from_file_location("runner", ROOT / "tools" / "gpu" / "runner.py")
runner = importlib.util.module_from_spec(_spec)
sys.modules["runner"] = runner
_spec.loader.exec_module(runner)

TASK = ROOT / "tasks" / "rmsnorm_gate"
SHAPES = [
    (1024, 1024),
    (768, 2048),
    (384, 4096),  # launch-bound dev cases
    (4096, 4096),
    (4096, 8192),
    (8192, 8192),
    (16384, 2048),
    (2048, 5120),
    (8192, 3000),
]


def tolerances() -> dict:
    import tomllib

    t = tomllib.loads((TASK / "task.toml").read_text())
    return t["tolerances"]


def load_fn(path: Path, config: dict | None = None):
    ev_req = {"entry": f"{path.name}:rmsnorm_gate", "config_file": "kernel_config.json"}
    folder = path.parent
    ev = runner.Evaluator.__new__(runner.Evaluator)
    ev.req = ev_req
    ev.ref = None  # no declared module task: the entry is a function
    fn, _ = ev.load_candidate(str(folder), config)
    return fn


def torch_fns():
    import torch
    import torch.nn.functional as F

    def eager(x, gate, weight, eps=1e-5):
        xf = x.float()
        y = (
            xf
            * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            * weight.float()
            * F.silu(gate.float())
        )
        return y.to(x.dtype)

    def compiled():
        # A fresh compile per case: one compiled function over 18 shape/dtype pairs exceeds
        # dynamo's recompile limit (8) and silently falls back to eager.
        torch._dynamo.reset()
        return torch.compile(eager, dynamic=False)

    def copy(x, gate, weight, eps=1e-5):
        # reads x and gate, writes one tensor: the kernel's bytes (minus the weight)
        return torch.add(x, gate)

    return {"torch_eager": lambda: eager, "torch_compile": compiled, "copy_add": lambda: copy}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="fewer shapes and samples")
    ap.add_argument("--ncu-target", action="store_true")
    ap.add_argument("--repeat-check", action="store_true")
    args = ap.parse_args()
    env = runner.Env(interpret=False)
    torch = env.torch
    req = {
        "reference": str(TASK / "reference.py"),
        "tolerances": tolerances(),
        "seed": 1234,
        "warmup": 10,
        "repeats": 15 if args.quick else 30,
        "case_timeout_s": 600,
        "entry": "kernel.py:rmsnorm_gate",
        "config_file": "kernel_config.json",
    }
    ev = runner.Evaluator(env, req)
    if args.ncu_target:
        fn = load_fn(TASK / "solutions" / "fast.py")
        args_, kw = ev.make({"rows": 4096, "dim": 8192}, torch.float16, 0)
        for _ in range(5):
            fn(*args_, **kw)
        torch.cuda.synchronize()
        print(json.dumps({"ncu_target": "4096x8192_fp16", "calls": 5}))
        return 0
    base = load_fn(TASK / "workspace" / "kernel.py")
    strategies = {"baseline": lambda: base}
    for sol in sorted((TASK / "solutions").glob("*.py")):
        if not sol.name.startswith("_"):
            fn_ = load_fn(sol)
            strategies[f"sol:{sol.stem}"] = lambda fn_=fn_: fn_
    strategies.update(torch_fns())
    copy_gbps = env.copy_gbps()
    shapes = SHAPES[:6] if args.quick else SHAPES
    rows = []
    t0 = time.time()
    for dtype in ("float16", "bfloat16"):
        for r, d in shapes:
            case = {"name": f"{r}x{d}_{dtype}", "dtype": dtype, "shape": {"rows": r, "dim": d}}
            for name, make in strategies.items():
                fn = make()
                if name == "copy_add":  # not the same function: only its time matters
                    res = ev.time_case(fn, case["shape"], getattr(torch, dtype), 0)
                    res.update(name=case["name"], dtype=dtype, passed=True)
                else:
                    res = ev.run_case(fn, case, 0, "", timing=True)
                rows.append(
                    {
                        "strategy": name,
                        **{
                            k: res.get(k)
                            for k in (
                                "name",
                                "dtype",
                                "median_us",
                                "p10_us",
                                "p90_us",
                                "spread",
                                "launch_overhead_us",
                                "gbps",
                                "pct_of_copy_bw",
                                "passed",
                                "reason",
                                "timing_method",
                            )
                        },
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    info = env.info() | {
        "copy_gbps": copy_gbps,
        "date": time.strftime("%Y-%m-%d"),
        "wall_s": time.time() - t0,
    }
    if args.out:
        args.out.write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    # table: per case, us and % of copy for each strategy
    names = list(strategies)
    print(
        f"device {info['device']}  torch {info['torch']}  triton {info['triton']}  copy {copy_gbps:.0f} GB/s"
    )
    print("case | " + " | ".join(names) + " | sol/compile")
    by = {(x["name"], x["strategy"]): x for x in rows}
    for dtype in ("float16", "bfloat16"):
        for r, d in shapes:
            cname = f"{r}x{d}_{dtype}"
            cells = []
            for n in names:
                x = by[(cname, n)]
                if x["median_us"] is None or not x["passed"]:
                    cells.append(f"FAIL({(x['reason'] or '')[:30]})")
                else:
                    cells.append(f"{x['median_us']:.1f}us {x['pct_of_copy_bw']:.0f}%")
            best_sol = min(
                (by[(cname, n)]["median_us"] or 1e9) for n in names if n.startswith("sol:")
            )
            comp = by[(cname, "torch_compile")]["median_us"] or float("nan")
            print(f"{cname} | " + " | ".join(cells) + f" | {comp / best_sol:.2f}x")
    if args.repeat_check:
        print("repeat-check: see benchmarks/repeat_check.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())

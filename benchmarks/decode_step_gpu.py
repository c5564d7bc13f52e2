"""decode_step (issue 32): the PyTorch-eager baseline, torch.compile(mode="reduce-overhead")
(CUDA graphs through cudagraph trees) and the shipped solution (tasks/decode_step/solutions/
triton.py: Triton RMSNorm, rotary + KV append and split decode attention, cuBLAS GEMMs, one CUDA
graph per bucket) over a fixed-length and a dynamic trace on one GPU, through
tools/gpu/step_trace.py: every step's logits and the KV cache after each pass checked against the
task's reference, then p50/p95/p99 per sequence-length bucket, device time apart from host launch
overhead, tokens/s. Prints one table last and writes OUT/decode_step.json.

    python benchmarks/decode_step_gpu.py --out DIR [--dtype bfloat16] [--preset small]
        [--strategies eager,compile_reduce_overhead,solution]
    python benchmarks/decode_step_gpu.py --out DIR --dry-run      (CPU: the tiny config, eager
                                                                  and the solution interpreted)

Presets: `task` is decode_step's task.toml GPU model (what run_objective times); `small` is
Llama-3.2-1B-shaped (hidden 2048, 32 heads, 8 kv heads, 16 layers) with a
32000-token vocabulary, batch 8, max_seq 2048 (about 1.4 GB of fp16 weights, a 268 MB cache).
torch.compile gets the state's tensors marked as static addresses (as gpt-fast's KV cache
buffers are), so its CUDA graphs replay over them instead of copying them in (tools/gpu/
lab_step.py's `compiled`, which the lab's decode row uses too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
TASK_DIR = ROOT / "tasks" / "decode_step"
PRESETS = {
    "tiny": {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "max_seq": 64, "batch": 4,
             "vocab": 256},
    "small": {"hidden": 2048, "heads": 32, "kv_heads": 8, "layers": 16, "max_seq": 2048,
              "batch": 8, "vocab": 32000},
}  # fmt: skip
# `task`: the sizes run_objective times on a GPU (task.toml's [step] model).
PRESETS["task"] = tomllib.loads((TASK_DIR / "task.toml").read_text())["step"]["model"]
# (buckets, steps per segment, segments per bucket, fixed prompt length, fixed steps) per preset
TRACES = {
    "tiny": ([8, 16, 32, 64], 4, 2, 20, 16),
    "small": ([256, 512, 1024, 2048], 32, 4, 1000, 128),
    "task": ([256, 512, 1024, 2048], 32, 4, 1000, 128),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, the tiny preset: eager and the solution (Triton interpreter)")  # fmt: skip
    ap.add_argument("--strategies", default="eager,compile_reduce_overhead,solution",
                    help="comma-separated subset (the dry run never compiles)")  # fmt: skip
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported (the solution)
    sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    import step_trace  # noqa: PLC0415 - staged-style: by plain name from tools/gpu
    from lab_step import compiled  # noqa: PLC0415 - the lab's decode row builds it the same way
    from runner import load_module  # noqa: PLC0415

    ref = load_module(TASK_DIR / "reference.py", "decode_step_reference")
    eager = load_module(TASK_DIR / "workspace" / "kernel.py", "decode_step_eager")
    solution = load_module(TASK_DIR / "solutions" / "triton.py", "decode_step_solution")

    preset = "tiny" if args.dry_run else args.preset
    device = "cpu" if args.dry_run else "cuda"
    config = ref.Config(**PRESETS[preset], dtype=args.dtype)
    buckets, per_segment, per_bucket, length, steps = TRACES[preset]
    traces = [
        step_trace.fixed_trace(config, length=length, steps=steps, seed=1, buckets=buckets),
        step_trace.dynamic_trace(config, buckets=buckets, steps_per_segment=per_segment,
                                 segments_per_bucket=per_bucket, seed=2),
    ]  # fmt: skip
    wanted = args.strategies.split(",")
    if unknown := set(wanted) - {"eager", "compile_reduce_overhead", "solution"}:
        ap.error(f"unknown strategies {sorted(unknown)}")
    strategies = {"eager": eager.step}
    if not args.dry_run:
        strategies["compile_reduce_overhead"] = compiled(eager.step)
    strategies["solution"] = solution.step
    strategies = {k: v for k, v in strategies.items() if k in wanted}
    info = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "torch": torch.__version__, "config": PRESETS[preset], "dtype": args.dtype}  # fmt: skip
    results: dict[str, Any] = {"info": info, "runs": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, step in strategies.items():
        for trace in traces:
            t0 = time.perf_counter()
            run = step_trace.run_trace(torch, ref, step, config, trace, device=device)
            results["runs"].append({"strategy": name, "wall_s": time.perf_counter() - t0, **run})
            (args.out / "decode_step.json").write_text(json.dumps(results, indent=1))
    print(
        f"# decode_step on {info['device']}, torch {info['torch']}, {args.dtype}, {preset}: "
        f"{json.dumps(PRESETS[preset])}"
        + ("; CPU timings are not meaningful" if args.dry_run else "")
    )
    head = ("strategy", "trace", "bucket", "steps", "p50_us", "p95_us", "p99_us", "device_p50_us",
            "launch_overhead_us", "host_p50_us", "tokens_per_s", "correct")  # fmt: skip
    print(" | ".join(head))
    for run in results["runs"]:
        for row in [*run["buckets"], run["total"] or {}]:
            cells = [
                run["strategy"],
                run["trace"],
                *(row.get(k) for k in head[2:-1]),
                run["correct"],
            ]
            print(" | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells))
        if run["failures"]:
            print(f"  {run['strategy']} {run['trace']} failed: {run['failures'][0]}")
    return 0 if all(run["correct"] for run in results["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

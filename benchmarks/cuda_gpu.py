"""CUDA C++ kernels on a GPU host (issue 31): each task's CUDA reference solution and CUDA baseline
beside the Triton reference solution, through the runner's own per-case path
(tools/gpu/runner.py `Evaluator.run_case`: poisoned outputs, correctness against the task's
reference and tolerances, then the one timing implementation: isolated samples from a clean L2
or CUDA-graph replays over inputs rotated past 2.5x L2, median and p10/p90, % of the measured
copy bandwidth); correctness on irregular widths, empty batches and single rows; and NVRTC
compile time per config of each task's CUDA launch space (what a sweep compiles), one process
after another and on a pool of processes.

    python benchmarks/cuda_gpu.py [--tasks rmsnorm_gate,softmax,swiglu] [--repeats 30]
                                  [--workers 16] [--quick] [--no-compile-times]

Needs torch, triton (the Triton solutions) and NVRTC (torch's CUDA wheel, the toolkit, or
`pip install nvidia-cuda-nvrtc nvidia-cuda-runtime`); no harnesslab install: the staged files
are imported from tools/gpu/ by name, as on a GPU host. Prints one table at the end; writes
$OUT/cuda_gpu.json when OUT is set.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "tools" / "gpu"  # the staged files by plain name (one flat folder on a GPU host)
sys.path[:0] = [str(GPU), str(GPU / "cuda_cpp")]

import harnesslab_cuda  # noqa: E402
import runner  # noqa: E402

TASKS = ["rmsnorm_gate", "softmax", "swiglu"]
# Correctness only (rows, dim): ragged widths, rows past the register paths, single rows, empty.
IRREGULAR = {
    "rmsnorm_gate": [(3, 1000), (5, 1001), (3, 3000), (2, 5120), (1, 4096), (0, 4096), (3, 20000),
                     (2, 65536), (33, 1024), (9, 2)],
    "softmax": [(7, 1000), (3, 1001), (3, 3000), (2, 40000), (2, 65536), (2, 100000), (5, 1),
                (0, 1024), (33, 1024), (9, 8)],
    "swiglu": [(3, 1000), (5, 1001), (5, 3000), (2, 14336), (1, 7), (0, 4096), (3, 3)],
}  # fmt: skip
SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def task_toml(task: str) -> dict[str, Any]:
    return tomllib.loads((ROOT / "tasks" / task / "task.toml").read_text())


def strategies(
    task: str, toml: dict[str, Any], extra: Sequence[str] = ()
) -> dict[str, tuple[Path, str]]:
    """The task's CUDA solution, Triton solution and CUDA baseline, then each `--extra`
    `TASK:NAME=FOLDER:FILE.py:FUNC` of this task (FOLDER relative to the repository)."""
    func = toml["entry"].split(":", 1)[1]
    sol = ROOT / "tasks" / task / "solutions"
    out = {
        "cuda:solution": (sol, f"cuda_{task}.py:{func}"),
        "triton:fast": (sol, f"fast.py:{func}"),
        "cuda:baseline": (ROOT / "tasks" / task / "workspace_cuda", f"kernel.py:{func}"),
    }
    for spec in extra:
        owner, _, rest = spec.partition(":")
        name, _, where = rest.partition("=")
        folder, _, entry = where.partition(":")
        if owner == task:
            out[name] = (ROOT / folder, entry)
    return out


def run_task(env: Any, task: str, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    toml = task_toml(task)
    req = {"reference": str(ROOT / "tasks" / task / "reference.py"),
           "tolerances": toml["tolerances"], "seed": 1234, "warmup": 10,
           "repeats": args.repeats, "case_timeout_s": 600, "entry": toml["entry"],
           "config_file": "kernel_config.json"}  # fmt: skip
    ev = runner.Evaluator(env, req)
    cases = [{"name": c["name"], "dtype": c["dtype"], "shape": c["shape"]}
             for c in toml["dev_cases"]]  # fmt: skip
    if args.quick:
        cases = cases[:3] + cases[-2:]
    rows, irregular = [], []
    for name, (folder, entry) in strategies(task, toml, args.extra).items():
        ev.req["entry"] = entry
        started = time.perf_counter()
        try:
            fn, cand_dir = ev.load_candidate(str(folder))
        except Exception as exc:  # reported as a row, never fatal
            rows.append({"task": task, "strategy": name, "case": "*", "passed": False,
                         "reason": f"import failed: {type(exc).__name__}: {exc}"[:300]})  # fmt: skip
            continue
        load_s = time.perf_counter() - started
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            res = ev.run_case(fn, case, i, cand_dir, timing=True)
            rows.append({"task": task, "strategy": name, "case": case["name"],
                         "dtype": case["dtype"], "load_s": load_s,
                         "wall_s": time.perf_counter() - t0,
                         **{k: res.get(k) for k in ("passed", "status", "reason", "median_us",
                                                    "p10_us", "p90_us", "pct_of_copy_bw", "gbps",
                                                    "timing_method", "samples",
                                                    "max_abs_err")}})  # fmt: skip
            print(f"  {task} {name:14} {case['name']:18} {res.get('status'):7} "
                  f"{_fmt(res.get('median_us'))} us {_fmt(res.get('pct_of_copy_bw'))}% "
                  f"{res.get('reason', '')[:80]}", flush=True)  # fmt: skip
        for dtype in toml["dtypes"]:
            for n, (r, d) in enumerate(IRREGULAR[task]):
                case = {"name": f"{r}x{d}_{SHORT[dtype]}", "dtype": dtype,
                        "shape": {"rows": r, "dim": d}}  # fmt: skip
                res = ev.run_case(fn, case, 1000 + n, cand_dir, timing=False)
                irregular.append({"task": task, "strategy": name, "case": case["name"],
                                  "passed": res["passed"], "reason": res.get("reason", "")})  # fmt: skip
    return rows, irregular


# -- NVRTC compile time per config ----------------------------------------------------------------


def _compile_job(job: tuple[str, str, list[str], dict[str, Any]]) -> float:
    src, arch, names, defines = job
    t0 = time.perf_counter()
    harnesslab_cuda._compiler().compile(
        src, name="kernel.cu", arch=arch, defines=defines, name_expressions=names
    )
    return time.perf_counter() - t0


def _noop(_: int) -> int:
    harnesslab_cuda._compiler()  # load the library in the worker before any timed job
    return os.getpid()


def compile_times(task: str, arch: str, workers: int, quick: bool) -> dict[str, Any]:
    """Every config of the task's CUDA launch space compiled as a sweep would (both dtypes in one
    NVRTC program, no cache): per config one after another, then all of them on `workers`
    processes (configs/min is what a sweep's compile phase could do)."""
    toml = task_toml(task)
    space = toml["languages"]["cuda"]["space"]
    configs = [dict(zip(space, vals, strict=True)) for vals in itertools.product(*space.values())]
    if quick:
        configs = configs[:8]
    ws = ROOT / "tasks" / task / "workspace_cuda"
    src = (ws / "kernel.cu").read_text()
    names = json.loads(
        re.search(r"NAMES = (\[.*?\])", (ws / "kernel.py").read_text()).group(1)  # type: ignore[union-attr]
    )
    jobs = [(src, arch, names, {k.upper(): v for k, v in c.items()}) for c in configs]
    serial = [_compile_job(j) for j in jobs]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(_noop, range(workers * 2)))  # workers started and warm
        t0 = time.perf_counter()
        list(pool.map(_compile_job, jobs))
        wall = time.perf_counter() - t0
    return {"task": task, "configs": len(configs), "median_s": statistics.median(serial),
            "p90_s": sorted(serial)[int(0.9 * (len(serial) - 1))], "serial_s": sum(serial),
            "serial_per_min": 60 * len(serial) / sum(serial), "workers": workers,
            "parallel_s": wall, "parallel_per_min": 60 * len(jobs) / wall}  # fmt: skip


# -- report --------------------------------------------------------------------------------------


def _fmt(v: Any, nd: int = 1) -> str:
    return f"{v:8.{nd}f}" if isinstance(v, int | float) else f"{'-':>8}"


def table(rows: list[dict], irregular: list[dict], compiles: list[dict], info: dict) -> str:
    out = [f"device {info.get('device')}  torch {info.get('torch')}  triton {info.get('triton')}"
           f"  NVRTC {info.get('nvrtc')}  arch {info.get('arch')}  copy {info.get('copy_gbps'):.0f} GB/s",
           "", f"{'task':13} {'case':18} | {'cuda:solution':>17} | {'triton:fast':>17} | "
           f"{'cuda:baseline':>17} | cuda/triton", f"{'':13} {'':18} | {'us':>8} {'%copy':>8} | "
           f"{'us':>8} {'%copy':>8} | {'us':>8} {'%copy':>8} |"]  # fmt: skip
    by = {(r["task"], r["case"], r["strategy"]): r for r in rows}
    for task, case in dict.fromkeys((r["task"], r["case"]) for r in rows if r["case"] != "*"):
        cells, med = [], {}
        for s in ("cuda:solution", "triton:fast", "cuda:baseline"):
            r = by.get((task, case, s), {})
            ok = r.get("passed")
            med[s] = r.get("median_us") if ok else None
            cells.append(f"{_fmt(med[s], 2)} {_fmt(r.get('pct_of_copy_bw') if ok else None)}"
                         if ok or not r else f"{'FAILED':>17}")  # fmt: skip
        ratio = (med["triton:fast"] / med["cuda:solution"]
                 if med["cuda:solution"] and med["triton:fast"] else None)  # fmt: skip
        out.append(f"{task:13} {case:18} | " + " | ".join(cells) + f" | {_fmt(ratio, 2)}")
    out += ["", "irregular shapes (correctness only): passed / total"]
    for key in dict.fromkeys((r["task"], r["strategy"]) for r in irregular):
        got = [r for r in irregular if (r["task"], r["strategy"]) == key]
        bad = [f"{r['case']}: {r['reason'][:60]}" for r in got if not r["passed"]]
        out.append(
            f"  {key[0]:13} {key[1]:14} {len(got) - len(bad)}/{len(got)}  {'; '.join(bad[:3])}"
        )
    failed = [r for r in rows if not r.get("passed")]
    for r in failed:
        out.append(
            f"  FAILED {r['task']} {r['strategy']} {r['case']}: {str(r.get('reason'))[:100]}"
        )
    if compiles:
        out += ["", "NVRTC compile per config (both dtypes, no cache): median / p90 s, configs/min "
                "one after another and on the pool"]  # fmt: skip
        for c in compiles:
            out.append(f"  {c['task']:13} {c['configs']:3} configs  {c['median_s']:.2f} / "
                       f"{c['p90_s']:.2f} s   {c['serial_per_min']:6.0f}/min serial   "
                       f"{c['parallel_per_min']:6.0f}/min on {c['workers']} processes")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="5 dev cases, 8 configs per task")
    ap.add_argument("--no-compile-times", action="store_true")
    ap.add_argument("--extra", action="append", default=[], metavar="TASK:NAME=FOLDER:FILE:FUNC",
                    help="one more strategy of TASK, e.g. rmsnorm_gate:cuda:packed="
                    "benchmarks/variants/rmsnorm_gate_cuda:packed.py:rmsnorm_gate")  # fmt: skip
    args = ap.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="hl-nvrtc-")  # a cold cache: first calls really compile
    harnesslab_cuda.configure(cache_dir=cache)
    env = runner.Env(interpret=False)
    if env.interpret:
        print("no CUDA GPU here: this benchmark needs one", file=sys.stderr)
        return 2
    cc = harnesslab_cuda._compiler()  # the library the launcher uses (torch's CUDA major first)
    info = {**env.info(), "copy_gbps": env.copy_gbps(), "arch": harnesslab_cuda.target_arch(),
            "nvrtc": f"{cc.version[0]}.{cc.version[1]} ({cc.path}; headers {cc.include_dir})"}  # fmt: skip
    rows: list[dict] = []
    irregular: list[dict] = []
    compiles: list[dict] = []
    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        print(f"{task}:", flush=True)
        r, irr = run_task(env, task, args)
        rows += r
        irregular += irr
    if not args.no_compile_times:
        for task in tasks:
            compiles.append(compile_times(task, info["arch"], args.workers, args.quick))
    report = table(rows, irregular, compiles, info)
    print("\n" + report)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "cuda_gpu.json"
        path.write_text(json.dumps({"info": info, "rows": rows, "irregular": irregular,
                                    "compile": compiles, "table": report}, indent=1, default=str))  # fmt: skip
        print(f"wrote {path}")
    return 0 if all(r.get("passed") for r in rows + irregular) else 1


if __name__ == "__main__":
    sys.exit(main())

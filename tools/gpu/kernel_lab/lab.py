"""Kernel lab, GPU side: every kernel task's strategies over its matrix, one results.json.

Self-contained like runner.py, whose timing and correctness it reuses (runner.py and ncu.py
are loaded by path from beside this file): standard library, torch and triton only, never
harnesslab. Strategies per
task: the workspace baseline, each reference solution (solutions/*.py), torch eager (the
reference module's `torch_eager`, else the fp32 reference cast back), torch.compile of it, and
the production peers (reference.PEERS: FLA, Liger, cuBLAS; "missing" where not importable).
Each (case, strategy) row is correctness-checked and timed once; on the cases that carry the
task's claims (task.toml [lab]) the solutions and the targets' comparators are timed `repeats`
times. Then Nsight Compute profiles the best harnesslab strategy of each task on those cases
(a subprocess of this script in --ncu-target mode), and --tune times each solution's
TUNE_SPACE variants. A step task (kind "step": a decode step over traces) is run by
lab_step.py beside this file instead: rows per trace and bucket, no ncu, no tuning. Usage:

    python lab.py --out DIR [--tasks a,b] [--quick] [--tune] [--budget-s 330]
    python lab.py --ncu-target TASK --strategy NAME --cases a,b     (what ncu runs)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run as a script from the repository's tools/ folder, sys.path[0] is tools/, whose profile.py
# shadows the standard library's (torch imports cProfile): drop it before torch is imported.
if sys.path and Path(sys.path[0] or ".").resolve() == HERE and (HERE / "profile.py").exists():
    del sys.path[0]
SCHEMA = "harnesslab.lab/1"
HARNESS = ("baseline", "sol:")  # strategy-name prefixes that are this toolkit's kernels
NCU_RESERVE_S = 15.0  # per task, kept out of the matrix's share of --budget-s
ROW_KEYS = (
    "passed", "status", "reason", "median_us", "p10_us", "p90_us", "spread", "host_us",
    "launch_overhead_us", "gbps", "pct_of_copy_bw", "timing_method", "calls_per_sample",
    "samples", "bytes", "max_abs_err",
)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# task tables (also imported by the host-side report: no torch at module level)


def read_task(root: Path) -> dict[str, Any]:
    data = tomllib.loads((root / "task.toml").read_text())
    data["root"] = str(root)
    return data


LAB_KINDS = ("kernel", "step")  # tools/task/kinds.py: the kinds whose in_lab is True


def list_lab_tasks(tasks_root: Path) -> list[str]:
    names = []
    for p in sorted(tasks_root.iterdir()):
        if (p / "task.toml").is_file() and read_task(p).get("kind") in LAB_KINDS:
            names.append(p.name)
    return names


def case_name(shape: dict[str, int], dtype: str) -> str:
    short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
    return "x".join(str(v) for v in shape.values()) + f"_{short}"


def lab_cases(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The matrix: [lab].cases when given, else the dev cases."""
    raw = task.get("lab", {}).get("cases") or task.get("dev_cases", [])
    out = []
    for c in raw:
        shape = {k: int(v) for k, v in c["shape"].items()}
        out.append({"name": c.get("name") or case_name(shape, c["dtype"]), "dtype": c["dtype"],
                    "shape": shape})  # fmt: skip
    return out


def elements(case: dict[str, Any]) -> int:
    return math.prod(case["shape"].values())


def target_cases(task: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """Cases a target is judged on: its own list, else the large ones ([lab].min_elements)."""
    cases = lab_cases(task)
    if target.get("cases"):
        return [c["name"] for c in cases if c["name"] in target["cases"]]
    floor = int(task.get("lab", {}).get("min_elements", 0))
    return [c["name"] for c in cases if elements(c) >= floor]


def claim_cases(task: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for t in task.get("lab", {}).get("targets", []):
        names += [n for n in target_cases(task, t) if n not in names]
    return names


def comparators(task: dict[str, Any]) -> list[str]:
    return sorted({t["vs"] for t in task.get("lab", {}).get("targets", []) if t.get("vs")})


# ----------------------------------------------------------------------------------------------
# GPU side


def load_sibling(name: str):
    """runner.py, ncu.py or lab_step.py from beside this file, by path (never from sys.path)."""
    if f"_hl_lab_{name}" in sys.modules:
        return sys.modules[f"_hl_lab_{name}"]
    spec = importlib.util.spec_from_file_location(f"_hl_lab_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[f"_hl_lab_{name}"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def load_runner():
    return load_sibling("runner")


def _evaluator(runner, env, task: dict[str, Any]):
    req = {
        "reference": str(Path(task["root"]) / "reference.py"),
        "tolerances": task["tolerances"],
        "seed": 1234,
        "warmup": 10,
        "repeats": 30,
        "case_timeout_s": 600,
        "entry": task["entry"],
        "config_file": task.get("config_file", ""),
    }
    return runner.Evaluator(env, req)


def strategies(
    ev, task: dict[str, Any], interpret: bool, no_compile: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """name -> callable, and name -> import error for those that failed to load."""
    root, func = Path(task["root"]), task["entry"].split(":", 1)[1]
    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}
    sources = [("baseline", root / "workspace", task["entry"])]
    sources += [(f"sol:{p.stem}", p.parent, f"{p.name}:{func}")
                for p in sorted((root / "solutions").glob("*.py")) if not p.name.startswith("_")]  # fmt: skip
    for name, folder, entry in sources:
        if interpret and name.startswith("sol:cuda_"):  # the lab's CUDA column needs a GPU
            errors[name] = "skipped: a CUDA C++ solution runs only on a GPU"
            continue
        ev.req["entry"] = entry
        try:
            fns[name], _ = ev.load_candidate(str(folder))
        except Exception as exc:  # reported per row, never fatal
            errors[name] = f"import failed: {type(exc).__name__}: {exc}"[:300]
    ev.req["entry"] = task["entry"]
    ref = ev.ref
    eager = getattr(ref, "torch_eager", None)
    if eager is None:

        def eager(*args, **kwargs):
            return ref.reference(*args, **kwargs).to(ref.output_spec(*args, **kwargs)[1])

    fns["torch_eager"] = eager
    # Peers: production kernels users would pick instead (reference.PEERS). One that cannot be
    # imported still gets its rows, as "missing": never dropped from the matrix or the claims.
    for peer, (package, factory) in (getattr(ref, "PEERS", None) or {}).items():
        try:
            fns[f"peer:{peer}"] = factory()
        except Exception as exc:  # ImportError, or whatever its import raised on this host
            errors[f"peer:{peer}"] = (
                f"missing: {package} not importable here ({type(exc).__name__}: {exc})"[:300]
            )
    if interpret or no_compile:
        why = "the Triton interpreter" if interpret else "--no-compile"
        errors["torch_compile"] = f"skipped: torch.compile is not run ({why})"
    else:
        import torch

        torch._dynamo.reset()
        for knob in ("recompile_limit", "cache_size_limit"):  # one recompile per shape/dtype
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        fns["torch_compile"] = torch.compile(eager, dynamic=False)
    return fns, errors


def _row(task: str, strategy: str, case: dict[str, Any], ref, res: dict[str, Any]) -> dict:
    shape = res.get("shape") or case["shape"]  # the interpreter runs a scaled-down shape
    row = {"task": task, "strategy": strategy, "case": case["name"], "dtype": case["dtype"],
           "shape": shape, **{k: res.get(k) for k in ROW_KEYS}}  # fmt: skip
    flops = int(ref.flops(shape)) if hasattr(ref, "flops") else None
    med = row.get("median_us")
    row["flops"] = flops
    row["tflops"] = flops / (med * 1e6) if flops and med else None
    return row


def is_step(task: dict[str, Any]) -> bool:
    return task.get("kind") == "step"


def run_task(runner, env, task: dict[str, Any], args, deadline: float) -> dict[str, Any]:
    if is_step(task):  # a decode step over its traces: lab_step.py, the same rows and summary
        done = load_sibling("lab_step").run_task(runner, env, task, args, deadline)
        summary = done["summary"]
        summary["best_strategy"] = best_strategy(done["rows"], summary["claim_cases"])
        return done
    ev = _evaluator(runner, env, task)
    torch = env.torch
    fns, errors = strategies(ev, task, env.interpret, args.no_compile)
    names = [n for n in fns] + [n for n in errors if n not in fns]
    cases = lab_cases(task)
    claims = claim_cases(task)
    if args.quick:  # the smallest case and up to 4 claim cases spread over the claim list
        small = min(cases, key=elements)
        picks = {claims[round(i * (len(claims) - 1) / 3)] for i in range(4)} if claims else set()
        cases = [small] + [c for c in cases if c["name"] in picks and c is not small]
    repeat_set = {n for n in names if n.startswith("sol:")} | set(comparators(task))
    rows = []
    for idx, case in enumerate(cases):
        for name in names:
            if name in errors:
                res = {"passed": False, "status": error_status(errors[name]),
                       "reason": errors[name]}  # fmt: skip
            elif time.monotonic() > deadline:
                res = {"passed": False, "status": "skipped", "reason": "skipped: time budget"}
            else:
                res = ev.run_case(fns[name], case, idx, "", timing=True)
            row = _row(task["name"], name, case, ev.ref, res)
            medians = [row["median_us"]] if row["median_us"] else []
            repeat = (row["passed"] and name in repeat_set and case["name"] in claims
                      and not env.interpret)  # fmt: skip
            for _ in range(args.repeats - 1 if repeat else 0):
                dtype = runner.dtype_of(torch, case["dtype"])
                medians.append(ev.time_case(fns[name], case["shape"], dtype, idx)["median_us"])
            row["repeat_medians_us"] = medians
            row["repeat_spread"] = (
                (max(medians) - min(medians)) / statistics.median(medians) if medians else None
            )
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("task", "strategy", "case", "status",
                  "median_us", "pct_of_copy_bw", "tflops")}), flush=True)  # fmt: skip
    return {
        "rows": rows,
        "summary": {
            "metric": task.get("lab", {}).get("metric", "bandwidth"),
            "strategies": names,
            "strategy_errors": errors,
            "cases": [c["name"] for c in cases],
            "claim_cases": [n for n in claims if any(c["name"] == n for c in cases)],
            "targets": [
                {**t, "cases": target_cases(task, t)}
                for t in task.get("lab", {}).get("targets", [])
            ],
            "best_strategy": best_strategy(rows, claims),
            "peers": peer_summary(rows, errors, getattr(ev.ref, "PEERS", None) or {}),
        },
    }


def error_status(message: str) -> str:
    """The row status of a strategy that never ran: skipped, missing (a peer's package), error."""
    if message.startswith("missing"):
        return "missing"
    return "skipped" if "skipped" in message else "error"


def peer_summary(rows: list[dict[str, Any]], errors: dict[str, str], peers: dict) -> dict:
    """Each peer's standing in this run: ok, missing (not importable), or failed (wrong output
    or an error on some case), with the package and the first reason."""
    out: dict[str, dict[str, Any]] = {}
    for peer, (package, _) in peers.items():
        name = f"peer:{peer}"
        mine = [r for r in rows if r["strategy"] == name]
        bad = [r for r in mine if not r["passed"] and r["status"] != "skipped"]
        if name in errors:
            out[name] = {"package": package, "status": "missing", "reason": errors[name]}
        elif bad:
            out[name] = {"package": package, "status": "failed",
                         "reason": f"{len(bad)} of {len(mine)} cases: {bad[0]['case']}: "
                                   f"{bad[0].get('reason') or bad[0]['status']}"[:300]}  # fmt: skip
        else:
            out[name] = {"package": package, "status": "ok", "reason": ""}
    return out


def best_strategy(rows: list[dict[str, Any]], claims: list[str]) -> str | None:
    """The harnesslab strategy with the lowest geomean time over the claim cases (all cases when
    there are none), among those that passed every case."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["strategy"].startswith(HARNESS):
            by.setdefault(r["strategy"], []).append(r)
    scored = []
    for name, rs in by.items():
        if not rs or not all(r["passed"] for r in rs):
            continue
        chosen = [r for r in rs if r["case"] in claims] or rs
        mean = load_runner().scores.geomean([r["median_us"] for r in chosen])
        if mean is not None:
            scored.append((mean, name))
    return min(scored)[1] if scored else None


# ----------------------------------------------------------------------------------------------
# Nsight Compute (the profiler plumbing is tools/gpu/ncu.py; this side is the profiled target)


def run_ncu(task: dict[str, Any], summary: dict[str, Any], args, out: Path, budget_s: float):
    """Profile the task's best strategy on its claim cases (a subprocess of this script under
    ncu, --ncu-target mode); launches are attributed to cases in order."""
    strategy = summary.get("best_strategy")
    cases = summary["claim_cases"][:6] or summary["cases"][-2:]
    target = [sys.executable, str(Path(__file__).resolve()), "--ncu-target", task["name"],
              "--strategy", str(strategy), "--cases", ",".join(cases), "--calls",
              str(args.ncu_calls), "--tasks-root", str(args.tasks_root), "--interpret",
              args.interpret]  # fmt: skip
    record: dict[str, Any] = {"strategy": strategy, "cases": cases, "calls": args.ncu_calls}
    if strategy is None:
        return {**record, "error": "not profiled: no passing strategy"}
    ncu = load_sibling("ncu")
    tensor = summary["metric"] == "tflops"
    log = out / f"ncu_{task['name']}.csv"
    return record | ncu.profile(target, cases, args.ncu_calls, log, budget_s, tensor=tensor)


def ncu_target(args) -> int:
    """Under ncu: warm up (compile, autotune) outside the profiled window, then `calls` launches
    per case between cudaProfilerStart/Stop, cases in the order given."""
    runner = load_runner()
    env = runner.Env(interpret=args.interpret == "always")
    torch = env.torch
    task = read_task(Path(args.tasks_root) / args.ncu_target)
    ev = _evaluator(runner, env, task)
    fns, _ = strategies(ev, task, interpret=False)
    fn = fns[args.strategy]
    by_name = {c["name"]: c for c in lab_cases(task)}
    gpu = env.device == "cuda"  # on a CPU (tests) the same path runs without the profiler
    for name in args.cases.split(","):
        case = by_name[name]
        shape = ev.case_shape(case)
        a, kw = ev.make(shape, runner.dtype_of(torch, case["dtype"]), salt=7)
        for _ in range(2):
            fn(*a, **kw)
        env.sync()
        if gpu:
            torch.cuda.profiler.start()
        for _ in range(args.calls):
            fn(*a, **kw)
        env.sync()
        if gpu:
            torch.cuda.profiler.stop()
        print(json.dumps({"ncu_case": name, "calls": args.calls}), flush=True)
        del a, kw
    return 0


# ----------------------------------------------------------------------------------------------
# tuning: each solution's TUNE_SPACE (`config` dicts) on its TUNE_CASES (default: claim cases)


def run_tuning(runner, env, task: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    ev = _evaluator(runner, env, task)
    fns, _ = strategies(ev, task, interpret=True)  # no torch.compile needed here
    by_name = {c["name"]: c for c in lab_cases(task)}
    out: list[dict[str, Any]] = []
    for name, fn in fns.items():
        found = getattr(fn, "__globals__", {}) if name.startswith("sol:") else {}
        wanted = found.get("TUNE_CASES") or claim_cases(task)[:3]
        cases = [by_name[n] for n in wanted if n in by_name]
        for config in found.get("TUNE_SPACE") or []:
            for idx, case in enumerate(cases):
                if time.monotonic() > deadline:
                    return out
                res = ev.run_case(lambda *a, _f=fn, _c=config, **k: _f(*a, config=_c, **k), case, idx,
                                  "", timing=True)  # fmt: skip
                row = _row(task["name"], name, case, ev.ref, res)
                out.append({**row, "config": config})
                print(json.dumps({k: out[-1][k] for k in ("strategy", "case", "config", "status",
                      "median_us", "pct_of_copy_bw", "tflops")}), flush=True)  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def print_table(results: dict[str, Any]) -> None:
    info = results["info"]
    print(f"\n{info['device']}  torch {info['torch']}  triton {info['triton']}  copy "
          f"{info.get('copy_gbps') or 0:.0f} GB/s  meaningful={info['meaningful']}  "
          f"wall {results.get('wall_s', 0):.0f}s {({k: round(v) for k, v in results.get('phases_s', {}).items()})}")  # fmt: skip
    for name, t in results["tasks"].items():
        rows = [r for r in results["rows"] if r["task"] == name]
        col = {"tflops": "tflops", "latency": "p95_us"}.get(t["metric"], "pct_of_copy_bw")
        print(f"== {name} (best: {t['best_strategy']}; us/{col})")
        print("case".ljust(22) + "".join(s[:13].rjust(14) for s in t["strategies"]))
        for case in t["cases"]:
            cells = []
            for s in t["strategies"]:
                r = next((r for r in rows if r["case"] == case and r["strategy"] == s), None)
                if r is None or not r["passed"] or r["median_us"] is None:
                    cells.append((r["status"] if r else "-")[:12].rjust(14))
                else:
                    v = r.get(col)
                    cells.append(f"{r['median_us']:.1f}/{v or 0:.0f}".rjust(14))
            print(case[:21].ljust(22) + "".join(cells))
        nc: dict[str, Any] = results.get("ncu", {}).get(name) or {}
        if nc:
            print(
                f"   ncu {nc.get('strategy')}: {nc.get('error') or str(len(nc.get('by_case', {}))) + ' cases profiled'}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for results.json and ncu logs")
    ap.add_argument(
        "--tasks", help="comma-separated task names (default: every kernel and step task)"
    )
    ap.add_argument("--tasks-root", type=Path, default=HERE.parent / "tasks")
    ap.add_argument("--repeats", type=int, default=3, help="measurements of each claim row")
    ap.add_argument("--quick", action="store_true", help="the smallest case and 4 claim cases")
    ap.add_argument(
        "--max-cases",
        type=int,
        default=0,
        help="first N cases per task (traces of a step task; 0: all)",
    )
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile strategy")
    ap.add_argument("--ncu-calls", type=int, default=3)
    ap.add_argument("--tune", action="store_true", help="time each solution's TUNE_SPACE")
    ap.add_argument("--tune-s", type=float, default=90.0, help="seconds kept for --tune")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new work after")
    ap.add_argument("--interpret", choices=["auto", "always", "never"], default="auto")
    ap.add_argument("--ncu-target", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ncu_target:
        return ncu_target(args)
    if args.out is None:
        ap.error("--out is required")
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    runner = load_runner()
    interpret = args.interpret == "always"
    if args.interpret == "auto":
        import torch

        interpret = not torch.cuda.is_available()
    env = runner.Env(interpret)
    names = args.tasks.split(",") if args.tasks else list_lab_tasks(args.tasks_root)
    info = env.info() | {"copy_gbps": env.copy_gbps(), "date": time.strftime("%Y-%m-%d"),
                         "argv": sys.argv[1:]}  # fmt: skip
    if not env.interpret:
        props = env.torch.cuda.get_device_properties(0)
        info |= {"sm_count": props.multi_processor_count, "l2_bytes": env.l2_bytes}
    results: dict[str, Any] = {"schema": SCHEMA, "info": info, "tasks": {}, "rows": [],
                               "ncu": {}, "tuning": []}  # fmt: skip
    ncu_on = not (args.no_ncu or env.interpret)
    tune_s = args.tune_s if args.tune else 0.0
    ncu_end = started + args.budget_s - tune_s
    # Room for the profiler: ~10 s per task on an H100 (process start, warm-up, replay), at most
    # a third of the time left after tuning so that a short budget still measures the matrix.
    tasks = {n: read_task(args.tasks_root / n) for n in names}
    kernels = {n: t for n, t in tasks.items() if not is_step(t)}  # what ncu and --tune take
    reserve = min(NCU_RESERVE_S * len(kernels), (args.budget_s - tune_s) / 3) if ncu_on else 0.0
    matrix_deadline = ncu_end - reserve
    phases = results["phases_s"] = {}
    for name, task in tasks.items():
        if args.max_cases and not is_step(task):
            task.setdefault("lab", {})["cases"] = lab_cases(task)[: args.max_cases]
        done = run_task(runner, env, task, args, matrix_deadline)
        results["rows"] += done["rows"]
        results["tasks"][name] = done["summary"]
        results["wall_s"] = phases["matrix"] = time.monotonic() - started
        write_json(args.out / "results.json", results)
    if ncu_on:
        for i, (name, task) in enumerate(kernels.items()):
            share = max(0.0, (ncu_end - time.monotonic()) / (len(kernels) - i))
            results["ncu"][name] = run_ncu(task, results["tasks"][name], args, args.out, share)
            write_json(args.out / "results.json", results)
        phases["ncu"] = time.monotonic() - started - phases["matrix"]
    if args.tune:
        for task in kernels.values():
            results["tuning"] += run_tuning(runner, env, task, started + args.budget_s)
            write_json(args.out / "results.json", results)
        phases["tune"] = time.monotonic() - started - sum(phases.values())
    results["wall_s"] = time.monotonic() - started
    write_json(args.out / "results.json", results)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rmsnorm_gate: the shipped solution, its candidate variants and the peers on one GPU, in one
call of under 4 minutes on an H100 (issue 30, item 4). Prints one table last; every phase writes
OUT/rmsnorm_variants.json as it goes.

    python benchmarks/rmsnorm_variants_gpu.py --out DIR [--budget-s 220] [--parts ...]
    python benchmarks/rmsnorm_variants_gpu.py --out DIR --dry-run      (CPU: interpreter, tiny)

Needs torch and triton; FLA (fla-core) and Liger (liger-kernel) where importable (else their
columns say `missing`), e.g. from the wheels benchmarks/perf_gpu.sh installs (its `variants`
part runs this script). Strategies: `fast` (tasks/rmsnorm_gate/solutions/fast.py), every
benchmarks/variants/rmsnorm_gate/v*.py, `fla` (rms_norm_gated, the lab's peer), `liger` (Liger
has no fused gated RMSNorm: its rms_norm in fp32 "gemma" mode, then its silu_mul, two kernels
with an fp16/bf16 intermediate, what a Liger user would write) and `compile` (torch.compile of
the fp32 reference, the lab's). Parts, in order, each under its own deadline:
  warm     compile our kernels (fast, variants, every swept num_warps) and Liger's in parallel
           worker processes sharing one Triton cache, so the timed phases load binaries (FLA's
           autotuner and torch.compile are left to the main process: they time themselves)
  check    fast and every variant against the task's reference: every reference probe and the
           verifier's edge cases (reference.edge_cases, rows capped) of each timed shape
  time     every strategy on the lab's shapes, HarnessGym's four final cases and two more widths
           of the final domain, through tools/gpu/timing.py, the one timing implementation (the
           lab's Evaluator.run_case: correctness, then timing); --repeats measurements each
  compile  torch.compile on the same shapes (last: it is already in the lab report)
  sweep    the leading variant with num_warps 2..16 (32 at 8192) on every timed shape
  ncu      Nsight Compute on the leader, fast and FLA on two shapes (DRAM throughput; the
           lab's parser, tools/gpu/ncu.py)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK_DIR = ROOT / "tasks" / "rmsnorm_gate"
VARIANTS = ROOT / "benchmarks" / "variants" / "rmsnorm_gate"
OURS_FIRST = "fast"
PEERS = ("fla", "liger")
HG_CASES = ((1536, 1024), (896, 2048), (448, 4096), (192, 8192))  # HarnessGym's finals, fp16
DOMAIN_CASES = ((4096, 6144, "bfloat16"), (8192, 1536, "float16"))  # final-domain widths
NCU_CASES = ("8192x3000_bf16", "4096x5120_fp16")
DTYPES = ("float16", "bfloat16")
# Correctness only: an empty batch, one row, rows with no vector width dividing them.
ODD_SHAPES = ((0, 4096, "float16"), (1, 8192, "bfloat16"), (7, 6143, "float16"),
              (33, 2999, "bfloat16"), (5, 8191, "float16"), (3, 1535, "bfloat16"))  # fmt: skip
WARPS = (2, 4, 8, 16, 32)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def kernel_files() -> dict[str, Path]:
    """Our strategies: fast.py and the variants, name -> file."""
    files = {OURS_FIRST: TASK_DIR / "solutions" / "fast.py"}
    files |= {p.stem: p for p in sorted(VARIANTS.glob("v*.py"))}
    return files


def timed_cases(lab) -> list[dict[str, Any]]:
    task = lab.read_task(TASK_DIR)
    cases = [{**c, "group": "lab"} for c in lab.lab_cases(task)]
    extra = [(r, d, "float16", "hg") for r, d in HG_CASES]
    extra += [(r, d, dt, "domain") for r, d, dt in DOMAIN_CASES]
    for rows, dim, dtype, group in extra:
        shape = {"rows": rows, "dim": dim}
        cases.append({"name": lab.case_name(shape, dtype), "dtype": dtype, "shape": shape,
                      "group": group})  # fmt: skip
    # Most wanted first, should the budget run out: the shapes where FLA led, then
    # HarnessGym's four, then the rest in the lab's order.
    first = [*NCU_CASES, "4096x8192_bf16", "4096x8192_fp16"]
    return sorted(cases, key=lambda c: (c["name"] not in first, c["group"] != "hg"))


def liger_composite():
    """Liger's RMSNorm (fp32 math, "gemma" casting) then its SiLU-mul: y = silu(gate) * norm."""
    from liger_kernel.ops.rms_norm import rms_norm_forward
    from liger_kernel.ops.swiglu import swiglu_forward

    def run(x, gate, weight, eps=1e-5):
        normed = rms_norm_forward(x, weight, eps, 0.0, "gemma", None)[0]
        return swiglu_forward(gate, normed)[2]

    return run


def block_of(dim: int) -> int:
    return 1 << max(0, (dim - 1).bit_length())


def sweep_warps(dim: int, interpret: bool) -> list[int]:
    warps = [w for w in WARPS if w <= 16 or block_of(dim) >= 8192]
    return warps[1:3] if interpret else warps


# ----------------------------------------------------------------------------------------------
# warm: parallel compiles into the shared Triton cache


def warm_worker(job_file: str) -> int:
    """Call each job's kernel once on a real-width input (what decides the compile)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run, interpreted
    done = 0
    for job in json.loads(Path(job_file).read_text()):
        try:
            if job["strategy"] == "liger":
                fn = liger_composite()
            else:
                fn = _load(Path(job["file"]), f"_warm_{job['strategy']}").rmsnorm_gate
            dtype = getattr(torch, job["dtype"])
            x = torch.randn(job["rows"], job["dim"], device=device).to(dtype)
            w = torch.ones(job["dim"], device=device, dtype=dtype)
            kw = {"config": job["config"]} if job.get("config") else {}
            fn(x, x.clone(), w, **kw)
            if device == "cuda":
                torch.cuda.synchronize()
            done += 1
        except Exception as exc:  # a job that fails compiles in the main process instead
            print(f"warm: {job['strategy']} {job['dim']}: {type(exc).__name__}: {exc}"[:300])
    print(json.dumps({"warmed": done}))
    return 0


def warm(
    files: dict[str, Path],
    cases: list[dict[str, Any]],
    jobs: int,
    limit_s: float,
    *,
    tiny: bool,
    liger: bool,
) -> dict:
    swept = {(c["shape"]["dim"], c["dtype"]) for c in cases}  # the sweep's widths
    keys = sorted(swept)
    if not tiny:  # the reference probes' widths and the odd shapes of the check
        keys += [(w, d) for w in (1001, 1024, 2048, 3000, 4096, 8192) for d in DTYPES]
        keys += [(dim, d) for _, dim, d in ODD_SHAPES]
    todo: list[dict[str, Any]] = []
    name0 = next(iter(files), None)
    for dim, dtype in sorted(set(keys)):
        base = {"rows": 4, "dim": dim, "dtype": dtype}
        if liger:
            todo.append({**base, "strategy": "liger"})
        if tiny and name0 is not None:  # a dry run proves the worker's path: one job a kind
            todo.append({**base, "strategy": name0, "file": str(files[name0]),
                         "config": {"num_warps": 4}})  # fmt: skip
            continue
        for name, path in files.items():
            todo.append({**base, "strategy": name, "file": str(path)})
            if (dim, dtype) in swept:
                todo += [{**base, "strategy": name, "file": str(path), "config": {"num_warps": w}}
                         for w in sweep_warps(dim, False)]  # fmt: skip
    n = max(1, min(jobs, len(todo)))
    tmp = Path(tempfile.mkdtemp(prefix="hl_rmsv_warm_"))
    procs = []
    for i in range(n):  # output to files: a full pipe would stall a worker nobody reads yet
        (tmp / f"{i}.json").write_text(json.dumps(todo[i::n]))
        with (tmp / f"{i}.log").open("w") as log:
            argv = [sys.executable, __file__, "--warm-worker", str(tmp / f"{i}.json")]
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    started, warmed, killed = time.monotonic(), 0, 0
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, limit_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed += 1
        for line in (tmp / f"{i}.log").read_text(errors="replace").splitlines():
            if line.startswith('{"warmed"'):
                warmed += json.loads(line)["warmed"]
            elif line.startswith("warm:"):
                print(line)
    return {"jobs": len(todo), "warmed": warmed, "workers": n, "killed": killed,
            "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# check: probes and the verifier's edge cases


def check(
    ctx, fns: dict[str, Any], cases: list[dict[str, Any]], deadline: float, extra: tuple = ()
) -> dict:
    """`extra`: more (label, dtype name, thunk making (args, kwargs)) inputs."""
    runner, ev, torch = ctx["runner"], ctx["ev"], ctx["torch"]
    inputs = list(extra)  # (label, dtype name, thunk making (args, kwargs))
    for dt in DTYPES:
        for name, probe in ev.ref.PROBES.items():
            # probes draw from a CPU generator, as diagnostics.probe gives them
            inputs.append((f"probe:{name}", dt, lambda p=probe, d=dt: p(
                runner.dtype_of(torch, d), ev.env.device, _gen(ctx, 1, "cpu"))))  # fmt: skip
    for rows, dim, dt in ODD_SHAPES:
        inputs.append((f"odd:{rows}x{dim}", dt, lambda r=rows, d=dim, t=dt: ev.ref.make_inputs(
            {"rows": r, "dim": d}, runner.dtype_of(torch, t), ev.env.device, _gen(ctx, 3))))  # fmt: skip
    for c in cases:
        shape = {**ev.case_shape(c), "rows": min(ev.case_shape(c)["rows"], 512)}
        edges = ev.ref.edge_cases(shape, runner.dtype_of(torch, c["dtype"]), ev.env.device,
                                  _gen(ctx, 2))  # fmt: skip
        inputs += [(f"edge:{c['name']}:{label}", c["dtype"], lambda a=a: a) for label, a in edges]
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        failures, ran = [], 0
        for label, dt, make in inputs:
            if time.monotonic() > deadline:
                failures.append("skipped: time budget")
                break
            args, kwargs = make()
            ran += 1
            try:
                with runner.deadline(60):
                    got = fn(*args, **kwargs)
                    ev.env.sync()
                expected = ev.ref.reference(*args, **kwargs)
                shape, dtype = ev.ref.output_spec(*args, **kwargs)
                ok, reason, _ = runner.compare(torch, got, expected, ev.tolerances[dt], shape,
                                               dtype, args)  # fmt: skip
            except Exception as exc:
                ok, reason = False, f"{type(exc).__name__}: {exc}"[:300]
            if not ok:
                failures.append(f"{label} {dt}: {reason}"[:400])
        out[name] = {"inputs": ran, "passed": not failures, "failures": failures[:10]}
        print(
            f"check {name}: {ran} inputs, {'passed' if not failures else failures[0]}", flush=True
        )
    return out


def _gen(ctx, salt: int, device: str | None = None):
    g = ctx["torch"].Generator(device=device or ctx["ev"].env.device)
    g.manual_seed(4321 + salt)
    return g


# ----------------------------------------------------------------------------------------------
# time, compile, sweep


def time_row(ctx, name: str, fn, case: dict[str, Any], idx: int, repeats: int) -> dict:
    runner, ev = ctx["runner"], ctx["ev"]
    res = ev.run_case(fn, case, idx, "", timing=True)
    row = {"strategy": name, "case": case["name"], "group": case["group"], "dtype": case["dtype"],
           **{k: res.get(k) for k in ("passed", "status", "reason", "median_us", "p10_us",
              "p90_us", "spread", "pct_of_copy_bw", "timing_method", "samples")}}  # fmt: skip
    medians = [row["median_us"]] if row["median_us"] else []
    if row["passed"] and not ctx["interpret"]:
        dtype = runner.dtype_of(ctx["torch"], case["dtype"])
        for _ in range(repeats - 1):
            medians.append(ev.time_case(fn, ev.case_shape(case), dtype, idx)["median_us"])
    row["repeat_medians_us"] = medians
    if medians:  # the figure the table uses: the median over the separate measurements
        ratio = (row["pct_of_copy_bw"] or 0.0) * (row["median_us"] or 0.0)
        row["median_us"] = statistics.median(medians)
        row["pct_of_copy_bw"] = ratio / row["median_us"] if row["median_us"] else None
    print(json.dumps({k: row[k] for k in ("strategy", "case", "status", "median_us",
                      "pct_of_copy_bw")}), flush=True)  # fmt: skip
    return row


def time_all(ctx, fns, cases, names, deadline: float, repeats: int, results: dict) -> None:
    """Shape by shape; the strategy order rotates per shape so none is always first."""
    for idx, case in enumerate(cases):
        order = names[idx % len(names) :] + names[: idx % len(names)]
        for name in order:
            if name in ctx["errors"]:
                results["rows"].append({"strategy": name, "case": case["name"], "group":
                    case["group"], "passed": False,
                    "status": ctx["lab"].error_status(ctx["errors"][name]),
                    "reason": ctx["errors"][name]})  # fmt: skip
            elif time.monotonic() > deadline:
                results["rows"].append({"strategy": name, "case": case["name"], "group":
                    case["group"], "passed": False, "status": "skipped",
                    "reason": "skipped: time budget"})  # fmt: skip
            else:
                results["rows"].append(time_row(ctx, name, fns[name], case, idx, repeats))
        write_json(ctx["out"], results)


def leader(results: dict, ours: list[str]) -> str | None:
    """Our strategy (fast or a variant) with the lowest geomean time over the timed shapes,
    among those that passed the check and every timed row."""
    scored = []
    for name in ours:
        rows = [r for r in results["rows"] if r["strategy"] == name]
        if not rows or not all(r.get("passed") for r in rows):
            continue
        if not results.get("check", {}).get(name, {}).get("passed", True):
            continue
        g = geomean([r["median_us"] for r in rows])
        if g is not None:
            scored.append((g, name))
    return min(scored)[1] if scored else None


def geomean(values: list[float | None]) -> float | None:
    xs = [v for v in values if v]
    return statistics.geometric_mean(xs) if xs else None


def sweep(ctx, fn, cases, deadline: float) -> list[dict[str, Any]]:
    runner, ev, torch = ctx["runner"], ctx["ev"], ctx["torch"]
    out = []
    for idx, case in enumerate(cases):
        shape = ev.case_shape(case)
        for w in sweep_warps(shape["dim"], ctx["interpret"]):
            if time.monotonic() > deadline:
                return out
            try:
                with runner.deadline(60):
                    t = ev.time_case(lambda *a, _w=w, **k: fn(*a, config={"num_warps": _w}, **k),
                                     shape, runner.dtype_of(torch, case["dtype"]), idx)  # fmt: skip
                out.append({"case": case["name"], "num_warps": w, "median_us": t["median_us"],
                            "pct_of_copy_bw": t["pct_of_copy_bw"]})  # fmt: skip
            except Exception as exc:
                out.append({"case": case["name"], "num_warps": w, "error": str(exc)[:200]})
    return out


# ----------------------------------------------------------------------------------------------
# ncu


def ncu_part(ctx, names: list[str], out: Path, budget_s: float) -> dict:
    ncu = ctx["lab"].load_sibling("ncu")
    labels = [f"{n}@{c}" for c in NCU_CASES for n in names]
    target = [sys.executable, __file__, "--ncu-target", ",".join(labels), "--calls", "3"]
    return ncu.profile(target, labels, 3, out / "ncu_rmsnorm_variants.csv", budget_s, tensor=False)


def ncu_target(labels: list[str], calls: int, interpret: bool) -> int:
    """Under ncu: warm each (strategy, case) up outside the profiled window, then `calls`
    launches of it between cudaProfilerStart/Stop, in the order given."""
    ctx = context(interpret)
    torch, ev = ctx["torch"], ctx["ev"]
    by_name = {c["name"]: c for c in timed_cases(ctx["lab"])}
    gpu = ev.env.device == "cuda"
    for label in labels:
        name, case_name = label.split("@", 1)
        fn, case = ctx["fns"][name], by_name[case_name]
        a, kw = ev.make(ev.case_shape(case), ctx["runner"].dtype_of(torch, case["dtype"]), salt=7)
        for _ in range(2):
            fn(*a, **kw)
        ev.env.sync()
        if gpu:
            torch.cuda.profiler.start()
        for _ in range(calls):
            fn(*a, **kw)
        ev.env.sync()
        if gpu:
            torch.cuda.profiler.stop()
        print(json.dumps({"ncu_case": label, "calls": calls}), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------


def context(interpret: bool, no_compile: bool = True) -> dict[str, Any]:
    gpu = _load(ROOT / "tools" / "gpu" / "__init__.py", "_hl_gpu")  # needs only pathlib
    flat = gpu.copy_flat(Path(tempfile.mkdtemp(prefix="hl_rmsv_lab_")), gpu.LAB)  # as staged
    lab = _load(flat / "lab.py", "_hl_lab_gpu")
    runner = lab.load_runner()
    env = runner.Env(interpret)
    task = lab.read_task(TASK_DIR)
    ev = lab._evaluator(runner, env, task)
    ev.case_timeout_s = 120.0
    lab_fns, lab_errors = lab.strategies(ev, task, env.interpret, no_compile)
    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, path in kernel_files().items():
        try:
            fns[name] = _load(path, f"_rmsv_{name}").rmsnorm_gate
        except Exception as exc:
            errors[name] = f"error: import failed: {type(exc).__name__}: {exc}"[:300]
    for mine, theirs in (("fla", "peer:fla"), ("compile", "torch_compile")):
        if theirs in lab_fns:
            fns[mine] = lab_fns[theirs]
        else:
            errors[mine] = lab_errors.get(theirs, "missing")
    try:
        fns["liger"] = liger_composite()
    except Exception as exc:
        errors["liger"] = f"missing: liger-kernel not importable ({type(exc).__name__}: {exc})"[
            :300
        ]
    return {"lab": lab, "runner": runner, "ev": ev, "torch": env.torch, "fns": fns,
            "errors": errors, "interpret": env.interpret}  # fmt: skip


def write_json(out: Path, data: dict[str, Any], name: str = "rmsnorm_variants.json") -> None:
    tmp = out / f"{name}.tmp"
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(out / name)


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if not row.get("passed") or not row.get("median_us"):
        return str(row.get("status") or "failed")[:9]
    return f"{row['median_us']:.1f}/{row.get('pct_of_copy_bw') or 0:.0f}%"


def print_table(results: dict[str, Any], names: list[str], ours: list[str]) -> None:
    rows = results["rows"]
    find = {(r["strategy"], r["case"]): r for r in rows}
    info = results["info"]
    print(f"\n{info.get('device')}  torch {info.get('torch')}  triton {info.get('triton')}  copy "
          f"{info.get('copy_gbps') or 0:.0f} GB/s  wall {results.get('wall_s', 0):.0f}s  "
          f"phases {results.get('phases_s')}")  # fmt: skip
    print("cells: median us / % of copy; lead: fastest of all; ours/peer: best of ours vs the peer")
    short = [n.split("_")[0] for n in names]
    print("case".ljust(17) + "".join(s[:10].rjust(11) for s in short) + "  lead".ljust(9)
          + " ours/fla ours/liger ours/compile")  # fmt: skip
    sums: dict[str, list[float]] = {}
    for case in results["cases"]:
        got = {n: find.get((n, case)) for n in names}
        ok = {
            n: r["median_us"]
            for n, r in got.items()
            if r and r.get("passed") and r.get("median_us")
        }
        lead = min(ok, key=ok.get).split("_")[0] if ok else "-"  # type: ignore[arg-type]
        best = min((ok[n] for n in ours if n in ok), default=None)
        ratios = [f"{ok[p] / best:.3f}x" if best and p in ok else "-" for p in (*PEERS, "compile")]
        print(case[:16].ljust(17) + "".join(cell(got[n]).rjust(11) for n in names)
              + f"  {lead:<8}" + "".join(r.rjust(10) for r in ratios))  # fmt: skip
        if case in results["hg_cases"]:
            for n, v in ok.items():
                sums.setdefault(n, []).append(v)
    hg = {n: sum(v) for n, v in sums.items() if len(v) == len(results["hg_cases"])}
    if hg:
        print(
            "HarnessGym's 4 final cases, summed us: "
            + ", ".join(
                f"{n.split('_')[0]} {v:.1f}" for n, v in sorted(hg.items(), key=lambda kv: kv[1])
            )
        )
    print(
        f"check: {', '.join(f'{n} ' + ('ok' if c['passed'] else 'FAILED') for n, c in results.get('check', {}).items())}"
    )
    if results.get("leader"):
        best: dict[str, tuple[float, int]] = {}
        for s in results.get("sweep", []):
            if s.get("median_us") and (
                s["case"] not in best or s["median_us"] < best[s["case"]][0]
            ):
                best[s["case"]] = (s["median_us"], s["num_warps"])
        print(f"leader {results['leader']}; sweep best num_warps: "
              + ", ".join(f"{c} {w}w {t:.1f}us" for c, (t, w) in best.items()))  # fmt: skip
    for label, rec in (results.get("ncu", {}).get("by_case") or {}).items():
        m = {k.split(".")[0]: (v or {}).get("value") for k, v in rec.items() if isinstance(v, dict)}
        print(f"ncu {label}: {m.get('gpu__time_duration') or 0:.0f} ns, DRAM "
              f"{m.get('dram__throughput') or 0:.0f}% of peak, "
              f"{(m.get('dram__bytes') or 0) / 1e9:.0f} GB/s")  # fmt: skip
    if results.get("ncu", {}).get("error"):
        print(f"ncu: {results['ncu']['error'][:200]}")


def fla_choices() -> dict[str, str]:
    """The configs FLA's autotuner picked per key (read back from its autotuner's cache)."""
    mod = sys.modules.get("fla.modules.norm.fused_norm_gate")
    obj, out = getattr(mod, "layer_norm_gated_fwd_kernel_row", None), {}
    for _ in range(4):
        if isinstance(getattr(obj, "cache", None), dict):
            return {str(k): str(v) for k, v in obj.cache.items()}
        obj = getattr(obj, "fn", None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=220.0, help="stop starting work after")
    ap.add_argument("--parts", default="warm,check,time,compile,sweep,ncu")
    ap.add_argument("--repeats", type=int, default=3, help="separate measurements per row")
    ap.add_argument("--jobs", type=int, default=min(15, max(1, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--dry-run", action="store_true", help="CPU: Triton interpreter, tiny shapes")
    ap.add_argument("--warm-worker", help=argparse.SUPPRESS)
    ap.add_argument("--ncu-target", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.warm_worker:
        return warm_worker(args.warm_worker)
    if args.ncu_target:
        return ncu_target(args.ncu_target.split(","), args.calls, interpret=False)
    if args.out is None:
        ap.error("--out is required")
    started = time.monotonic()
    end = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    # One Triton cache for this process and the warm workers (they inherit the environment).
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="hl_rmsv_tcache_"))
    parts = set(args.parts.split(","))
    ctx = context(args.dry_run or not _cuda(), no_compile="compile" not in parts)
    ctx["out"] = args.out
    lab, ev = ctx["lab"], ctx["ev"]
    cases = timed_cases(lab)
    if ctx["interpret"]:  # one shape per width class is enough to prove the path on a CPU
        cases = [
            c for c in cases if c["name"] in ("1024x1024_fp16", "8192x3000_bf16", "4096x5120_fp16")
        ]
    ours = list(kernel_files())
    names = [*ours, *PEERS]
    info = ev.env.info() | {"copy_gbps": ev.env.copy_gbps(), "date": time.strftime("%Y-%m-%d"),
                            "argv": sys.argv[1:]}  # fmt: skip
    results: dict[str, Any] = {"info": info, "cases": [c["name"] for c in cases],
        "hg_cases": [c["name"] for c in cases if c["group"] == "hg"], "rows": [],
        "errors": ctx["errors"], "phases_s": {}}  # fmt: skip
    phases = results["phases_s"]

    def phase(name: str, t0: float) -> None:
        phases[name] = round(time.monotonic() - t0, 1)
        results["wall_s"] = time.monotonic() - started
        write_json(args.out, results)

    if "warm" in parts:
        t0 = time.monotonic()
        files = {n: p for n, p in kernel_files().items() if n in ctx["fns"]}
        jobs = 2 if ctx["interpret"] else args.jobs
        limit = min(60.0, args.budget_s * 0.25)
        results["warm"] = warm(files, cases, jobs, limit, tiny=ctx["interpret"],
                               liger="liger" in ctx["fns"])  # fmt: skip
        phase("warm", t0)
    if "check" in parts:
        t0 = time.monotonic()
        cap = end if ctx["interpret"] else min(end - 120, t0 + 45)
        results["check"] = check(ctx, {n: ctx["fns"][n] for n in ours if n in ctx["fns"]}, cases,
                                 cap)  # fmt: skip
        phase("check", t0)
    if "time" in parts:
        t0 = time.monotonic()
        time_all(ctx, ctx["fns"], cases, names, end - 100, args.repeats, results)
        results["fla_autotune"] = fla_choices()
        phase("time", t0)
    if "compile" in parts:
        t0 = time.monotonic()
        names.append("compile")
        time_all(ctx, ctx["fns"], cases, ["compile"], end - 50, 1, results)
        phase("compile", t0)
    results["leader"] = lead = leader(results, ours)
    if "sweep" in parts and lead:
        t0 = time.monotonic()
        results["sweep"] = sweep(ctx, ctx["fns"][lead], cases, end - 30)
        phase("sweep", t0)
    if "ncu" in parts and lead:
        t0 = time.monotonic()
        who = list(dict.fromkeys([lead, OURS_FIRST, "fla"]))
        who = [n for n in who if n in ctx["fns"]]
        if ctx["interpret"]:  # no profiler here: run the target's path once, unprofiled
            ncu_target([f"{n}@{c}" for c in NCU_CASES for n in who if n != "fla"], 1, True)
            results["ncu"] = {"error": "not profiled: the Triton interpreter"}
        else:
            results["ncu"] = ncu_part(ctx, who, args.out, max(0.0, end - time.monotonic()))
            results["ncu"].pop("csv", None)
        phase("ncu", t0)
    results["wall_s"] = time.monotonic() - started
    write_json(args.out, results)
    print_table(results, [n for n in names if any(r["strategy"] == n for r in results["rows"])],
                ours)  # fmt: skip
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())

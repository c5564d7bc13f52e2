"""rmsnorm_gate: the shipped CUDA solution against its plan variants
(benchmarks/variants/rmsnorm_gate_cuda_plans/plans.py: cache hints, load order, launch bounds,
threads per row, persistent rows), FLA, Liger and torch.compile, in one GPU call of under 4
minutes on an H100 that decides which plan ships per shape class (issue 30, item 4). Prints one
table last; writes OUT/rmsnorm_cuda_variants.json as it goes.

    python benchmarks/rmsnorm_cuda_variants_gpu.py --out DIR [--budget-s 220] [--repeats 5]
                                   [--variants a,b] [--no-torch-compile]
    python benchmarks/rmsnorm_cuda_variants_gpu.py --out DIR --dry-run   (no GPU needed)

Needs torch, triton and NVRTC; FLA (fla-core) and Liger (liger-kernel) where importable (else
their rows say `missing`). Shapes: the lab's rmsnorm_gate cases and HarnessGym's four final
cases, each in a class (plans.shape_class: `small`, the batch resident in one wave; `large`,
bandwidth bound); a variant is timed on the classes it is meant for. Phases, in order:
  build    every strategy's kernels for every shape timed or checked, on a thread pool (NVRTC
           releases the GIL), and each kernel's registers and local memory from its cubin
           (cuobjdump, where found: Triton ships one) with the warps an SM can then hold
  check    the shipped solution and every variant against the task's reference: its probes, the
           verifier's edge cases of every timed shape, odd widths and misaligned pointers (both
           the 2-byte path), through runner.compare and the task's tolerances
  time     shape by shape, the strategies of its class in a rotating order, each through the
           lab's Evaluator.run_case (correctness, then tools/gpu/timing.py: clean L2 or graph
           replays), --repeats separate measurements: the median of their medians and their
           spread ((max - min) / median); FLA and Liger beside them; Liger is compiled first
           in worker processes (rmsnorm_variants_gpu.warm)
  compile  torch.compile on the same shapes (last: its compiles are slow)
--dry-run (no GPU): the build phase for sm_90, then every strategy called on CPU tensors of
every timed, odd and misaligned shape, which runs its plan and the launcher's checks up to
"running needs a GPU"; the launch each made is listed in the JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOL_DIR = ROOT / "tasks" / "rmsnorm_gate" / "solutions"
SOL_ENTRY = "cuda_rmsnorm_gate.py:rmsnorm_gate"
PLANS = HERE / "variants" / "rmsnorm_gate_cuda_plans" / "plans.py"
SHIPPED = "shipped"
PEERS = ("fla", "liger")
# Correctness only, the 2-byte path: every pointer one element past a 16-byte boundary.
MISALIGNED = ((5, 2048, "float16"), (3, 4096, "bfloat16"), (2, 8192, "float16"),
              (7, 1024, "bfloat16"), (4, 3000, "float16"))  # fmt: skip
DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}
# Where FLA or torch.compile led the shipped solution (docs/lab/2026-11-27-h100/report.md).
FIRST = ("4096x8192_bf16", "4096x8192_fp16", "768x2048_fp16", "384x4096_bf16")
LAUNCHED = re.compile(r"running [\w.]+:(rmsnorm_gate_\w+<[^>]*>) needs a CUDA GPU")


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


rv = _load(HERE / "rmsnorm_variants_gpu.py", "_rmsnorm_variants_gpu")


def timed_cases(lab: Any, plans: Any) -> list[dict[str, Any]]:
    """The lab's cases and HarnessGym's four, each with its shape class."""
    task = lab.read_task(rv.TASK_DIR)
    cases = [{**c, "group": "lab"} for c in lab.lab_cases(task)]
    for rows, dim in rv.HG_CASES:
        shape = {"rows": rows, "dim": dim}
        cases.append({"name": lab.case_name(shape, "float16"), "dtype": "float16",
                      "shape": shape, "group": "hg"})  # fmt: skip
    for c in cases:
        c["class"] = plans.shape_class(c["shape"]["rows"], c["shape"]["dim"])
    return cases


def by_priority(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order to time them in, should the budget run out: where a peer led first."""
    return sorted(cases, key=lambda c: c["name"] not in FIRST)


def strategies(ctx: dict[str, Any], plans: Any, names: list[str]) -> tuple[dict, dict]:
    """name -> callable: the shipped solution through the runner's candidate loader, each
    variant (its own copy of the solution module), then the peers rv.context loaded."""
    ev = ctx["ev"]
    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}
    entry, ev.req["entry"] = ev.req["entry"], SOL_ENTRY
    try:
        fns[SHIPPED] = ev.load_candidate(str(SOL_DIR))[0]
    except Exception as exc:
        errors[SHIPPED] = f"error: import failed: {type(exc).__name__}: {exc}"[:300]
    finally:
        ev.req["entry"] = entry
    for name in names:
        try:
            fns[name] = plans.variant_module(name).rmsnorm_gate
        except Exception as exc:
            errors[name] = f"error: import failed: {type(exc).__name__}: {exc}"[:300]
    for peer in PEERS:
        if peer in ctx["fns"]:
            fns[peer] = ctx["fns"][peer]
        else:
            errors[peer] = ctx["errors"].get(peer, "missing")
    return fns, errors


# ----------------------------------------------------------------------------------------------
# build: every kernel a strategy launches, compiled before anything is timed


def launch_keys(cases: list[dict[str, Any]]) -> list[tuple[int, int, str, int]]:
    """(rows, dim, dtype, vec) of every launch the check and the timing make."""
    keys = [(c["shape"]["rows"], c["shape"]["dim"], c["dtype"], 8) for c in cases]
    for rows, dim, dtype in (*rv.ODD_SHAPES, *MISALIGNED):
        keys.append((rows, dim, dtype, 1))
    for dtype in DTYPES:
        keys += [(5, 1001, dtype, 1), (3, 3000, dtype, 8), (3, 8192, dtype, 8), (1, 4096, dtype, 8)]
        keys += [(512, c["shape"]["dim"], dtype, 8) for c in cases]  # the edge cases' rows
    return sorted({k for k in keys if k[0] > 0 and k[1] % k[3] == 0})


def build(fns: dict[str, Any], keys: list[tuple], torch: Any, jobs: int) -> dict[str, Any]:
    """Compile each CUDA strategy's kernel for every key on `jobs` threads: per strategy the
    kernel each key launches, and each distinct (kernel, block)'s resources."""
    todo = []
    for name, fn in fns.items():
        ns = fn.__globals__  # the solution module (or a variant's copy of it)
        for rows, dim, dtype, vec in keys:
            todo.append((name, f"{rows}x{dim}_{dtype}_v{vec}", ns, getattr(torch, dtype), vec,
                         ns["plan"](dim, vec, rows)))  # fmt: skip
    sys.modules["harnesslab_cuda"]._compiler()  # NVRTC loaded once, before the threads
    started, errors, kernels = time.monotonic(), [], {}
    plans_of: dict[str, dict[str, str]] = {}

    def one(job: tuple) -> Any:
        _, _, ns, dtype, vec, p = job
        return ns["kernel"](dtype, vec, p.variant, p.chunks, p.hints, p.max_threads, p.min_blocks)

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for job, fut in [(j, pool.submit(one, j)) for j in todo]:
            try:
                k = fut.result()
            except Exception as exc:
                errors.append(f"{job[0]} {job[1]}: {type(exc).__name__}: {exc}"[:300])
                continue
            threads = job[5].block[0] * job[5].block[1]
            plans_of.setdefault(job[0], {})[job[1]] = f"{k.expression} @{threads}"
            kernels.setdefault(f"{k.expression} @{threads}", (k, threads))
    wall = time.monotonic() - started
    tool = cuobjdump()
    res = {key: resources(k, threads, tool) for key, (k, threads) in kernels.items()}
    return {"kernels": len(kernels), "launches": len(todo), "wall_s": round(wall, 1),
            "errors": errors, "resources": res, "plans": plans_of,
            "cuobjdump": tool or "not found"}  # fmt: skip


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # noqa: PLC0415 (its wheel carries one)

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(path) if path.is_file() else None
    except Exception:
        return None


def resident_warps(regs: int, threads: int) -> int:
    """Warps of one kernel an H100 SM holds: 65536 registers allocated per warp in units of
    256, at most 64 warps and 32 blocks (shared memory, 1.2 KB a block here, is no limit)."""
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    blocks = min((65536 // per_warp) // warps, 64 // warps, 32)
    return blocks * warps


def resources(kernel: Any, threads: int, tool: str | None) -> dict[str, Any]:
    """Registers and local memory of the kernel's cubin, and the share of an SM's 64 warps
    blocks of `threads` can then fill."""
    out: dict[str, Any] = {"threads": threads}
    if not tool:
        return out
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.compiled.image)
        f.flush()
        try:
            text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                                  text=True, timeout=60).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:  # evidence, never fatal
            return {**out, "error": f"{type(exc).__name__}: {exc}"[:200]}
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if m:
        regs, stack, _, local = (int(g) for g in m.groups())
        warps = resident_warps(regs, out["threads"])
        out |= {"regs": regs, "stack": stack, "local": local, "warps_pct": 100 * warps // 64}
    return out


# ----------------------------------------------------------------------------------------------
# check inputs and the dry run


def misaligned(ctx: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(label, dtype, thunk) inputs whose three pointers sit one element past 16 bytes."""
    runner, ev, torch = ctx["runner"], ctx["ev"], ctx["torch"]

    def shifted(t: Any) -> Any:
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        return view

    def make(rows: int, dim: int, dtype: str) -> Any:
        gen = torch.Generator(device=ev.env.device)
        gen.manual_seed(977 + dim)
        args, kwargs = ev.ref.make_inputs({"rows": rows, "dim": dim},
                                          runner.dtype_of(torch, dtype), ev.env.device, gen)  # fmt: skip
        return tuple(shifted(a) for a in args), kwargs

    return [(f"misaligned:{r}x{d}", dt, lambda r=r, d=d, dt=dt: make(r, d, dt))
            for r, d, dt in MISALIGNED]  # fmt: skip


def dry_launch(ctx: dict[str, Any], fns: dict[str, Any], cases: list[dict[str, Any]]) -> dict:
    """Each CUDA strategy called on CPU tensors of every timed, odd and misaligned shape: the
    plan runs and the launcher checks the launch, then says a GPU is needed. Per strategy,
    input -> the kernel expression of its launch (or the error when it failed before)."""
    torch = ctx["torch"]
    shapes = [(c["shape"]["rows"], c["shape"]["dim"], c["dtype"]) for c in cases]
    shapes += [s for s in rv.ODD_SHAPES if s[0] > 0]
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        if name in PEERS:
            continue
        got: dict[str, str] = {}
        inputs = [(f"{r}x{d}_{dt}", lambda r=r, d=d, dt=dt: _empty(torch, r, d, dt))
                  for r, d, dt in shapes]  # fmt: skip
        inputs += [(label, make) for label, _, make in misaligned(ctx)]
        for label, make in inputs:
            args, kwargs = make()
            try:
                fn(*args, **kwargs)
                got[label] = "ran"  # never on a CPU: a launch that skipped the launcher
            except Exception as exc:  # GpuRequired names the kernel the checked launch runs
                m = LAUNCHED.search(str(exc)) if type(exc).__name__ == "GpuRequired" else None
                got[label] = m.group(1) if m else f"{type(exc).__name__}: {exc}"[:300]
        out[name] = got
    return out


def _empty(torch: Any, rows: int, dim: int, dtype: str) -> tuple:
    dt = getattr(torch, dtype)
    return (torch.empty(rows, dim, dtype=dt), torch.empty(rows, dim, dtype=dt),
            torch.empty(dim, dtype=dt)), {}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# time and report


def time_cases(ctx, fns, errors, cases, by_class, deadline, repeats, results) -> None:
    """Shape by shape; the order of the strategies rotates so that none is always first."""
    for idx, case in enumerate(cases):
        names = by_class[case["class"]]
        order = names[idx % len(names) :] + names[: idx % len(names)]
        for name in order:
            base = {"strategy": name, "case": case["name"], "group": case["group"],
                    "class": case["class"], "passed": False}  # fmt: skip
            if name in errors:
                row = {**base, "status": ctx["lab"].error_status(errors[name]),
                       "reason": errors[name]}  # fmt: skip
            elif time.monotonic() > deadline:
                row = {**base, "status": "skipped", "reason": "skipped: time budget"}
            else:
                try:  # run_case reports its own failures; a repeat's timing could still raise
                    row = {**rv.time_row(ctx, name, fns[name], case, idx, repeats),
                           "class": case["class"]}  # fmt: skip
                except Exception as exc:
                    row = {**base, "status": "error",
                           "reason": f"repeat: {type(exc).__name__}: {exc}"[:300]}  # fmt: skip
                meds = [m for m in row.get("repeat_medians_us") or [] if m]
                if meds and row.get("median_us"):
                    row["repeat_spread"] = (max(meds) - min(meds)) / row["median_us"]
            results["rows"].append(row)
        rv.write_json(ctx["out"], results, "rmsnorm_cuda_variants.json")


def summarize(results: dict[str, Any], ours: list[str]) -> dict[str, Any]:
    """Per case: the best of ours (passed the check and the row) and its ratio to each peer and
    to the shipped plan (peer time / ours: > 1 means ours is faster). Per class: the variant
    with the lowest geomean over every case of the class, and whether it leads every peer on
    every case."""
    ok_check = {n for n, c in results.get("check", {}).items() if c.get("passed")}
    if not results.get("check"):
        ok_check = set(ours)
    med = {(r["strategy"], r["case"]): r["median_us"]
           for r in results["rows"] if r.get("passed") and r.get("median_us")}  # fmt: skip
    cases, classes = {}, {}
    for c in results["cases"]:
        mine = {n: med[(n, c["name"])] for n in ours if n in ok_check and (n, c["name"]) in med}
        best = min(mine, key=mine.__getitem__) if mine else None
        ratio = {p: med[(p, c["name"])] / mine[best]
                 for p in (*PEERS, "compile", SHIPPED) if best and (p, c["name"]) in med}  # fmt: skip
        cases[c["name"]] = {"best": best, "best_us": mine.get(best) if best else None,
                            "ratio": ratio, "class": c["class"]}  # fmt: skip
    for klass in dict.fromkeys(c["class"] for c in results["cases"]):
        names = [c["name"] for c in results["cases"] if c["class"] == klass]
        scored = []
        for n in ours:
            times = [med.get((n, case)) for case in names]
            if n in ok_check and all(times):
                scored.append((statistics.geometric_mean(times), n))  # type: ignore[arg-type]
        if not scored:
            continue
        g, pick = min(scored)
        shipped = dict((n, v) for v, n in scored).get(SHIPPED)
        leads = {p: all((p, case) in med and med[(p, case)] >= med[(pick, case)] for case in names)
                 for p in (*PEERS, "compile")}  # fmt: skip
        classes[klass] = {"pick": pick, "geomean_us": g, "vs_shipped": shipped / g if shipped
                          else None, "leads_every_case": leads}  # fmt: skip
    hg = [c["name"] for c in results["cases"] if c.get("group") == "hg"]
    sums: dict[str, float] = {}
    if hg:
        per_case_best = [cases[n]["best_us"] for n in hg]
        if all(per_case_best):
            sums["best"] = sum(per_case_best)
        for n in (SHIPPED, *PEERS, "compile"):
            if all((n, case) in med for case in hg):
                sums[n] = sum(med[(n, case)] for case in hg)
    return {"cases": cases, "classes": classes, "hg_sum_us": sums}


def _cell(row: dict[str, Any] | None) -> str:
    """us (2 decimals under 10 us) ± the spread of the repeats in %; the status otherwise."""
    if row is None:
        return "."
    if not row.get("passed") or not row.get("median_us"):
        return str(row.get("status") or "failed")[:7]
    us, spread = row["median_us"], 100 * (row.get("repeat_spread") or 0.0)
    return (f"{us:.2f}" if us < 10 else f"{us:.1f}") + (
        f"±{spread:.1f}" if spread < 9.95 else "±9+"
    )


def render(results: dict[str, Any], names: list[str], ours: list[str]) -> str:
    """Two tables, strategies down and shapes across (at most 45 lines with every variant):
    us (median of the repeats ± their spread in %), then FLA's time over each of ours (> 1:
    faster than FLA), the best of ours per shape and the verdicts."""
    cases = results["cases"]
    find = {(r["strategy"], r["case"]): r for r in results["rows"]}
    summary, info, w = results["summary"], results["info"], 10
    lines = [f"{info.get('device')}  torch {info.get('torch')}  triton {info.get('triton')}  "
             f"copy {info.get('copy_gbps') or 0:.0f} GB/s  wall {results.get('wall_s', 0):.0f} s  "
             f"phases {results.get('phases_s')}",
             "us±spr%".ljust(9) + "".join(c["name"].split("_")[0].rjust(w) for c in cases),
             " " * 9 + "".join(f"{c['name'].split('_')[1]} {c['class'][:2]}".rjust(w)
                               for c in cases)]  # fmt: skip
    for n in names:
        lines.append(n[:9].ljust(9) + "".join(_cell(find.get((n, c["name"]))).rjust(w)
                                              for c in cases))  # fmt: skip
    lines.append("FLA us / strategy us (> 1: faster than FLA; '.': not timed, other class)")
    for n in ours:
        cells = []
        for c in cases:
            mine, fla = find.get((n, c["name"])) or {}, find.get(("fla", c["name"])) or {}
            ok = mine.get("passed") and fla.get("passed") and mine.get("median_us")
            cells.append(f"{fla['median_us'] / mine['median_us']:.3f}" if ok else ".")
        lines.append(n[:9].ljust(9) + "".join(x.rjust(w) for x in cells))
    per = summary["cases"]
    lines.append("best".ljust(9) + "".join(str(per[c["name"]]["best"])[:9].rjust(w) for c in cases))
    for p, label in (("liger", "best/lgr"), ("compile", "best/cmp"), (SHIPPED, "best/shp")):
        vals = [per[c["name"]]["ratio"].get(p) for c in cases]
        lines.append(label.ljust(9) + "".join((f"{v:.3f}" if v else "-").rjust(w) for v in vals))
    for klass, s in summary["classes"].items():
        leads = ", ".join(f"{p} {'yes' if v else 'NO'}" for p, v in s["leads_every_case"].items())
        vs = f"{s['vs_shipped']:.3f}x shipped" if s["vs_shipped"] else "shipped n/a"
        lines.append(f"class {klass}: pick {s['pick']} (geomean {s['geomean_us']:.2f} us, {vs}); "
                     f">= on every case: {leads}")  # fmt: skip
    hg = summary.get("hg_sum_us") or {}
    lines.append("HarnessGym's 4, summed us: " + (", ".join(f"{k} {v:.1f}" for k, v in hg.items())
                                                   or "-"))  # fmt: skip
    check = results.get("check", {})
    bad = [f"{n}: {c['failures'][0][:60]}" for n, c in check.items() if not c["passed"]]
    lines.append(f"check: {len(check) - len(bad)}/{len(check)} passed" +
                 (f"; FAILED {'; '.join(bad[:3])}" if bad else ""))  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=220.0, help="stop starting work after")
    ap.add_argument("--repeats", type=int, default=5, help="separate measurements per cell")
    ap.add_argument("--variants", default="", help="comma list (default: every VARIANTS entry)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build and launch checks only")
    args = ap.parse_args(argv)
    started = time.monotonic()
    end = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="hl_rmscv_tcache_"))
    dry = args.dry_run or not rv._cuda()
    no_compile = dry or args.no_torch_compile
    ctx = rv.context(dry, no_compile=no_compile)
    ctx["out"] = args.out
    plans = _load(PLANS, "_rmsnorm_gate_cuda_plans")  # after rv.context: harnesslab_cuda importable
    names = [n for n in args.variants.split(",") if n] or list(plans.VARIANTS)
    unknown = sorted(set(names) - set(plans.VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(plans.VARIANTS)}")
    cases = timed_cases(ctx["lab"], plans)
    fns, errors = strategies(ctx, plans, names)
    ours = [SHIPPED, *names]
    by_class = {k: [n for n in ours if n == SHIPPED or k in plans.VARIANTS[n].classes] + [*PEERS]
                for k in ("small", "large")}  # fmt: skip
    ev = ctx["ev"]
    info = ev.env.info() | {"copy_gbps": ev.env.copy_gbps(), "date": time.strftime("%Y-%m-%d"),
                            "argv": sys.argv[1:], "dry_run": dry}  # fmt: skip
    results: dict[str, Any] = {"info": info, "cases": cases, "rows": [], "errors": errors,
                               "variants": {n: plans.VARIANTS[n].why for n in names},
                               "phases_s": {}}  # fmt: skip
    phases = results["phases_s"]

    def phase(name: str, t0: float) -> None:
        phases[name] = round(time.monotonic() - t0, 1)
        results["wall_s"] = time.monotonic() - started
        rv.write_json(args.out, results, "rmsnorm_cuda_variants.json")

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as background:
        # Liger's Triton kernels compile in worker processes (the timed widths only) while
        # NVRTC builds ours on threads: both before anything is timed.
        warming = None
        if "liger" in fns and not dry:
            limit = min(45.0, args.budget_s * 0.2)
            warming = background.submit(rv.warm, {}, cases, args.jobs, limit, tiny=True, liger=True)
        ours_fns = {n: f for n, f in fns.items() if n in ours}
        results["build"] = build(ours_fns, launch_keys(cases), ctx["torch"], args.jobs)
        results["warm"] = warming.result() if warming else None
    b = results["build"]
    print(f"build: {b['kernels']} kernels, {b['launches']} launches, {b['wall_s']} s, "
          f"errors {b['errors'][:2]}; warm {results['warm']}")  # fmt: skip
    phase("build", t0)
    if dry:
        t0 = time.monotonic()
        results["dry_launch"] = dry_launch(ctx, ours_fns, cases)
        phase("dry_launch", t0)
    else:
        t0 = time.monotonic()
        results["check"] = rv.check(ctx, ours_fns, cases, t0 + 45, extra=tuple(misaligned(ctx)))
        phase("check", t0)
        t0 = time.monotonic()
        cut = end - (0 if no_compile else 60)  # torch.compile's minute
        time_cases(ctx, fns, errors, by_priority(cases), by_class, cut, args.repeats, results)
        results["fla_autotune"] = rv.fla_choices()
        phase("time", t0)
        if not no_compile:
            t0 = time.monotonic()
            if "compile" in ctx["fns"]:
                fns["compile"] = ctx["fns"]["compile"]
            else:
                errors["compile"] = ctx["errors"].get("compile", "missing")
            only = {"small": ["compile"], "large": ["compile"]}
            time_cases(ctx, fns, errors, by_priority(cases), only, end, 1, results)
            phase("compile", t0)
    results["summary"] = summarize(results, ours)
    results["wall_s"] = time.monotonic() - started
    shown = [
        n for n in (*ours, *PEERS, "compile") if any(r["strategy"] == n for r in results["rows"])
    ]
    results["table"] = render(results, shown, [n for n in ours if n in shown])
    rv.write_json(args.out, results, "rmsnorm_cuda_variants.json")
    print("\n" + results["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

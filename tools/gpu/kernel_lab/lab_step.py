"""Kernel lab, GPU side, for a step task (issue 32): the decode row of tools/gpu/kernel_lab/lab.py.

lab.py hands a task of kind "step" here (its run_task, then its own summary and report rows).
Strategies: torch_eager (the workspace's eager step, the task's baseline), torch_compile (that
step under torch.compile(mode="reduce-overhead"): CUDA graphs through cudagraph trees; skipped
on the Triton interpreter) and each reference solution (solutions/*.py as sol:<name>). Each runs
every trace of task.toml's [step] table through step_trace.run_trace (every step's logits and
the KV cache checked against the reference; one pass timed), so a row is one sequence-length
bucket of one trace, case "<trace>:<bucket>" ("<trace>:all": the whole trace), median_us its
p50 step latency, p95/p99, device p50 and launch overhead beside it. On a GPU the rows of the
traces that carry claims ([lab] targets' cases) are measured `repeats` times (a new run_trace
each) for the solutions and the targets' comparators. Nsight Compute does not profile these
(a step is dozens of kernels). benchmarks/decode_step_gpu.py takes `compiled` from here.

Staged with lab.py (gpu.LAB); standard library and torch, never harnesslab. Side of the trust
boundary: the lab's, trusted benchmark code running the shipped strategies only (no agent's
candidate), on the host it was sent to.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import step_trace
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import step_trace

TRACE_TIMEOUT_S = 300.0  # one run_trace of one strategy (a hung step fails its rows)


def compiled(eager_step):
    """torch.compile(mode="reduce-overhead") of an eager step, the state's tensors marked as
    static addresses (as gpt-fast's KV cache buffers are), so its CUDA graphs replay over them
    instead of copying them in."""
    import torch

    fn = torch.compile(eager_step, mode="reduce-overhead")
    marked: list[weakref.ref] = []  # by identity: a freed state's id() may come back

    def step(state, tokens):
        if not any(r() is state for r in marked):
            tensors = [state.kv_cache, state.lengths, state.rope_cos, state.rope_sin]
            for t in [*tensors, *state.weights.values()]:
                torch._dynamo.mark_static_address(t)
            marked[:] = [r for r in marked if r() is not None] + [weakref.ref(state)]
        return fn(state, tokens)

    return step


def claim_cases(task: dict[str, Any]) -> list[str]:
    """The cases the [lab] targets name (a step task's targets list theirs: "<trace>:<bucket>")."""
    names: list[str] = []
    for t in task.get("lab", {}).get("targets", []):
        names += [n for n in t.get("cases", []) if n not in names]
    return names


def strategies(runner, task: dict[str, Any], interpret: bool, no_compile: bool):
    """name -> step callable, and name -> why it does not run (import error, skipped)."""
    root = Path(task["root"])
    func = task["entry"].split(":", 1)[1]
    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}
    sources = [("torch_eager", root / "workspace" / task["entry"].split(":", 1)[0])]
    sources += [(f"sol:{p.stem}", p) for p in sorted((root / "solutions").glob("*.py"))
                if not p.name.startswith("_")]  # fmt: skip
    for name, path in sources:
        try:
            module = runner.load_module(path, f"_hl_lab_{task['name']}_{name.replace(':', '_')}")
            fns[name] = getattr(module, func)
        except Exception as exc:  # reported per row, never fatal
            errors[name] = f"import failed: {type(exc).__name__}: {exc}"[:300]
    if "torch_eager" not in fns:
        errors["torch_compile"] = "skipped: the eager step did not import"
    elif interpret or no_compile:
        why = "CUDA graphs need a GPU (Triton interpreter run)" if interpret else "--no-compile"
        errors["torch_compile"] = f'skipped: torch.compile(mode="reduce-overhead") not run: {why}'
    else:
        import torch

        torch._dynamo.reset()
        for knob in ("recompile_limit", "cache_size_limit"):  # every bucket and dtype compiles
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        fns["torch_compile"] = compiled(fns["torch_eager"])
    order = ["torch_eager", "torch_compile"] + [n for n, _ in sources if n.startswith("sol:")]
    return {n: fns[n] for n in order if n in fns}, {n: errors[n] for n in order if n in errors}


def _rows(task: dict[str, Any], strategy: str, entry: dict[str, Any], sizes: dict[str, int],
          out: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per bucket of one run_trace (and its "all" row), in the lab's row shape."""
    reason = step_trace.failure_reason(out["failures"][0]) if out["failures"] else ""
    rows = []
    for b in [*out["buckets"], out["total"]]:
        rows.append({
            "task": task["name"], "strategy": strategy, "case": f"{entry['name']}:{b['bucket']}",
            "dtype": entry["dtype"], "shape": dict(sizes), "passed": out["correct"],
            "status": "passed" if out["correct"] else "failed", "reason": reason,
            "median_us": b["p50_us"], "p95_us": b["p95_us"], "p99_us": b["p99_us"],
            "host_us": b["host_p50_us"], "launch_overhead_us": b["launch_overhead_us"],
            "device_p50_us": b["device_p50_us"], "tokens_per_s": b["tokens_per_s"],
            "steps": b["steps"], "failed_steps": b["failed_steps"],
            "timing_method": "step_trace", "gbps": None, "pct_of_copy_bw": None,
            "flops": None, "tflops": None, "bytes": None,
        })  # fmt: skip
    return rows


def _run(torch, ref, step, config, trace, device: str, tol) -> dict[str, Any]:
    """run_trace under a deadline; a strategy that raises or hangs gets an "error" outcome."""
    try:
        with step_trace.failures.deadline(TRACE_TIMEOUT_S):
            return step_trace.run_trace(torch, ref, step, config, trace, device=device,
                                        tolerance=tol)  # fmt: skip
    except Exception as exc:
        return {"error": step_trace.failures.one_line(exc)}


def run_task(runner, env, task: dict[str, Any], args, deadline: float) -> dict[str, Any]:
    """Every strategy over every trace: the rows, and the summary lab.py completes."""
    torch, interpret = env.torch, env.interpret
    spec = task["step"]
    ref = runner.load_module(Path(task["root"]) / "reference.py", f"_hl_lab_{task['name']}_ref")
    fns, errors = strategies(runner, task, interpret, args.no_compile)
    names = [*fns, *(n for n in errors if n not in fns)]
    claims = claim_cases(task)
    comparators = {t["vs"] for t in task.get("lab", {}).get("targets", []) if t.get("vs")}
    entries = spec["traces"]
    if args.quick:  # the traces that carry claims, else the first
        entries = [e for e in entries if any(c.split(":")[0] == e["name"] for c in claims)]
        entries = entries or spec["traces"][:1]
    if args.max_cases:  # a step task's "cases" here are its traces
        entries = entries[: args.max_cases]
    sizes = spec["interpreter" if interpret else "model"]
    rows: list[dict[str, Any]] = []
    for entry in entries:
        config, trace = step_trace.sized(ref, spec, entry, interpret)
        tol = task["tolerances"][entry["dtype"]]
        mine: list[dict[str, Any]] = []
        for name in names:
            if name in errors or time.monotonic() > deadline:
                why = errors.get(name) or "skipped: time budget"
                mine.append({"strategy": name, "why": why})
                continue
            out = _run(torch, ref, fns[name], config, trace, env.device, tol)
            if "error" in out:
                mine.append({"strategy": name, "why": f"error: {out['error']}"})
                continue
            got = _rows(task, name, entry, sizes, out)
            repeat = (out["correct"] and not interpret and (name.startswith("sol:") or
                      name in comparators) and any(r["case"] in claims for r in got))  # fmt: skip
            extra = [_run(torch, ref, fns[name], config, trace, env.device, tol)
                     for _ in range(args.repeats - 1 if repeat else 0)]  # fmt: skip
            bad = next((m for m in extra if "error" in m or not m["correct"]), None)
            again = [_rows(task, name, entry, sizes, m) for m in extra if "error" not in m]
            for row in got:
                if bad is not None:  # a repeat that failed fails the row: no claim stands on it
                    why = bad.get("error") or step_trace.failure_reason(bad["failures"][0])
                    row.update(passed=False, status="failed", reason=f"a repeat: {why}")
                medians = [row["median_us"]] if row["median_us"] else []
                for more in again:
                    medians += [r["median_us"] for r in more
                                if r["case"] == row["case"] and r["median_us"]]  # fmt: skip
                row["repeat_medians_us"] = medians
                row["repeat_spread"] = ((max(medians) - min(medians)) / statistics.median(medians)
                                        if medians else None)  # fmt: skip
            mine += got
            for r in got:
                print(json.dumps({k: r[k] for k in ("task", "strategy", "case", "status",
                      "median_us", "p95_us")}), flush=True)  # fmt: skip
        cases = list(dict.fromkeys(r["case"] for r in mine if "case" in r))
        cases = cases or [f"{entry['name']}:all"]  # no strategy ran: one row each says why
        for m in mine:
            if "case" in m:
                rows.append(m)
                continue
            status = "skipped" if m["why"].startswith("skipped") else "error"
            rows += [{"task": task["name"], "strategy": m["strategy"], "case": c,
                      "dtype": entry["dtype"], "shape": dict(sizes), "passed": False,
                      "status": status, "reason": m["why"], "median_us": None,
                      "timing_method": "step_trace", "repeat_medians_us": [],
                      "repeat_spread": None} for c in cases]  # fmt: skip
    order = list(dict.fromkeys(r["case"] for r in rows))
    rows.sort(key=lambda r: (order.index(r["case"]), names.index(r["strategy"])))
    return {
        "rows": rows,
        "summary": {
            "metric": "latency",
            "strategies": names,
            "strategy_errors": errors,
            "cases": order,
            "claim_cases": [c for c in claims if c in order],
            "targets": [
                {**t, "cases": [c for c in t.get("cases", []) if c in order]}
                for t in task.get("lab", {}).get("targets", [])
            ],
            "peers": {},
        },
    }


__all__ = ["claim_cases", "compiled", "run_task", "strategies"]

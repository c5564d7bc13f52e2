"""profile_kernel on a step task: which kernel dominates one decode step. The runner's
`step_profile` mode runs a dev trace's steps with the candidate's step (the reference alongside,
as step_trace.py does), the earlier steps as warm-up (compiles, autotuning, graph captures), and
its last `repeats` steps under torch.profiler: per kernel, its launches and device time per
step and its share of the step's, biggest first. The profiled steps' logits are checked: a
wrong step's profile says nothing.

On a GPU the rows are the device's kernels (CUPTI: a CUDA graph's replayed kernels included).
On the CPU (the Triton interpreter) the rows are torch's operators by their CPU time, and an
interpreted Triton kernel is no operator at all: the result has its shape, not its meaning
(`meaningful` is false).

Staged (tools/gpu STAGED; standard library at import, torch the caller's). Side of the trust
boundary: like step_trace.py it runs in the runner's sandboxed process with the candidate's
step, so what it reports is dev feedback: a candidate can rebind the profiler.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import correctness, failures, step_trace
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import correctness
    import failures
    import step_trace

MAX_ROWS = 16  # kernels reported, biggest first


def add(torch: Any, averages: Any, cuda: bool, into: dict[str, list[float]]) -> None:
    """A profiled step's key_averages() added into `into` (name -> [launches, us]): the
    device's kernels on a GPU, torch's operators by their own CPU time on the CPU."""
    device = torch.autograd.DeviceType.CUDA
    for e in averages:
        if cuda and e.device_type != device:
            continue
        us = float(e.self_device_time_total if cuda else e.self_cpu_time_total)
        if us > 0:
            row = into.setdefault(str(e.key)[:200], [0.0, 0.0])
            row[0] += e.count
            row[1] += us


def rows(totals: dict[str, list[float]], repeats: int) -> tuple[list[dict[str, Any]], float]:
    """Per kernel: launches and time per step and its share of the step's total, biggest first
    (MAX_ROWS of them); and that total per step."""
    total = sum(us for _, us in totals.values()) / repeats
    out: list[dict[str, Any]] = [{"kernel": name, "launches": n / repeats, "total_us": us / repeats,
            "share_pct": 100.0 * us / repeats / total if total > 0 else 0.0}
           for name, (n, us) in totals.items()]  # fmt: skip
    out.sort(key=lambda r: -r["total_us"])
    return out[:MAX_ROWS], total


def profile(torch: Any, ref: Any, step: Any, req: dict[str, Any], *, interpret: bool,
            device: str, candidate_dir: str = "") -> dict[str, Any]:  # fmt: skip
    """The runner's step_profile mode: req["step"]'s first trace (task/step.py's request),
    its last req["repeats"] steps profiled one by one (the prompts' prefill and the
    reference outside the profiler) and checked."""
    spec, entry = req["step"], req["step"]["traces"][0]
    config, trace = step_trace.sized(ref, spec, entry, interpret)
    seed = int(req.get("seed", 0))
    states = [ref.new_state(config, seed=seed, device=device) for _ in range(2)]
    state, truth = states
    steps = sum(len(segment["tokens"]) for segment in trace["segments"])
    repeats = max(1, min(int(req.get("repeats", 3)), steps - 1))
    cuda = device == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    tol = req["tolerances"][entry["dtype"]]
    result: dict[str, Any] = {"status": "passed", "trace": entry["name"], "reason": "",
                              "meaningful": cuda, "steps_profiled": repeats, "kernels": []}  # fmt: skip
    totals: dict[str, list[float]] = {}
    try:
        with failures.deadline(float(req.get("case_timeout_s", 120))):
            for index, toks in step_trace.walk(ref, states, trace, 0):
                tokens = torch.tensor(toks, dtype=torch.long, device=device)
                if index < steps - repeats:  # warm-up: compiles, captures
                    out = step(state, tokens)
                else:
                    context = max(truth.host_lengths) + 1
                    result["context"] = max(result.get("context", 0), context)
                    with torch.profiler.profile(activities=activities) as prof:
                        out = step(state, tokens)
                        if cuda:
                            torch.cuda.synchronize()
                    add(torch, prof.key_averages(), cuda, totals)
                want = ref.reference_step(truth, tokens)
                ok, why, _ = correctness.compare(torch, out, want, tol, want.shape,
                                                 config.torch_dtype, (tokens,))  # fmt: skip
                if not ok:
                    return {
                        **result,
                        "status": "failed",
                        "reason": f"logits at step {index}: {why}",
                    }
    except Exception as exc:
        return {**result, "status": "error", "reason": failures.one_line(exc, candidate_dir)}
    result["kernels"], result["step_us"] = rows(totals, repeats)
    return result


__all__ = ["MAX_ROWS", "add", "profile", "rows"]

"""numerical_probe on a step task: the candidate's decode step at its numerical edges, every
step's logits against the reference's (step_trace.run_trace's check pass: stale KV slots
poisoned, the KV cache checked after the pass), one result per probe and dtype in the kernel
probe's shape (tools/evaluation/probe.py ProbeResult): the worst error over the probe's steps
and how many tolerances off it is.

Staged (tools/gpu STAGED; standard library at import, torch the caller's): the runner's probe
mode hands a step task's request here. Side of the trust boundary: like step_trace.py it runs
in the runner's sandboxed process with the candidate's step, so what it reports is dev feedback
(the guarded verify, step_guard.py, decides): a candidate can rebind anything here.

The probes are traces and edits of the states the harness makes (the candidate's and the
reference's alike: `Edited` wraps the task's reference module), at the sizes the device runs
(the interpreter's on the CPU):
  long_context      every sequence's prompt fills the cache up to max_seq - steps: the last
                    step attends over all max_seq slots
  ragged_contexts   one batch holding an empty prompt, a one-slot prompt, half the cache and a
                    nearly full one: per-sequence bounds, not the batch's longest or shortest
  large_embeddings  the embedding table scaled up (the residual stream's magnitude): in fp16
                    its squares overflow a 16-bit type; in bf16 it is past fp16's range
  large_values      the prompts' values scaled up: attention outputs, and the residual they
                    feed, in the hundreds to thousands
Scales are powers of two (exact in every dtype). Measured at the interpreter's sizes, seed 3: the
eager baseline's worst tolerance ratio over these probes is 0.23, the shipped Triton solution's
0.33 (bf16 long_context). Not among them: large attention scores (keys scaled or offset). A
sharp softmax turns the honest rounding of q in fp16/bf16 into errors of up to 4x the
tolerance against the fp32 reference (measured: keys offset by 64x, 12 seeds), so such a probe
would fail correct steps.
"""

from __future__ import annotations

import os
import sys
import zlib
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import failures, step_trace
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import failures
    import step_trace

NOTES: dict[str, str] = {
    "long_context": "Every prompt fills the KV cache to max_seq - steps, so the last steps "
    "attend over all max_seq slots: fails when attention's loop, split or grid stops short of "
    "the cache's end (a fixed window, an unmasked last block, a split sized for short contexts).",
    "ragged_contexts": "One batch holds an empty prompt, a one-slot prompt, half the cache and a "
    "nearly full one: fails when a bound is the batch's longest or shortest length instead of "
    "each sequence's own, or an empty context divides by zero.",
    "large_embeddings": "The embedding table scaled by 256 (fp16) or 2^40 (bf16): in fp16 the "
    "residual stream's squares overflow, so fails when RMSNorm's mean of squares is not taken "
    "in fp32; in bf16 the residual is past fp16's range, so fails when anything casts it to "
    "fp16.",
    "large_values": "The prompts' values scaled by 1024: attention's outputs and the residual "
    "they feed reach the hundreds to thousands, so fails when a later RMSNorm squares in a "
    "16-bit type, or attention's weighted sum of values is kept in fp16 (an unnormalized sum "
    "over a long, flat context passes 65504).",
}
NAMES = tuple(NOTES)
# Edited's scales per probe and dtype (embedding table, prompt values); absent: as drawn.
EDITS: dict[str, dict[str, tuple[float, float]]] = {
    "large_embeddings": {"float16": (256.0, 1.0), "bfloat16": (2.0**40, 1.0)},
    "large_values": {"float16": (1.0, 1024.0), "bfloat16": (1.0, 1024.0)},
}
STEPS = {"interpreter": 4, "gpu": 8}  # decode steps per probe (after each sequence's prompt)


class Edited:
    """The task's reference module with a probe's edits to every state it makes: new_state
    scales the embedding table, prefill the prompt's values. Both the candidate's state and
    the reference's go through it, so the reference answers the same inputs."""

    def __init__(self, ref: Any, embed: float = 1.0, values: float = 1.0) -> None:
        self._ref, self._embed, self._values = ref, embed, values

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ref, name)

    def new_state(self, config: Any, **kwargs: Any) -> Any:
        state = self._ref.new_state(config, **kwargs)
        state.weights["embed"].mul_(self._embed)
        return state

    def prefill(self, state: Any, seq: int, length: int, seed: int) -> None:
        self._ref.prefill(state, seq, length, seed)
        state.kv_cache[:, 1, seq, :, :length] *= self._values


def trace_of(name: str, config: Any, steps: int, seed: int) -> dict[str, Any]:
    """The probe's trace at `config`'s sizes: a fixed trace, its prompts' lengths set per probe."""
    top = config.max_seq - steps
    length = top if name == "long_context" else config.max_seq // 2
    trace = step_trace.fixed_trace(config, length=length, steps=steps, seed=seed)
    if name == "ragged_contexts":
        pattern = [0, top, 1, config.max_seq // 2]
        trace["segments"][0]["lengths"] = [pattern[b % 4] for b in range(config.batch)]
    trace["name"] = name
    return trace


class Worst:
    """The worst error over a probe's steps (step_trace's `observe`), in the kernel probe's
    terms: max |out - ref|, max relative error, NaN/Inf counts, and the tolerance ratio."""

    def __init__(self, torch: Any, tol: dict[str, float]) -> None:
        self.torch, self.tol = torch, tol
        self.stats: dict[str, Any] = {"max_abs_err": None, "max_rel_err": None, "nan": 0,
                                      "inf": 0, "tolerance_ratio": None}  # fmt: skip
        self.step: int | None = None

    def __call__(self, index: int, out: Any, want: Any) -> None:
        torch, s = self.torch, self.stats
        if type(out) is not torch.Tensor or tuple(out.shape) != tuple(want.shape):
            return  # the comparison's own failure says what is wrong with it
        o = out.float()
        s["nan"] += int(torch.isnan(o).sum())
        s["inf"] += int(torch.isinf(o).sum())
        diff = (o - want).abs()
        finite = torch.isfinite(diff)
        if not bool(finite.any()):
            return
        ratio = float((diff / (self.tol["atol"] + self.tol["rtol"] * want.abs()))[finite].max())
        rel = float((diff / want.abs().clamp_min(self.tol["atol"]))[finite].max())
        if s["tolerance_ratio"] is None or ratio > s["tolerance_ratio"]:
            s["tolerance_ratio"], self.step = ratio, index
        s["max_abs_err"] = max(s["max_abs_err"] or 0.0, float(diff[finite].max()))
        s["max_rel_err"] = max(s["max_rel_err"] or 0.0, rel)


def one(torch: Any, ref: Any, step: Any, req: dict[str, Any], name: str, dtype: str, *,
        interpret: bool, device: str) -> dict[str, Any]:  # fmt: skip
    """One probe at one dtype: its trace's check pass, the worst error over its steps."""
    if name not in NOTES:
        raise ValueError(f"unknown step probe {name!r} (one of {', '.join(NAMES)})")
    spec = req["step"]
    config = ref.Config(**spec["interpreter" if interpret else "model"], dtype=dtype)
    steps = STEPS["interpreter" if interpret else "gpu"]
    seed = (int(req.get("seed", 0)) + zlib.crc32(name.encode())) % (1 << 31)
    trace = trace_of(name, config, steps, seed)
    embed, values = EDITS.get(name, {}).get(dtype, (1.0, 1.0))
    tol = req["tolerances"][dtype]
    worst = Worst(torch, tol)
    out = step_trace.run_trace(torch, Edited(ref, embed, values), step, config, trace,
                               device=device, weight_seed=seed, tolerance=tol, check_only=True,
                               observe=worst)  # fmt: skip
    contexts = [length + steps for length in trace["segments"][0]["lengths"]]
    row: dict[str, Any] = {"passed": out["correct"], "family": name,
                           "shape": [config.batch, config.vocab], "context": max(contexts),
                           "steps": out["steps"], **worst.stats}  # fmt: skip
    row["reason"] = step_trace.failure_reason(out["failures"][0]) if out["failures"] else ""
    return row


def run(torch: Any, ref: Any, step: Any, req: dict[str, Any], *, interpret: bool, device: str,
        emit: Any, candidate_dir: str = "") -> dict[str, Any]:  # fmt: skip
    """The runner's probe mode on a step task: every probe of req["probes"] (default: all) at
    every dtype of req["dtypes"] (default: the task's), one "probe" event each, as the kernel
    probe reports them."""
    results = []
    for name in req.get("probes") or NAMES:
        for dtype in req.get("dtypes") or list(req["tolerances"]):
            r: dict[str, Any] = {"probe": name, "dtype": dtype, "note": NOTES.get(name, "")}
            try:
                with failures.deadline(float(req.get("case_timeout_s", 120))):
                    r.update(one(torch, ref, step, req, name, dtype, interpret=interpret,
                                 device=device))  # fmt: skip
            except Exception as exc:
                r.update(passed=False, reason=failures.one_line(exc, candidate_dir))
            emit({"event": "probe", **r})
            results.append(r)
    return {"status": "passed" if all(r["passed"] for r in results) else "failed",
            "probes": results}  # fmt: skip


__all__ = ["EDITS", "NAMES", "NOTES", "Edited", "Worst", "one", "run", "trace_of"]

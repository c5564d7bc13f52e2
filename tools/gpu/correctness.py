"""The runner's correctness checks: one output against the task's fp32 reference, the inputs
left untouched, freed memory poisoned so an unwritten output shows up.

Staged to the GPU host beside runner.py (standard library + torch, never harnesslab). Trusted
code that runs in the runner's process: inside sandbox.py with the candidate (dev modes), and on
the guarded verify's trusted side (guard.py calls compare and dtype_of through the runner).
torch is passed in, never imported here.
"""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


def dtype_of(torch, name: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def poison_allocator(torch, device: str, nbytes: int) -> None:
    """Fill freed allocator memory with NaN so an output the candidate forgets to write shows up
    as NaN instead of stale correct values (the caching allocator hands the block back)."""
    if device != "cuda" or nbytes <= 0:
        return
    junk = torch.empty(nbytes // 2 + 1, dtype=torch.float16, device=device)
    junk.fill_(float("nan"))
    del junk


def compare(torch, out, ref, tol: dict[str, float], expected_shape, expected_dtype, inputs):
    """Check one output against the fp32 reference. Returns (passed, reason, stats)."""
    stats: dict[str, Any] = {"max_abs_err": None, "max_rel_err": None}
    if type(out) is not torch.Tensor:
        return False, f"output is {type(out).__name__}, expected a plain torch.Tensor", stats
    if tuple(out.shape) != tuple(expected_shape):
        return False, f"wrong shape {tuple(out.shape)}, expected {tuple(expected_shape)}", stats
    if out.dtype != expected_dtype:
        return False, f"wrong dtype {out.dtype}, expected {expected_dtype}", stats
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.data_ptr() == out.data_ptr() and t.numel():
            return False, "output aliases an input buffer", stats
    # Every figure is reduced on the device and read in one transfer (one host sync per check,
    # not eight): the boolean-mask indexing of `diff[finite]` alone synchronizes twice.
    o = out.float()
    diff = (o - ref).abs()
    finite = torch.isfinite(diff)
    neg = diff.new_full((), float("-inf"))
    rel = diff / ref.abs().clamp_min(max(tol["atol"], 1e-30))
    bad = diff > (tol["atol"] + tol["rtol"] * ref.abs())
    figures = torch.stack(  # float64: the counts stay exact past 2**24 elements
        [
            torch.isnan(o).sum().double(),
            torch.isinf(o).sum().double(),
            finite.any().double(),
            (torch.where(finite, diff, neg).max() if diff.numel() else neg).double(),
            (torch.where(finite, rel, neg).max() if diff.numel() else neg).double(),
            bad.sum().double(),
        ]
    ).tolist()
    n_nan, n_inf, n_bad = int(figures[0]), int(figures[1]), int(figures[5])
    any_finite = bool(figures[2])
    max_abs = figures[3] if any_finite else float("inf")
    max_rel = figures[4] if any_finite else float("inf")
    stats.update(
        max_abs_err=finite_or_none(max_abs),
        max_rel_err=finite_or_none(max_rel),
        nan=n_nan,
        inf=n_inf,
    )
    if n_nan or n_inf:
        return False, f"output has {n_nan} NaN and {n_inf} Inf values", stats
    if n_bad:
        idx = tuple(int(i) for i in (bad.nonzero()[0]))
        stats["worst_index"] = list(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        return (
            False,
            f"{n_bad} of {diff.numel()} elements out of tolerance (first at {list(idx)}, "
            f"max abs err {max_abs:.3g}, atol {tol['atol']}, rtol {tol['rtol']})",
            stats,
        )
    return True, "", stats


def snapshot_inputs(torch, args) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else None for a in args]


def inputs_unchanged(torch, args, saved) -> bool:
    for a, s in zip(args, saved, strict=True):
        if s is not None and not torch.equal(a, s):
            return False
    return True

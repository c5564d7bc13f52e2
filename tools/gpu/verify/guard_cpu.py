"""Guarded verify on the Triton CPU interpreter, trusted parent side: the shared arena and a case.

Staged beside guard.py; standard library and torch. The candidate's process (guard_child.py)
maps one shared memory arena for the whole verify; per call this process writes the inputs into
the call's slots, poisons the role's output slot with NaN, asks the role to compute into it, and
compares what came back (guard.Verify.judge_call) with expected values the child never sees.
The interpreter certifies outputs only (guard.py's `certifies`): here the child reports its own
launches, and could forge the report. The parent's wall clock around a call is this path's
timing sample; each call is preceded by a mark (the child's class snapshot) that stays outside
that clock. guard.py reaches these functions through its `_cpu()`, as it reaches guard_gpu.py.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import guard
    from .guard_kid import sealed_memfd
else:  # imported by guard.py, from the staged folder on sys.path (guard is loaded first)
    import guard
    from guard_kid import sealed_memfd


def arena_fd(vf: guard.Verify) -> int:
    """One shared memory arena for every case (sized for the largest), sealed against resizing
    so a hostile child cannot truncate it under this process."""
    size = max(arena_layout(vf.torch, vs)[1] for vs in vf.variants_per_case.values()) + 4096
    fd = sealed_memfd(size, vf.scratch_root)
    vf.arena_size = size
    return fd


def arena_layout(torch, variants: list[guard.Variant]) -> tuple[list[dict[str, Any]], int]:
    """Offsets in the arena: each variant's tensor inputs, then one output slot per role."""
    off = 0
    layout = []

    def take(nbytes: int) -> int:
        nonlocal off
        start = off
        off += (nbytes + 255) // 256 * 256 + 256
        return start

    for v in variants:
        ins: list[dict[str, Any] | None] = []
        for a in v.args:
            if isinstance(a, torch.Tensor):
                ins.append({"offset": take(a.numel() * a.element_size()), "shape": list(a.shape),
                            "dtype": str(a.dtype)[6:]})  # fmt: skip
            else:
                ins.append(None)
        shape, dtype = v.spec
        numel = 1
        for s in shape:
            numel *= int(s)
        nbytes = numel * torch.finfo(dtype).bits // 8
        slots = {r: {"offset": take(nbytes), "shape": list(shape), "dtype": str(dtype)[6:]}
                 for r in ("candidate", "incumbent")}  # fmt: skip
        layout.append({"inputs": ins, "slots": slots})
    return layout, off


def cpu_case(vf: guard.Verify, case: dict[str, Any], idx: int, variants: list[guard.Variant],
             memfd: int | None) -> dict[str, Any]:  # fmt: skip
    """A case's record: the candidate's process computes into the shared arena."""
    torch = vf.torch
    rec = vf.case_record(case, variants)
    tol = vf.ev.tolerances[case["dtype"]]
    layout, _ = arena_layout(torch, variants)
    assert memfd is not None
    if vf.arena is None:  # kept for the whole verify: views pin it
        vf.arena = mmap.mmap(memfd, vf.arena_size)
    arena = vf.arena
    if not vf.arena_sent:
        for kid in vf.kids:
            kid.ask({"op": "arena", "size": vf.arena_size})
        vf.arena_sent = True

    def view(spec):
        numel = 1
        for s in spec["shape"]:
            numel *= int(s)
        if not numel:
            return torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]))
        t = torch.frombuffer(arena, dtype=getattr(torch, spec["dtype"]), count=numel,
                             offset=int(spec["offset"]))  # fmt: skip
        return t.view(*spec["shape"]) if spec["shape"] else t.view(())

    plan = list(range(len(variants)))
    plan.append(0)  # check 0's buffers again with new contents: a cache by address is stale
    for n, vi in enumerate(plan):
        v = variants[vi]
        lay = layout[vi]
        if n == len(plan) - 1:
            fresh = vf.ev.make(vf.ev.case_shape(case), v.args[0].dtype, idx * 1009 + 991)
            v = guard.Variant("recheck", list(fresh[0]), fresh[1], torch, vf.ev.ref)
        for a, spec in zip(v.args, lay["inputs"], strict=True):
            if spec is not None and a.numel():
                view(spec).copy_(a)
        msg_args = [{"tensor": spec} if spec is not None else {"value": a}
                    for a, spec in zip(v.args, lay["inputs"], strict=True)]  # fmt: skip
        for kid in vf.kids[:: 1 if n % 2 == 0 else -1]:  # A B, B A, ...
            slot = lay["slots"][kid.role]
            if v.expected.numel():
                view(slot).fill_(float("nan"))
            kid.ask({"op": "mark"})  # its class snapshot, outside the clock below
            reply, wall_us = kid.ask({"op": "call", "args": msg_args,
                                      "kwargs": v.kwargs, "slot": slot})  # fmt: skip
            out = view(slot) if reply.get("copied") else None
            inputs_now = [view(s) if s is not None else a
                          for a, s in zip(v.args, lay["inputs"], strict=True)]  # fmt: skip
            where = f"{v.kind} call {n}" + (f" ({v.family})" if v.family != v.kind else "")
            call = vf.judge_call(reply, out, v, tol, where, inputs_now)
            call.update(role=kid.role, kind=v.kind, set=n, wall_us=wall_us)
            rec["calls"].append(call)
            for a, s in zip(v.pristine, lay["inputs"], strict=True):
                if s is not None and a.numel():
                    view(s).copy_(a)  # restore for the other role
    for kid in vf.kids:
        kid.ask({"op": "end_case"})
    return rec


__all__ = ["arena_fd", "arena_layout", "cpu_case"]

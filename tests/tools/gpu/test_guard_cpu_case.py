"""The interpreter's case in the guarded verify's parent (guard_cpu.cpu_case): what it asks
each candidate process, in which order. The parent's wall clock around a call is the CPU path's
timing sample, so each call is preceded by a mark (the child's class snapshot, 1.5-5 ms) that
stays outside that clock. The kids are stand-ins that record the requests; the whole verify
runs in tests/tools/integrity/test_cheats.py.
"""

from __future__ import annotations

import os
import types
from typing import Any

import torch

from harnesslab.tools.gpu.verify import guard, guard_cpu


class AskingKid:
    def __init__(self, role: str) -> None:
        self.role, self.asked = role, []

    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        self.asked.append(msg["op"])
        return {"ok": True}, 1.0


def test_each_timed_call_is_preceded_by_a_mark_to_the_same_process() -> None:
    cand, inc = AskingKid("candidate"), AskingKid("incumbent")
    v = guard.Verify.__new__(guard.Verify)
    v.torch, v.kids, v.arena, v.arena_sent = torch, [cand, inc], None, False
    x = torch.arange(4, dtype=torch.float32)
    ref = types.SimpleNamespace(
        reference=lambda a: a * 2, output_spec=lambda a: (tuple(a.shape), torch.float32)
    )
    variants = [guard.Variant("check", [x], {}, torch, ref) for _ in range(2)]
    v.ev = types.SimpleNamespace(
        tolerances={"float32": {}}, case_shape=lambda case: [4],
        make=lambda shape, dtype, seed: ([x.clone()], {}), ref=ref,
    )  # fmt: skip
    v.case_record = lambda case, variants: {"calls": []}
    v.judge_call = lambda *a: {}
    v.arena_size = 4096
    memfd = os.memfd_create("hl-test-arena")
    try:
        os.ftruncate(memfd, v.arena_size)
        rec = guard_cpu.cpu_case(v, {"dtype": "float32"}, 0, variants, memfd)
    finally:
        if v.arena is not None:
            v.arena.close()
        os.close(memfd)
    calls = 3  # two variants, then the first again with new contents
    for kid in (cand, inc):
        assert kid.asked == ["arena", *["mark", "call"] * calls, "end_case"], kid.role
    assert [c["role"] for c in rec["calls"]] == ["candidate", "incumbent", "incumbent",
                                                 "candidate", "candidate", "incumbent"]  # fmt: skip

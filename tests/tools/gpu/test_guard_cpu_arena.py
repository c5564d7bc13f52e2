"""The interpreter's arena in the guarded verify's parent (guard_cpu): where each input and each
role's output slot lies, and what one case writes there, asks and judges. The kids here behave
like guard_child.py: they map the arena they are sent, read their inputs from it at the offsets
given, and write what they compute into their role's slot.
"""

from __future__ import annotations

import itertools
import mmap
import os
import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu.verify import guard, guard_cpu


def ref_of(out_dtype: torch.dtype = torch.float32) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        reference=lambda a, s=0.0, *rest, **kw: (a.float() * 2 + s).to(out_dtype),
        output_spec=lambda a, *rest, **kw: (tuple(a.shape), out_dtype),
    )


def region(spec: dict[str, Any], torch_dtype: torch.dtype) -> int:
    numel = 1
    for s in spec["shape"]:
        numel *= s
    return numel * torch.finfo(torch_dtype).bits // 8


def test_layout_offsets_sizes_and_dtypes() -> None:
    a = torch.zeros(3, 5, dtype=torch.float16)  # 30 bytes: 256 + gap
    b = torch.zeros((), dtype=torch.bfloat16)  # 0-d: 2 bytes
    c = torch.zeros(0, 4)  # empty: the gap only
    d = torch.zeros(2, 40)  # 320 bytes: 512 + gap
    ref = types.SimpleNamespace(reference=lambda *x: None,
                                output_spec=lambda *x: ((2, 40), torch.bfloat16))  # fmt: skip
    v1 = guard.Variant("check", [a, 2.5, b, c, d], {}, torch, ref)
    v2 = guard.Variant("edge", [d], {}, torch, ref)
    layout, total = guard_cpu.arena_layout(torch, [v1, v2])
    ins = layout[0]["inputs"]
    assert ins[1] is None
    assert [s["offset"] for s in (ins[0], ins[2], ins[3], ins[4])] == [0, 512, 1024, 1280]
    assert ins[0] == {"offset": 0, "shape": [3, 5], "dtype": "float16"}
    assert ins[2] == {"offset": 512, "shape": [], "dtype": "bfloat16"}
    assert ins[3]["shape"] == [0, 4] and ins[3]["dtype"] == "float32"
    slots = layout[0]["slots"]
    assert set(slots) == {"candidate", "incumbent"}
    # bf16 out (2, 40): 160 bytes -> 256 + gap each
    assert slots["candidate"] == {"offset": 2048, "shape": [2, 40], "dtype": "bfloat16"}
    assert slots["incumbent"] == {"offset": 2560, "shape": [2, 40], "dtype": "bfloat16"}
    assert layout[1]["inputs"][0]["offset"] == 3072  # the next variant follows
    assert layout[1]["slots"]["candidate"]["offset"] == 3072 + 768
    assert layout[1]["slots"]["incumbent"]["offset"] == 3072 + 768 + 512
    assert total == 3072 + 768 + 512 + 512


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7, 9), (64, 3), (128,), (129,)])
def test_layout_regions_are_aligned_padded_and_disjoint(dtype, shape) -> None:
    x = torch.zeros(shape, dtype=dtype)
    ref = types.SimpleNamespace(reference=lambda *a: None, output_spec=lambda *a: (shape, dtype))
    layout, total = guard_cpu.arena_layout(torch, [guard.Variant("check", [x, 3], {}, torch, ref)])
    specs = [layout[0]["inputs"][0], *layout[0]["slots"].values()]
    assert layout[0]["inputs"][1] is None
    spans = []
    for s in specs:
        assert s["shape"] == list(shape) and s["dtype"] == str(dtype)[6:]
        nbytes = region(s, dtype)
        assert nbytes == x.numel() * x.element_size()
        assert s["offset"] % 256 == 0
        spans.append((s["offset"], s["offset"] + (nbytes + 255) // 256 * 256 + 256))
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == total
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end == start  # disjoint, each with its 256-byte gap


class ArenaKid:
    """Reads its inputs from the arena, records them, writes a * 2 + s (+ bias) into its slot."""

    def __init__(self, role: str, memfd: int, bias: float, spoil: bool = False,
                 copied: bool = True) -> None:  # fmt: skip
        self.role, self.memfd, self.bias, self.spoil, self.copied = role, memfd, bias, spoil, copied
        self.asked: list[dict[str, Any]] = []
        self.seen: list[dict[str, Any]] = []
        self.arena: mmap.mmap | None = None

    def view(self, spec: dict[str, Any]) -> torch.Tensor:
        assert self.arena is not None
        numel = 1
        for s in spec["shape"]:
            numel *= s
        if not numel:
            return torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]))
        t = torch.frombuffer(self.arena, dtype=getattr(torch, spec["dtype"]), count=numel,
                             offset=spec["offset"])  # fmt: skip
        return t.view(spec["shape"])

    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        self.asked.append(msg)
        if msg["op"] == "arena":
            self.arena = mmap.mmap(self.memfd, msg["size"])
        if msg["op"] != "call":
            return {"ok": True}, 0.0
        ins = [self.view(m["tensor"]) if "tensor" in m else m["value"] for m in msg["args"]]
        slot = self.view(msg["slot"])
        self.seen.append({"ins": [i.clone() if isinstance(i, torch.Tensor) else i for i in ins],
                          "slot_nan": bool(slot.isnan().all()),
                          "kwargs": msg["kwargs"]})  # fmt: skip
        slot.copy_(ins[0].float() * 2 + ins[1] + self.bias)
        if self.spoil and ins[0].numel():
            ins[0].fill_(-7)  # the other role must get the inputs back
        return {"copied": self.copied, "role": self.role}, 11.0


def make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype), 0.5], {"k": seed}


def setup(memfd: int, **kid_kw: Any) -> tuple[guard.Verify, list[ArenaKid], list, list[int]]:
    vf = guard.Verify.__new__(guard.Verify)
    kids = [ArenaKid("candidate", memfd, 100.0, **kid_kw), ArenaKid("incumbent", memfd, 0.0)]
    vf.torch, vf.kids, vf.arena, vf.arena_sent = torch, kids, None, False
    seeds: list[int] = []

    def made(shape, dtype, seed):
        seeds.append(seed)
        return make(shape, dtype, seed)

    vf.ev = types.SimpleNamespace(tolerances={"float32": {"atol": 1}}, case_shape=lambda c: c["shape"],
                                  make=made, ref=ref_of())  # fmt: skip
    vf.case_record = lambda case, variants: {"calls": [], "case": case}
    judged: list = []

    def judge(reply, out, v, tol, where, inputs_now):
        judged.append(
            {
                "reply": reply,
                "out": None if out is None else out.clone(),
                "v": v,
                "tol": tol,
                "where": where,
                "now": [i.clone() if isinstance(i, torch.Tensor) else i for i in inputs_now],
            }
        )
        return {"judged": len(judged)}

    vf.judge_call = judge
    vf.arena_size = 1 << 16
    os.ftruncate(memfd, vf.arena_size)
    return vf, kids, judged, seeds


@pytest.fixture
def memfd():
    fd = os.memfd_create("hl-test-arena")
    yield fd
    os.close(fd)


def variants_of(shape=(3, 4)):
    ref = ref_of()
    x, y = torch.arange(12.0).view(shape), -torch.arange(12.0).view(shape)
    return [guard.Variant("check", [x, 1.5], {"k": 1}, torch, ref),
            guard.Variant("edge:big", [y, 2.5], {"k": 2}, torch, ref, family="edge")]  # fmt: skip


def test_case_writes_inputs_poisons_slots_and_judges_the_slot(memfd) -> None:
    variants = variants_of()
    vf, kids, judged, seeds = setup(memfd, spoil=True)
    try:
        rec = guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 3, variants, memfd)
    finally:
        vf.arena.close()
    cand = kids[0]
    assert [m["op"] for m in cand.asked] == ["arena", *["mark", "call"] * 3, "end_case"]
    assert cand.asked[0]["size"] == vf.arena_size and vf.arena_sent
    assert seeds == [3 * 1009 + 991]
    fresh, fresh_kw = make([3, 4], torch.float32, 3 * 1009 + 991)
    want = [variants[0].pristine, variants[1].pristine, fresh]
    for kid in kids:
        assert [s["slot_nan"] for s in kid.seen] == [True] * 3, kid.role
        for n, seen in enumerate(kid.seen):
            assert torch.equal(seen["ins"][0], want[n][0]), (kid.role, n)
            assert seen["ins"][1] == want[n][1]
        assert [s["kwargs"] for s in kid.seen] == [{"k": 1}, {"k": 2}, fresh_kw]
    roles = ["candidate", "incumbent", "incumbent", "candidate", "candidate", "incumbent"]
    assert [c["role"] for c in rec["calls"]] == roles
    assert [c["set"] for c in rec["calls"]] == [0, 0, 1, 1, 2, 2]
    assert [c["kind"] for c in rec["calls"]] == ["check"] * 2 + ["edge:big"] * 2 + ["recheck"] * 2
    assert [c["wall_us"] for c in rec["calls"]] == [11.0] * 6
    assert [c["judged"] for c in rec["calls"]] == [1, 2, 3, 4, 5, 6]
    assert [j["where"] for j in judged] == ["check call 0"] * 2 + ["edge:big call 1 (edge)"] * 2 + [
        "recheck call 2"] * 2  # fmt: skip
    for j, role in zip(judged, roles, strict=True):
        n = ["check", "edge:big", "recheck"].index(j["v"].kind)
        bias = 100.0 if role == "candidate" else 0.0
        assert torch.equal(j["out"], want[n][0].float() * 2 + want[n][1] + bias), j["where"]
        assert j["tol"] == {"atol": 1} and j["reply"]["role"] == role
        spoiled = torch.full_like(want[n][0], -7) if role == "candidate" else want[n][0]
        assert torch.equal(j["now"][0], spoiled) and j["now"][1] == want[n][1]
    assert torch.equal(judged[4]["v"].expected, fresh[0] * 2 + fresh[1])


def test_the_arena_is_sent_once_and_kept(memfd) -> None:
    variants = variants_of()
    vf, kids, _, _ = setup(memfd)
    try:
        guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 0, variants, memfd)
        arena = vf.arena
        guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 1, variants, memfd)
        assert vf.arena is arena
    finally:
        vf.arena.close()
    for kid in kids:
        ops = [m["op"] for m in kid.asked]
        assert ops.count("arena") == 1 and ops[0] == "arena" and ops.count("end_case") == 2


def test_no_copy_reply_is_judged_without_output(memfd) -> None:
    variants = variants_of()
    vf, _kids, judged, _ = setup(memfd, copied=False)
    try:
        guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 0, variants, memfd)
    finally:
        vf.arena.close()
    assert [j["out"] is None for j in judged] == [True, False, False, True, True, False]


def test_empty_input_and_output_are_not_read_from_the_arena(memfd) -> None:
    ref = ref_of()
    e = torch.zeros(0, dtype=torch.float16)
    variants = [guard.Variant("check", [e, 1.0], {}, torch, ref)]
    vf, _kids, judged, _ = setup(memfd)
    vf.ev.make = lambda shape, dtype, seed: ([torch.zeros(0, dtype=dtype), 1.0], {})
    try:
        guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [0]}, 0, variants, memfd)
    finally:
        vf.arena.close()
    assert len(judged) == 4
    for j in judged:
        assert j["out"].shape == (0,) and j["out"].dtype == torch.float32
        assert j["now"][0].shape == (0,) and j["now"][0].dtype == torch.float16


def test_a_recheck_with_other_arguments_than_its_layout_fails(memfd) -> None:
    variants = variants_of()
    vf, _kids, judged, _ = setup(memfd)
    vf.ev.make = lambda shape, dtype, seed: ([torch.zeros(3, 4), 0.5, 1.0], {})
    try:
        with pytest.raises(ValueError, match="zip"):
            guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 0, variants, memfd)
    finally:
        vf.arena.close()
    assert len(judged) == 4  # the two sets before it were judged, the recheck never ran


def test_no_arena_descriptor_is_refused(memfd) -> None:
    vf, kids, _, _ = setup(memfd)
    with pytest.raises(AssertionError):
        guard_cpu.cpu_case(vf, {"dtype": "float32", "shape": [3, 4]}, 0, variants_of(), None)
    assert vf.arena is None and kids[0].asked == []

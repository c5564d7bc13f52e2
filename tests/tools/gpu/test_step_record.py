"""The step verify's record and replay in process on the CPU (tools/gpu/verify/step_record.py,
step_schema.py, step_replay.py): a recorded step names only the State's arena, its tokens and
the storages its own calls made, and its replay on other tokens gives the reference's logits;
what cannot be replayed is named (a tensor from before the step, a host read, a kernel the
interpreter ran, a CUDA graph captured while recording); a recording that breaks the schema is
`forged_recording`; the replay refuses a tensor past its storage. The sandboxed processes and
the verdict: tests/tools/integrity/test_step_replay.py; on a GPU (Triton launches, CUDA graphs):
benchmarks/step_replay_gpu.py and tests/gpu/test_decode_step_gpu.py."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.step_record_support import (
    CONFIG,
    EAGER,
    RECORDER,
    Arena,
    tensors,
)
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.gpu.verify import step_schema
from harnesslab.tools.gpu.verify.guard_schema import Bad


def test_a_recorded_eager_step_replays_on_other_tokens_to_the_references_logits() -> None:
    a = Arena()
    rec = a.record(EAGER.step, [1, 2, 3, 4])
    assert rec["unsupported"] == [] and rec["kernels"] == []
    prog = step_schema.validate(rec, "cpu", {})
    names = {o["fn"].split(".")[0] for o in prog["ops"]}
    assert {"mm", "index_put_", "rsqrt"} <= names  # matmuls, the cache append, the norms
    used = {arg["t"] for o in prog["ops"] for arg in tensors(o["args"]) if "t" in arg}
    assert {"arena", "tokens"} <= used and used <= {"arena", "tokens"} | {
        key for o in prog["ops"] for _, key in o["new"]
    }
    assert prog["output"]["t"].startswith("v")  # made by the step, not a slot of the arena
    other = [9, 8, 7, 6]
    got = a.replay(prog, other)
    assert a.close_to_reference(got, other)
    assert not a.close_to_reference(got, [1, 2, 3, 4])  # the replay read the new tokens


KEPT = torch.ones(CONFIG.vocab)  # a module's tensor, made before any step


def kept_bias(state, tokens):
    return EAGER.step(state, tokens) + KEPT.to(torch.float16)


def host_bias(state, tokens):
    bias = torch.tensor(state.host_lengths, dtype=torch.float16)  # from host data, per step
    return EAGER.step(state, tokens) + bias[:, None] * 0


def host_read(state, tokens):
    if float(state.lengths.float().sum().item()) < 0:
        raise AssertionError
    return EAGER.step(state, tokens)


def captures(state, tokens):
    torch.cuda.CUDAGraph.capture_begin(None)  # what torch.cuda.graph's capture starts with
    return EAGER.step(state, tokens)


@pytest.mark.parametrize(
    ("step", "code"),
    [(kept_bias, "foreign_tensor"), (host_read, "host_read")],
)
def test_what_the_replay_cannot_reproduce_is_named_and_refused(step, code: str) -> None:
    rec = Arena().record(step, [1, 2, 3, 4])
    assert code in rec["unsupported"]
    with pytest.raises(Bad) as exc:
        step_schema.validate(rec, "cpu", {})
    assert exc.value.code == "unreplayable"
    assert step_schema.STEP_UNREPLAYABLE[code] in str(exc.value)


def test_a_small_tensor_from_host_data_is_recorded_by_value_and_replayed() -> None:
    a = Arena()
    rec = a.record(host_bias, [1, 2, 3, 4])
    prog = step_schema.validate(rec, "cpu", {})
    consts = [t for o in prog["ops"] for t in tensors(o["args"]) if "const" in t]
    assert len(consts) == 1 and consts[0]["s"] == [CONFIG.batch]
    assert a.close_to_reference(a.replay(prog, [5, 6, 7, 8]), [5, 6, 7, 8])


def test_graph_capture_raises_while_recording_and_reaches_torch_otherwise() -> None:
    with pytest.raises(RuntimeError, match="capture is off while the verify records"):
        Arena().record(captures, [1, 2, 3, 4])
    assert not RECORDER.active
    with pytest.raises(Exception) as exc:  # torch's own (this build has no CUDA)
        captures(Arena().state, torch.tensor([1, 2, 3, 4]))
    assert "records" not in str(exc.value)


def test_the_step_gets_a_fresh_scratch_while_recorded_and_its_own_back() -> None:
    a = Arena()
    a.state.scratch["graphs"] = {"kept": 1}
    seen: list[dict[str, Any]] = []

    def step(state, tokens):
        seen.append(dict(state.scratch))
        return EAGER.step(state, tokens)

    a.record(step, [1, 2, 3, 4])
    assert seen == [{"recording": True}] and a.state.scratch == {"graphs": {"kept": 1}}


def test_a_kernel_the_interpreter_ran_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    src = tmp_path / "k.py"
    src.write_text(
        textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def double(x_ptr, n, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
    """)
    )
    kernel = load_module(src, "step_record_interpreted").double

    def step(state, tokens):
        out = EAGER.step(state, tokens)
        kernel[(1,)](out, out.numel(), BLOCK=2048)
        return out

    rec = Arena().record(step, [1, 2, 3, 4])
    assert "interpreted_launch" in rec["unsupported"]


def _good() -> dict[str, Any]:
    return Arena().record(EAGER.step, [1, 2, 3, 4])


GOOD = _good()


def forge(edit) -> dict[str, Any]:
    rec = copy.deepcopy(GOOD)
    edit(rec)
    return rec


def first_tensor(rec: dict[str, Any]) -> dict[str, Any]:
    return next(t for o in rec["ops"] for t in tensors(o["args"]) if "t" in t)


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda r: r["ops"].insert(0, {"op": "aten", "fn": "_local_scalar_dense.default",
                                       "args": [], "kwargs": {}, "new": []}), "unreplayable"),
        (lambda r: r["ops"].insert(0, {"op": "python", "fn": "mm.default", "args": [],
                                       "kwargs": {}, "new": []}), "forged_recording"),
        (lambda r: first_tensor(r).update(t="v999"), "forged_recording"),
        (lambda r: first_tensor(r).update(d="complex64"), "forged_recording"),
        (lambda r: first_tensor(r).update(st=[1, 1]), "forged_recording"),
        (lambda r: first_tensor(r).update(o=-1), "forged_recording"),
        (lambda r: next(o for o in r["ops"] if o["new"])["new"].append([0, "arena"]),
         "forged_recording"),
        (lambda r: r["ops"][0]["args"].append({"device": "cuda"}), "unreplayable"),
        (lambda r: r["ops"].append({"op": "launch", "kernel": "k0", "grid": [1, 1, 1],
                                    "params": []}), "forged_recording"),
        (lambda r: r["ops"][0]["args"].append({"const": "AAAA", "s": [5], "d": "int64"}),
         "forged_recording"),
        (lambda r: r.update(output=None), "forged_recording"),
        (lambda r: r.update(unsupported=["graph_replay"]), "unreplayable"),
    ],
)  # fmt: skip
def test_a_recording_that_breaks_the_schema_is_refused_with_its_code(edit, code: str) -> None:
    step_schema.validate(copy.deepcopy(GOOD), "cpu", {})  # the unforged one passes
    with pytest.raises(Bad) as exc:
        step_schema.validate(forge(edit), "cpu", {})
    assert exc.value.code == code


@pytest.mark.parametrize(("fn", "error"), [("system.default", "AttributeError"),
                                           ("__class__.__base__", "ValueError")])  # fmt: skip
def test_the_replay_runs_aten_operators_only(fn: str, error: str) -> None:
    """An operator name is resolved in torch.ops.aten and must be an operator there (the
    schema, standard library only, checks its form): anything else fails the program."""
    rec = copy.deepcopy(GOOD)
    rec["ops"].insert(0, {"op": "aten", "fn": fn, "args": ["true"], "kwargs": {}, "new": []})
    prog = step_schema.validate(rec, "cpu", {})
    replies: list[dict[str, Any]] = []
    rep = Arena().replayer()
    rep.reply = lambda **fields: replies.append(fields)  # type: ignore[method-assign]
    rep.program({"key": 0, "program": prog, "kernels": []})
    assert replies == [{"error": error}] and rep.programs == {}


def test_the_replay_refuses_a_tensor_on_another_device() -> None:
    """A call that makes a tensor off the replay's device (on a GPU, a host tensor: its work
    would run once, when the step's graph is captured, and never in the timed replays) fails
    the step, whatever passed the schema (a string device here, which it lets through)."""
    a = Arena()
    rep = a.replayer()
    prog = step_schema.validate(copy.deepcopy(GOOD), "cpu", {})
    prog["ops"].insert(0, {"op": "aten", "fn": "empty.memory_format", "args": [[2]],
                           "kwargs": {"device": "meta"}, "new": []})  # fmt: skip
    rep.program({"key": 0, "program": prog, "kernels": []})
    assert rep.run_step({"program": 0}) == ("ValueError", False)


def test_a_step_that_repeats_a_recording_shares_its_program_until_neither_is_named() -> None:
    a = Arena()
    rep = a.replayer()
    rep.program({"key": 0, "program": step_schema.validate(copy.deepcopy(GOOD), "cpu", {}),
                 "kernels": []})  # fmt: skip
    rep.program({"key": 1, "same_as": 0, "kernels": []})
    assert rep.alias == {0: 0, 1: 0} and list(rep.programs) == [0]
    a.views["tokens"].copy_(torch.tensor([5, 6, 7, 8]))
    assert rep.run_step({"program": 1}) == ("", True)
    assert a.close_to_reference(a.views["logits"].clone(), [5, 6, 7, 8])
    rep.drop({"keys": [0]})
    assert list(rep.programs) == [0] and rep.alias == {1: 0}  # step 1 still names it
    rep.drop({"keys": [1]})
    assert rep.programs == {} and rep.alias == {}
    assert rep.run_step({"program": 1}) == ("KeyError", False)


def test_the_replay_refuses_a_tensor_past_its_storage() -> None:
    a = Arena()
    rep = a.replayer()
    arena = {"arena": a.u8.untyped_storage()}
    n = a.u8.numel() // 2  # float16 elements in the arena
    fits = {"t": "arena", "o": n - 4, "s": [2, 2], "st": [2, 1], "d": "float16"}
    assert rep.tensor(fits, arena).shape == (2, 2)
    for past in ({**fits, "o": n - 3}, {**fits, "st": [3, 1]}):
        with pytest.raises(ValueError, match="past its storage"):
            rep.tensor(past, arena)


def _op(**fields: Any) -> dict[str, Any]:
    return {"op": "aten", "fn": "add.Tensor", "args": [], "kwargs": {}, "new": [], **fields}


ARG = [
    ({"f": "not-hex"}, "forged_recording"),  # a float that does not parse
    ({"f": "0x1p+0", "x": 1}, "forged_recording"),  # a float with more: no kind
    ({"dtype": "complex64"}, "unreplayable"),
    ({"dtype": "float16", "x": 1}, "forged_recording"),
    ({"device": "cpu", "x": 1}, "forged_recording"),
    ({"layout": "sparse_coo"}, "unreplayable"),
    ({"layout": "strided", "x": 1}, "forged_recording"),
    ({"memory_format": "weird"}, "unreplayable"),
    ({"memory_format": "contiguous_format", "x": 1}, "forged_recording"),
    ({}, "forged_recording"),
    (3.5, "forged_recording"),  # a bare float: floats travel as {"f": hex}
    ("x" * 65, "forged_recording"),
    ([0] * 4097, "forged_recording"),
    ([[[[1]]]], "forged_recording"),  # the argument list and four more: the scalar too deep
    ({"empty": 3, "d": "float16"}, "forged_recording"),
    ({"empty": [2, 2], "d": "float16"}, "forged_recording"),  # "empty" with no zero size
    ({"t": "arena", "o": 0, "s": [1] * 9, "st": [1] * 9, "d": "float16"}, "forged_recording"),
    ({"t": "arena", "o": 0, "s": [1 << 31 | 1], "st": [1], "d": "float16"}, "forged_recording"),
    ({"t": "arena", "o": 0, "s": [2], "st": [-1], "d": "float16"}, "forged_recording"),
    ({"t": "arena", "o": 1 << 41, "s": [2], "st": [1], "d": "float16"}, "forged_recording"),
    ({"t": "arena", "o": 0, "s": 2, "st": [1], "d": "float16"}, "forged_recording"),
    ({"t": "arena", "o": 0, "s": [2], "st": 1, "d": "float16"}, "forged_recording"),
    ({"const": 5, "s": [1], "d": "int64"}, "forged_recording"),
    ({"const": "A" * (2 * step_schema.CONST_BYTES + 4), "s": [1], "d": "int64"},
     "forged_recording"),
    ({"const": "AAAAAAAAAAA=", "s": 8, "d": "int64"}, "forged_recording"),
    ({"const": "not base64!", "s": [1], "d": "int64"}, "forged_recording"),
]  # fmt: skip


@pytest.mark.parametrize(("arg", "code"), ARG)
def test_an_argument_the_replay_cannot_take_is_refused(arg: Any, code: str) -> None:
    rec = copy.deepcopy(GOOD)
    rec["ops"].insert(0, _op(args=[arg]))
    with pytest.raises(Bad) as exc:
        step_schema.validate(rec, "cpu", {})
    assert exc.value.code == code


@pytest.mark.parametrize(
    "arg",
    [None, True, 3, "floor", {"f": "0x1p+0"}, {"dtype": "bfloat16"}, {"device": "cpu"},
     {"layout": "strided"}, {"memory_format": "preserve_format"}, [[[1]]],
     {"empty": [0, 4], "d": "float32"}, "x" * 64, [0] * 4096],
)  # fmt: skip
def test_every_argument_kind_a_recording_may_carry_passes_as_it_came(arg: Any) -> None:
    rec = copy.deepcopy(GOOD)
    rec["ops"].insert(0, _op(args=[arg], kwargs={"alpha": arg}))
    prog = step_schema.validate(rec, "cpu", {})
    assert prog["ops"][0]["args"] == [arg] and prog["ops"][0]["kwargs"] == {"alpha": arg}
    assert prog["uses"] == []


@pytest.mark.parametrize(("dtype", "size"), sorted(step_schema.ITEMSIZE.items()))
def test_a_tensor_kept_by_value_must_hold_its_shapes_bytes(dtype: str, size: int) -> None:
    import base64

    def const(nbytes: int) -> dict[str, Any]:
        raw = base64.b64encode(bytes(nbytes)).decode()
        return {"const": raw, "s": [3], "d": dtype}

    rec = copy.deepcopy(GOOD)
    rec["ops"].insert(0, _op(args=[const(3 * size)]))
    step_schema.validate(rec, "cpu", {})
    for nbytes in (3 * size - 1, 3 * size + 1):
        rec["ops"][0] = _op(args=[const(nbytes)])
        with pytest.raises(Bad):
            step_schema.validate(rec, "cpu", {})


def test_a_tensor_kept_by_value_is_at_most_const_bytes() -> None:
    import base64

    n = step_schema.CONST_BYTES
    for count, ok in ((n, True), (n + 1, False)):
        raw = base64.b64encode(bytes(count)).decode()
        rec = copy.deepcopy(GOOD)
        rec["ops"].insert(0, _op(args=[{"const": raw, "s": [count], "d": "uint8"}]))
        if ok:
            step_schema.validate(rec, "cpu", {})
        else:
            with pytest.raises(Bad):
                step_schema.validate(rec, "cpu", {})


@pytest.mark.parametrize("code", sorted(step_schema.STEP_UNREPLAYABLE))
def test_every_code_the_recorder_may_report_is_refused_in_the_harnesss_words(code: str) -> None:
    with pytest.raises(Bad) as exc:
        step_schema.validate({**copy.deepcopy(GOOD), "unsupported": [7, "unknown", code]}, "cpu",
                             {})  # fmt: skip
    assert (
        exc.value.code == "unreplayable" and str(exc.value) == step_schema.STEP_UNREPLAYABLE[code]
    )


OPS = [
    ("not an object", lambda r: r.update({"ops": [5]})),
    ("ops not a list", lambda r: r.update({"ops": {"0": 1}})),
    ("too many ops", lambda r: r.update({"ops": [_op()] * (step_schema.MAX_OPS + 1)})),
    ("fn not a string", lambda r: r["ops"].insert(0, _op(fn=7))),
    ("fn of no form", lambda r: r["ops"].insert(0, _op(fn="add"))),
    ("args not a list", lambda r: r["ops"].insert(0, _op(args={"0": 1}))),
    ("kwargs not a dict", lambda r: r["ops"].insert(0, _op(kwargs=[1]))),
    ("33 kwargs", lambda r: r["ops"].insert(0, _op(kwargs={f"k{i}": 1 for i in range(33)}))),
    ("new not a pair", lambda r: r["ops"].insert(0, _op(new=[["v900"]]))),
    ("new not a list", lambda r: r["ops"].insert(0, _op(new=[("0", "v900")]))),
    ("new index not an int", lambda r: r["ops"].insert(0, _op(new=[["0", "v900"]]))),
    ("new index past 64", lambda r: r["ops"].insert(0, _op(new=[[65, "v900"]]))),
    ("new name of no form", lambda r: r["ops"].insert(0, _op(new=[[0, "arena2"]]))),
    ("new name not a string", lambda r: r["ops"].insert(0, _op(new=[[0, 900]]))),
    ("unsupported not a list", lambda r: r.update({"unsupported": "x"})),
    ("output not a dict", lambda r: r.update({"output": [1]})),
    ("kernels on the CPU", lambda r: r.update({"kernels": [KERNEL]})),
]  # fmt: skip
KERNEL = {"id": "k0_fn", "name": "fn", "cubin": "AAAA", "shared": 0, "num_warps": 4}


@pytest.mark.parametrize("edit", [e for _, e in OPS], ids=[n for n, _ in OPS])
def test_a_malformed_recording_is_forged(edit) -> None:
    rec = copy.deepcopy(GOOD)
    edit(rec)
    with pytest.raises(Bad) as exc:
        step_schema.validate(rec, "cpu", {})
    assert exc.value.code == "forged_recording"
    with pytest.raises(Bad):
        step_schema.validate([rec], "cpu", {})


def test_a_gpu_recordings_launch_names_its_storages_kernel_and_scratch() -> None:
    """On a GPU a recording carries launches: their kernels join the role's, their pointers name
    the step's storages, their scratch travels with its size, and `uses` lists the kernels."""
    launch = {"op": "launch", "kernel": "k0_fn", "grid": [2, 1, 1],
              "params": [{"k": "ptr", "buf": "arena", "offset": 256},
                         {"k": "scalar", "type": "i32", "value": 5},
                         {"k": "scratch", "which": "global", "nbytes": 128}]}  # fmt: skip
    out = {"t": "arena", "o": 0, "s": [4, 256], "st": [256, 1], "d": "float16"}
    rec = {"ops": [launch], "kernels": [KERNEL], "unsupported": [], "output": out}
    kernels: dict[str, Any] = {}
    prog = step_schema.validate(rec, "cuda", kernels)
    assert list(kernels) == ["k0_fn"] and prog["uses"] == ["k0_fn"]
    first = prog["ops"][0]
    assert first["params"][0] == {"k": "ptr", "buf": "arena", "offset": 256}
    assert first["scratch"] == {"s0_global": 128} and first["params"][2]["buf"] == "s0_global"
    rec["ops"][0] = {**launch, "params": [{"k": "ptr", "buf": "v999", "offset": 0}]}
    with pytest.raises(Bad):  # a pointer into no storage the step had then
        step_schema.validate(rec, "cuda", {})
    rec["kernels"] = []  # a kernel sent with an earlier recording of the role is known
    step_schema.validate({**rec, "ops": [launch]}, "cuda", dict(kernels))
    with pytest.raises(Bad):  # and one never sent is not
        step_schema.validate({**rec, "ops": [launch]}, "cuda", {})

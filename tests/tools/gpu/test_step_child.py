"""The candidate's process of the step verify (tools/gpu/verify/step_child.py), its ops driven in
this process one by one: what each replies, where the State's tensors live (the arena's own, on
every device: no copy of them), which tensors a step may copy out, and the harness's half of a
timed step (the lengths advanced on its own handle). The GPU path runs here on the CPU arena
with torch.cuda.synchronize counted and every move to "cuda" recorded (there must be none);
the device arena's sharing: test_step_arena.py; the real device is tests/gpu/'s and the
sandboxed process tests/tools/integrity/test_step_cheats.py's."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import wire
from harnesslab.tools.gpu.verify import step_arena
from harnesslab.tools.gpu.verify.step_child import StepChild, _load
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
CONFIG = {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "max_seq": 16, "batch": 2,
          "vocab": 32, "dtype": "float16", "ffn": None, "rope_theta": 10000.0, "eps": 1e-5}  # fmt: skip

KERNEL = textwrap.dedent(
    """
    import torch

    MODE = "ok"
    SEEN = []


    class Sub(torch.Tensor):
        pass


    def step(state, tokens):
        SEEN.append((list(state.host_lengths), tokens.clone()))
        tokens.fill_(-1)  # the candidate's copy of the tokens, never the arena's
        out = torch.full((state.config.batch, state.config.vocab), 2.0, dtype=torch.float16)
        if MODE == "raise":
            raise KeyError("text the candidate chose")
        if MODE == "write_cache":
            state.kv_cache.fill_(3.0)
        if MODE == "rebind_lengths":
            state.lengths = torch.zeros_like(state.lengths)
        if MODE == "tuple":
            return (out,)
        if MODE == "shape":
            return out[:1]
        if MODE == "dtype":
            return out.float()
        if MODE == "subclass":
            return out.as_subclass(Sub)
        return out
    """
)


class Child:
    """A StepChild over a real arena (step_arena's layout), its replies read back."""

    def __init__(self, tmp: Path, entry: str = "kernel.py:step") -> None:
        (tmp / "cand").mkdir(exist_ok=True)
        (tmp / "cand" / "kernel.py").write_text(KERNEL)
        self.config = _ref().Config(**{k: v for k, v in CONFIG.items() if v is not None})
        self.layout, size = step_arena.layout(self.config)
        self.arena = step_arena.HostArena.create(torch, size, str(tmp))
        self.views = self.arena.views(self.layout)
        self.r, w = os.pipe()
        cfg = {"device": "cpu", "candidate_dir": str(tmp / "cand"), "entry": entry,
               "reference": str(TASK.root / "reference.py"), "memfd": self.arena.fd}  # fmt: skip
        self.child = StepChild(cfg, w)

    def do(self, op: str, **msg: Any) -> dict[str, Any]:
        handler = {"arena": "map_arena"}.get(op, op)
        getattr(self.child, handler)({"op": op, **msg})
        return wire.recv(self.r, timeout_s=5)

    def ready(self) -> Child:
        assert self.do("load") == {"ok": True, "error": ""}
        assert self.do("arena", size=self.arena.size) == {"ok": True}
        cfg = {k: getattr(self.config, k) for k in CONFIG}
        assert self.do("trace", layout=self.layout, config=cfg) == {"ok": True}
        return self

    @property
    def cand(self) -> Any:
        return sys.modules["_hl_candidate"]


def _ref() -> Any:
    from harnesslab.tools.gpu.runner import load_module

    return load_module(TASK.root / "reference.py", "decode_step_reference_child")


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    yield c
    for name in ("_hl_candidate", "_hl_step_reference"):  # a later verify in this process would
        sys.modules.pop(name, None)  # refuse to run beside a candidate's module


def test_load_imports_the_entry_and_the_reference(child: Child) -> None:
    assert child.do("load") == {"ok": True, "error": ""}
    assert child.child.fn is child.cand.step
    assert child.child.ref is sys.modules["_hl_step_reference"] and child.child.ref.Config


@pytest.mark.parametrize(
    ("source", "entry", "error"),
    [(KERNEL, "kernel.py:missing", "no_entry"), (KERNEL + "\nnot_callable = 1\n",
      "kernel.py:not_callable", "no_entry"), ("raise KeyError('x')\n", "kernel.py:step", "KeyError"),
     ("import harnesslab_no_such\n", "kernel.py:step", "ModuleNotFoundError"),
     (KERNEL, "nofile.py:step", "FileNotFoundError"),
     (KERNEL, "kernel.py:step:x", "no_entry")],
)  # fmt: skip
def test_a_failed_load_replies_a_fixed_error(tmp_path: Path, source, entry, error) -> None:
    c = Child(tmp_path, entry)
    (tmp_path / "cand" / "kernel.py").write_text(source)
    try:
        assert c.do("load") == {"ok": False, "error": error}
    finally:
        sys.modules.pop("_hl_candidate", None)
        sys.modules.pop("_hl_step_reference", None)


def test_load_raises_nothing_through_for_a_spec_it_cannot_make() -> None:
    with pytest.raises(ImportError):
        _load("/no/such/dir/", "_hl_test_nothing")  # a folder: no loader for it


def test_on_the_cpu_the_states_tensors_are_the_arenas_own(child: Child) -> None:
    child.ready()
    state, views = child.child.state, child.views
    cfg = child.config
    assert repr(state.config) == repr(cfg) and state.host_lengths == [0] * cfg.batch
    mine = {"kv_cache": state.kv_cache, "lengths": state.lengths, "rope_cos": state.rope_cos,
            "rope_sin": state.rope_sin, **{f"w.{k}": w for k, w in state.weights.items()}}  # fmt: skip
    assert sorted(mine) == sorted(n for n in views if n not in ("tokens", "logits"))
    for i, (name, t) in enumerate(mine.items()):
        assert t.shape == views[name].shape and t.dtype == views[name].dtype, name
        views[name].fill_(i + 1)  # the parent's writes land in the child's State (one memfd)
        assert bool((t == i + 1).all()), name


def test_a_step_gets_the_lengths_sent_and_a_copy_of_the_arenas_tokens(child: Child) -> None:
    child.ready()
    child.views["tokens"].copy_(torch.tensor([5, 6]))
    child.views["logits"].fill_(float("nan"))
    assert child.do("step", host_lengths=[3.0, 7]) == {"error": "", "copied": True}
    ((lengths, tokens),) = child.cand.SEEN
    assert lengths == [3, 7] and all(type(n) is int for n in lengths)
    assert tokens.tolist() == [5, 6] and tokens.dtype == torch.int64
    assert child.views["tokens"].tolist() == [5, 6]  # the step's fill(-1) hit its own copy
    assert bool((child.views["logits"] == 2.0).all())


@pytest.mark.parametrize("mode", ["tuple", "shape", "dtype", "subclass"])
def test_only_a_plain_tensor_of_the_slots_shape_and_dtype_is_copied(child: Child, mode) -> None:
    child.ready()
    child.cand.MODE = mode
    child.views["logits"].fill_(float("nan"))
    assert child.do("step", host_lengths=[1, 1]) == {"error": "", "copied": False}
    assert bool(child.views["logits"].isnan().all())


def test_a_step_that_raises_replies_its_kind_and_copies_nothing(child: Child) -> None:
    child.ready()
    child.cand.MODE = "raise"
    child.views["logits"].fill_(float("nan"))
    assert child.do("step", host_lengths=[1, 1]) == {"error": "KeyError", "copied": False}
    assert child.do("timed_step", host_lengths=[1, 1]) == {"error": "KeyError", "copied": False}
    assert bool(child.views["logits"].isnan().all())
    assert child.views["lengths"].tolist() == [0, 0]  # a failed timed step advances nothing


def test_a_timed_step_advances_the_lengths_on_the_harnesss_own_handle(child: Child) -> None:
    child.ready()
    child.cand.MODE = "rebind_lengths"  # the candidate rebinds state.lengths: the harness's stays
    assert child.do("timed_step", host_lengths=[0, 0]) == {"error": "", "copied": True}
    assert child.views["lengths"].tolist() == [1, 1]
    assert child.do("timed_step", host_lengths=[1, 1], more=True) == {"error": "", "copied": True}
    assert child.views["lengths"].tolist() == [2, 2]
    assert child.do("step", host_lengths=[2, 2]) == {"error": "", "copied": True}
    assert child.views["lengths"].tolist() == [2, 2]  # a checked step leaves them to the parent


class Device:
    """The GPU path on the CPU arena: every move to "cuda" recorded (and made on the CPU),
    torch.cuda.synchronize counted (or failing), then the trace built again as a GPU child
    builds it."""

    def __init__(self, child: Child, monkeypatch: pytest.MonkeyPatch) -> None:
        to = torch.Tensor.to

        self.moved: list[str] = []  # the devices asked for
        moved = self.moved

        def to_cpu(self, *args, **kwargs):
            moved.extend(a for a in args if isinstance(a, str))
            args = tuple("cpu" if a == "cuda" else a for a in args)
            return to(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to_cpu)
        self.syncs, self.fail = 0, False

        def synchronize() -> None:
            self.syncs += 1
            if self.fail:
                raise RuntimeError("an illegal memory access")

        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        child.child.cuda = True
        cfg = {k: getattr(child.config, k) for k in CONFIG}
        assert child.do("trace", layout=child.layout, config=cfg) == {"ok": True}
        self.trace_syncs, self.syncs = self.syncs, 0


def test_on_a_gpu_too_the_states_tensors_are_the_arenas_own_with_no_copy(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    child.ready()
    dev = Device(child, monkeypatch)
    state, views = child.child.state, child.views
    mine = {"kv_cache": state.kv_cache, "lengths": state.lengths, "rope_cos": state.rope_cos,
            "rope_sin": state.rope_sin, **{f"w.{k}": w for k, w in state.weights.items()}}  # fmt: skip
    assert sorted(mine) == sorted(n for n in views if n not in ("tokens", "logits"))
    for i, (name, t) in enumerate(mine.items()):
        views[name].fill_(i + 1)  # the parent's writes are what the step reads
        assert bool((t == i + 1).all()), name
    assert dev.moved == [] and dev.trace_syncs == 0


def test_on_a_gpu_a_checked_step_reads_the_parents_poison_in_place_and_synchronises(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    child.ready()
    dev = Device(child, monkeypatch)
    child.cand.MODE = "write_cache"
    child.views["kv_cache"].fill_(1.0)  # the parent's prompts and poison
    child.views["lengths"].fill_(5)
    seen = []
    inner = child.cand.step

    def step(state, tokens):  # what the step found when it started
        seen.append((state.kv_cache.clone(), state.lengths.clone()))
        return inner(state, tokens)

    child.child.fn = step
    assert child.do("step", host_lengths=[5, 5]) == {"error": "", "copied": True}
    ((cache, lengths),) = seen
    assert bool((cache == 1.0).all()) and lengths.tolist() == [5, 5]
    assert bool((child.views["kv_cache"] == 3.0).all())  # the step's writes, in the arena
    assert dev.syncs == 1 and dev.moved == []


def test_on_a_gpu_a_fault_at_the_synchronize_is_the_steps_error(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    child.ready()
    dev = Device(child, monkeypatch)
    dev.fail = True
    assert child.do("step", host_lengths=[0, 0]) == {"error": "RuntimeError", "copied": True}
    assert child.do("timed_step", host_lengths=[0, 0]) == {"error": "RuntimeError",
                                                           "copied": True}  # fmt: skip
    dev.fail = False
    child.cand.MODE = "raise"
    syncs = dev.syncs
    assert child.do("step", host_lengths=[0, 0]) == {"error": "KeyError", "copied": False}
    assert dev.syncs == syncs  # the step's own error is the reply: no synchronize after it


def test_on_a_gpu_a_timed_step_works_in_the_arena_and_copies_nothing(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    child.ready()
    dev = Device(child, monkeypatch)
    c = child.child
    child.views["kv_cache"].fill_(1.0)
    child.views["lengths"].fill_(4)
    child.cand.MODE = "write_cache"
    r, w = os.pipe()
    c.fd_in = r
    os.write(w, b"x")  # the next request is already readable: no wait
    assert child.do("timed_step", host_lengths=[4, 4], more=True) == {"error": "", "copied": True}
    assert dev.syncs == 1 and child.views["lengths"].tolist() == [5, 5]
    assert bool((child.views["kv_cache"] == 3.0).all())  # the step wrote the arena itself
    assert dev.moved == []
    os.close(r)
    os.close(w)


def test_after_a_timed_step_with_more_the_child_waits_for_the_next_request_on_a_gpu_only(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    child.ready()
    waits: list[bool] = []
    monkeypatch.setattr(child.child, "spin_for_request", lambda: waits.append(True))
    child.do("timed_step", host_lengths=[0, 0], more=True)
    assert waits == []  # the CPU: a spin would take the core the parent needs
    Device(child, monkeypatch)
    child.do("timed_step", host_lengths=[1, 1], more=False)
    child.do("timed_step", host_lengths=[2, 2])
    assert waits == []
    child.do("timed_step", host_lengths=[3, 3], more=True)
    assert waits == [True]


def test_the_spin_ends_when_a_request_is_readable_or_at_its_limit() -> None:
    c = StepChild.__new__(StepChild)
    r, w = os.pipe()
    c.fd_in = r
    import time

    t0 = time.monotonic()
    c.spin_for_request(limit_s=0.05)
    assert 0.05 <= time.monotonic() - t0 < 1.0
    os.write(w, b"x")
    t0 = time.monotonic()
    c.spin_for_request(limit_s=5.0)
    assert time.monotonic() - t0 < 1.0
    os.close(r)
    os.close(w)


def test_serve_answers_each_op_with_its_handler_until_the_requests_end(child: Child) -> None:
    r, w = os.pipe()
    cfg = {k: getattr(child.config, k) for k in CONFIG}
    for msg in ({"op": "load"}, {"op": "arena", "size": child.arena.size},
                {"op": "trace", "layout": child.layout, "config": cfg},
                {"op": "step", "host_lengths": [0, 0]},
                {"op": "timed_step", "host_lengths": [0, 0]},
                {"op": "push"},  # unknown since the State is the arena (step_timed.py)
                {"op": "step", "host_lengths": [1, 1]}):  # fmt: skip
        wire.send(w, msg)
    os.close(w)
    child.child.serve(r)
    assert child.child.fd_in == r
    replies = []
    for _ in range(5):
        replies.append(wire.recv(child.r, timeout_s=5))
    assert replies == [{"ok": True, "error": ""}, {"ok": True}, {"ok": True},
                       {"error": "", "copied": True}, {"error": "", "copied": True}]  # fmt: skip
    with pytest.raises(wire.WireError):  # an unknown op ended it: the last step had no reply
        wire.recv(child.r, timeout_s=0.2)
    os.close(r)


def test_the_cpu_child_runs_torch_on_one_thread(child: Child, monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    StepChild({"device": "cpu"}, 1)
    assert calls == [1]
    StepChild({"device": "cuda"}, 1)
    assert calls == [1]


def test_the_arena_op_maps_the_parents_memfd_at_its_size(child: Child) -> None:
    child.views["lengths"].copy_(torch.tensor([9, 8], dtype=torch.int32))
    assert child.do("arena", size=child.arena.size) == {"ok": True}
    arena = child.child.arena
    assert type(arena) is step_arena.HostArena and arena.size == child.arena.size
    got = arena.views(child.layout)["lengths"]
    assert got.tolist() == [9, 8] and got.dtype == torch.int32 and list(got.shape) == [2]

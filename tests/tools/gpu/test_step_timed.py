"""The step verify's timed pass (tools/gpu/verify/step_timed.py) in process, with a child that
answers in this interpreter (the eager step over the parent's State) and a lock that logs its
holds: the order of the work, which no verdict shows.

- Within a segment the timed steps go back to back: no reference_step, push or pull between
  two of them; the reference runs after the segment, over every stored step.
- Every timed step runs with the GPU lock held alone; the segment boundaries (pull, prefill,
  push) and the reference with it shared.
- A segment's first timed step follows a push; after the pass a pull comes before the cache
  check. Every timed request but a segment's last says "more" (the child waits for it awake). Every timed step has a time, and the pass passes the eager step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harnesslab.tools.gpu import runner, step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.gpu.verify import step_guard, step_timed
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")


class Lock:
    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log, self.mode = log, ""

    @contextlib.contextmanager
    def _hold(self, mode: str) -> Iterator[None]:
        assert not self.mode, "a hold inside a hold"
        self.mode = mode
        try:
            yield
        finally:
            self.mode = ""

    def work(self):
        return self._hold("work")

    def exclusive(self):
        return self._hold("exclusive")


class Kid:
    """step_child.py's ops on the CPU, in this process: the State's tensors are the views."""

    def __init__(self, ref, state, step, lock: Lock, log: list[tuple[str, str]]) -> None:
        self.ref, self.state, self.step, self.lock, self.log = ref, state, step, lock, log
        self.more: list[bool] = []  # each timed request's "more": another of its segment follows

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        op = msg["op"]
        self.log.append((op, self.lock.mode))
        if op != "timed_step":
            return {}, 0.0
        self.more.append(msg["more"])
        self.state.host_lengths = list(msg["host_lengths"])
        out = self.step(self.state, self.state.tokens.clone())
        self.state.logits.copy_(out)
        self.state.lengths += 1
        return {"copied": True}, 5.0


def timed_pass(kid_type: type | None = None) -> tuple[Any, ...]:
    """One timed pass of the eager step over a small dynamic trace, in process: (samples, the
    trace's record, the log of ops and lock modes, the kid, the trace, the config)."""
    ref = load_module(TASK.root / "reference.py", "decode_step_reference_timed")
    eager = load_module(TASK.workspace_template / "kernel.py", "decode_step_eager_timed")
    config = ref.Config(**TASK.step.interpreter.model_dump(), dtype="float16")  # type: ignore[union-attr]
    trace = step_trace.dynamic_trace(config, buckets=[16, 32, 64], steps_per_segment=3,
                                     segments_per_bucket=1, seed=5)  # fmt: skip
    log: list[tuple[str, str]] = []
    lock = Lock(log)
    truth = ref.new_state(config, seed=7)
    mine = ref.new_state(config, seed=7)  # the candidate's: the same weights, its own cache
    views = {"kv_cache": mine.kv_cache, "lengths": mine.lengths,
             "tokens": torch.zeros(config.batch, dtype=torch.int64),
             "logits": torch.zeros(config.batch, config.vocab, dtype=config.torch_dtype)}  # fmt: skip
    mine.tokens, mine.logits = views["tokens"], views["logits"]
    cand = ref.State(config=config, weights={}, kv_cache=views["kv_cache"],
                     lengths=views["lengths"], host_lengths=[0] * config.batch,
                     rope_cos=truth.rope_cos, rope_sin=truth.rope_sin)  # fmt: skip

    reference_step = ref.reference_step

    def logged_reference(state, tokens):
        log.append(("reference", lock.mode))
        return reference_step(state, tokens)

    ref.reference_step = logged_reference
    verify = step_guard.StepVerify.__new__(step_guard.StepVerify)
    verify.torch, verify.ref, verify.rt, verify.lock = torch, ref, runner, lock
    verify.env = type("Env", (), {"device": "cpu"})()
    verify.req = {"tolerances": {"float16": TASK.tolerances["float16"].model_dump()}}
    rec: dict[str, Any] = {"name": "t", "codes": []}
    kid = (kid_type or Kid)(ref, mine, eager.step, lock, log)
    kid.segments = len(step_timed.segments(trace, 2, config.vocab))
    samples = step_timed.TimedPass(verify, kid, views, truth, cand, rec).run(trace, 2)
    return samples, rec, log, kid, trace, config


def test_timed_steps_go_back_to_back_under_the_lock_alone_and_the_reference_after() -> None:
    samples, rec, log, kid, trace, config = timed_pass()

    assert rec["codes"] == [], rec["codes"]
    segments = step_timed.segments(trace, 2, config.vocab)
    assert len(samples) == sum(len(steps) for _, steps in segments) and set(samples) == {5.0}
    ops = [op for op, _ in log]
    for op, mode in log:
        assert mode == ("exclusive" if op == "timed_step" else "work"), (op, mode)
    # Per segment: [pull,] push, its timed steps back to back, then the reference over them.
    at = 0
    for n, (_, steps) in enumerate(segments):
        head = ["pull", "push"] if n else ["push"]
        k = len(steps)
        assert ops[at : at + len(head) + 2 * k] == head + ["timed_step"] * k + ["reference"] * k
        at += len(head) + 2 * k
    # The child waits awake for a segment's next request only: "more" on all but each last one.
    assert kid.more == [i + 1 < len(steps) for _, steps in segments for i in range(len(steps))]
    assert ops[at:] == ["pull"]


class ForgetfulKid(Kid):
    """Right logits on every step, but the last timed step of the pass leaves the cache as it
    was: only the cache check after the pass can tell."""

    pulls = 0

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        if msg["op"] == "timed_step":
            self.last = self.state.kv_cache.clone()
        if msg["op"] == "pull":
            self.pulls += 1
            if self.pulls == self.segments:  # the pull after the pass (one per later segment)
                self.state.kv_cache.copy_(self.last)  # undo the last step's cache write
        return super().ask(msg, spin=spin)


def test_a_cache_left_unwritten_by_the_last_timed_step_fails_the_check_after_the_pass() -> None:
    samples, rec, _, _, trace, config = timed_pass(ForgetfulKid)
    assert [c[0] for c in rec["codes"]] == ["wrong_kv_cache"], rec["codes"]
    assert "after the timed pass" in rec["codes"][0][1]
    segments = step_timed.segments(trace, 2, config.vocab)
    assert len(samples) == sum(len(steps) for _, steps in segments)  # every step was timed

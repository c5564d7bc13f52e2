"""The step verify's timed pass (tools/gpu/verify/step_timed.py) in process, with a child that
answers in this interpreter (the eager step over the parent's State, as step_child.py's ops do on
the CPU) and a lock that logs its holds: the order of the work, which no verdict shows, and each
failure the pass must report.

- Within a segment the timed steps go back to back: no reference_step between two of them;
  the reference runs after the segment, over every stored step. The child gets no request but
  timed steps (no push or pull: an untimed turn after the poison or before the cache check).
- Every timed step runs with the GPU lock held alone; the segment boundaries (prefill, poison)
  and the reference with it shared.
- A segment's first timed step finds its prompts written and every stale slot poisoned. Every
  timed request but a segment's last says "more" (the child waits for it awake), and carries
  the lengths the trace gives that step. Every timed step has its time, the reply's (and on a
  GPU the parent's synchronised read of its logits), and nothing else does.
- A failure (the child's error, logits not copied, wrong or unwritten logits, lengths changed,
  the cache left unwritten) is the trace's reason, the pass ends there (no request after it),
  and the steps timed until then are all its samples.
- With replay processes as the kids (`programs`: step_replay.py): each segment's recorded
  programs prepared before its prompts and poison, each timed step naming its program (its
  index in the trace), the segment's programs dropped after its check; a replay process that
  cannot prepare them fails the candidate (its reason) or drops the incumbent.
- With an incumbent: each segment timed in halves A B B A, then B A A B (step_timed.blocks), each
  side's steps in order on its own State; a block's first tokens written only just before it;
  one reference run for both; an incumbent that fails (a check, an error, its process) leaves
  the pass and the verify while the candidate's pass goes on; a candidate's failure ends it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.step_support import expected_lengths
from harnesslab.tools.gpu import runner, step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.gpu.verify import step_guard, step_timed
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
REF = load_module(TASK.root / "reference.py", "decode_step_reference_timed")
EAGER = load_module(TASK.workspace_template / "kernel.py", "decode_step_eager_timed")
CONFIG = REF.Config(**TASK.step.interpreter.model_dump(), dtype="float16")  # type: ignore[union-attr]


SYNC_US = 7.0  # what a synchronize of the parent's device takes in timed_pass (device "cuda")


def dynamic() -> dict[str, Any]:
    return step_trace.dynamic_trace(CONFIG, buckets=[16, 32, 64], steps_per_segment=3,
                                    segments_per_bucket=1, seed=5)  # fmt: skip


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
    """step_child.py's ops on the CPU, in this process: the State's tensors are the views. Every
    request is kept (with the spin it was asked with); the n-th request's reply took n us. At a
    segment's first timed step it notes whether the arena holds what the parent must have
    written: the lengths, and every stale slot poisoned."""

    role = "candidate"

    def __init__(self, ref, state, step, lock: Lock, log: list[tuple[str, str]]) -> None:
        self.ref, self.state, self.step, self.lock, self.log = ref, state, step, lock, log
        self.closed = False
        self.requests: list[dict[str, Any]] = []
        self.more: list[bool] = []  # each timed request's "more": another of its segment follows
        self.pushed: list[tuple[list[int], bool]] = []  # at each segment's first timed step:
        # (lengths, stale poisoned)
        self.timed = 0
        self.tokens: list[list[int]] = []  # the arena's tokens at each timed step

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        op = msg["op"]
        self.log.append((op if self.role == "candidate" else f"{op}@{self.role}", self.lock.mode))
        self.requests.append({**msg, "spin": spin})
        wall = float(len(self.requests))
        if op != "timed_step":
            return self.answer(op, {}), wall
        if not self.more or not self.more[-1]:  # a segment's first
            self.pushed.append((self.state.lengths.tolist(), self.poisoned()))
        self.more.append(msg["more"])
        self.timed += 1
        self.state.host_lengths = list(msg["host_lengths"])
        return self.answer(op, self.timed_step()), wall

    def timed_step(self) -> dict[str, Any]:
        self.tokens.append(self.state.tokens.tolist())
        out = self.step(self.state, self.state.tokens.clone())
        self.state.logits.copy_(out)
        self.state.lengths += 1
        return {"copied": True}

    def answer(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        return reply

    def close(self) -> None:
        self.closed = True

    def poisoned(self) -> bool:
        stale = ~_valid(self.state.kv_cache, self.state.lengths.tolist())
        by_slot = self.state.kv_cache.permute(2, 4, 0, 1, 3, 5)[stale]  # [slots, layers, 2, ...]
        keys, values = by_slot[:, :, 0], by_slot[:, :, 1]
        return bool((keys == 0).all() and (values == step_trace.POISON).all())


def _valid(cache, lengths: list[int]):
    """[batch, max_seq]: the slots within each sequence's length."""
    return torch.arange(cache.shape[4])[None, :] < torch.tensor(lengths)[:, None]


def timed_pass(kid_type: type | None = None, trace: dict[str, Any] | None = None,
               device: str = "cpu", dirty: bool = False) -> tuple[Any, ...]:  # fmt: skip
    """One timed pass of the eager step over `trace` (a small dynamic one by default), in
    process: (samples, the trace's record, the log of ops and lock modes, the kid, the trace).
    `device` is what the verify's environment says (the tensors stay on the CPU); `dirty`: both
    States hold what earlier passes left."""
    return abba_pass(kid_type, None, trace, device, dirty)[:5]


def arena_state(truth, dirty: bool) -> tuple[Any, dict[str, Any], Any]:
    """A role's State over views of its own (the same weights as `truth`): (the child's State,
    the views, the parent's handle)."""
    mine = REF.new_state(CONFIG, seed=7)  # a role's: the same weights, its own cache
    views = {"kv_cache": mine.kv_cache, "lengths": mine.lengths,
             "tokens": torch.zeros(CONFIG.batch, dtype=torch.int64),
             "logits": torch.zeros(CONFIG.batch, CONFIG.vocab, dtype=CONFIG.torch_dtype)}  # fmt: skip
    mine.tokens, mine.logits = views["tokens"], views["logits"]
    handle = REF.State(config=CONFIG, weights={}, kv_cache=views["kv_cache"],
                       lengths=views["lengths"], host_lengths=[0] * CONFIG.batch,
                       rope_cos=truth.rope_cos, rope_sin=truth.rope_sin)  # fmt: skip
    if dirty:
        handle.kv_cache.normal_()
        handle.lengths.fill_(9)
        handle.host_lengths = [9] * CONFIG.batch
    return mine, views, handle


def abba_pass(kid_type: type | None = None, inc_type: type | None = None,
              trace: dict[str, Any] | None = None, device: str = "cpu", dirty: bool = False,
              programs: bool = False) -> tuple[Any, ...]:  # fmt: skip
    """timed_pass's, with an incumbent beside the candidate when `inc_type` names its kid:
    (samples, record, log, kid, trace, the incumbent's kid, the verify)."""
    trace = trace or dynamic()
    log: list[tuple[str, str]] = []
    lock = Lock(log)
    truth = REF.new_state(CONFIG, seed=7)
    mine, views, cand = arena_state(truth, dirty)
    if dirty:
        truth.kv_cache.normal_()
        truth.lengths.fill_(9)
        truth.host_lengths = [9] * CONFIG.batch

    ref = type("Ref", (), {})()  # the reference, its step logged
    for name in ("prefill", "advance"):
        setattr(ref, name, getattr(REF, name))

    def logged_reference(state, tokens):
        log.append(("reference", lock.mode))
        return REF.reference_step(state, tokens)

    ref.reference_step = logged_reference
    verify = step_guard.StepVerify.__new__(step_guard.StepVerify)
    verify.torch, verify.ref, verify.rt, verify.lock = torch, ref, runner, lock
    verify.replay, verify.replayers = False, {}  # the candidates' own steps are timed
    verify.phases, verify.result = runner.Phases(), {}
    verify.env = type("Env", (), {"device": device})()
    now = [0.0]  # the pass's clock: it moves only when this process's device synchronises
    verify.sync = None

    def sync() -> None:  # a GPU's: the device's queued work takes SYNC_US
        log.append(("sync", lock.mode))
        now[0] += SYNC_US * 1e-6

    if device == "cuda":
        verify.sync = sync
    verify.req = {"tolerances": {"float16": TASK.tolerances["float16"].model_dump()}}
    rec: dict[str, Any] = {"name": "t", "codes": []}
    kid = (kid_type or Kid)(ref, mine, EAGER.step, lock, log)
    verify.kids = [kid]
    incumbent, inc_kid = None, None
    if inc_type is not None:
        inc_mine, inc_views, inc_state = arena_state(truth, dirty)
        inc_kid = inc_type(ref, inc_mine, EAGER.step, lock, log)
        inc_kid.role, inc_kid.other = "incumbent", kid
        verify.kids.append(inc_kid)
        incumbent = (inc_kid, inc_views, inc_state)
    timed = step_timed.TimedPass(verify, kid, views, truth, cand, rec, incumbent, programs)
    timed.clock = lambda: now[0]
    samples = timed.run(trace, 2)
    return samples, rec, log, kid, trace, inc_kid, verify


def codes(rec: dict[str, Any]) -> list[str]:
    return [c[0] for c in rec["codes"]]


def timed_requests(kid: Kid) -> list[dict[str, Any]]:
    return [r for r in kid.requests if r["op"] == "timed_step"]


def test_segments_are_the_traces_own_with_the_pass_variant_applied() -> None:
    trace = dynamic()
    segs = step_timed.segments(trace, 2, CONFIG.vocab)
    steps = list(step_trace.schedule(trace, 2, CONFIG.vocab))
    assert len(segs) == len(trace["segments"]) == 3
    assert [len(s) for _, s in segs] == [len(seg["tokens"]) for seg in trace["segments"]]
    assert [t for _, s in segs for t in s] == [t for _, t in steps]
    assert [p for p, _ in segs] == [p for p, _ in steps if p]
    # a segment that brings no prompt (every sequence kept) still starts the pass's first segment
    quiet = {**trace, "segments": [{**trace["segments"][0], "lengths": [None] * CONFIG.batch}]}
    ((prompts, toks),) = step_timed.segments(quiet, 0, CONFIG.vocab)
    assert prompts == [] and toks == trace["segments"][0]["tokens"]


def test_timed_steps_go_back_to_back_under_the_lock_alone_and_the_reference_after() -> None:
    _, rec, log, kid, trace = timed_pass()

    assert rec["codes"] == [], rec["codes"]
    segments = step_timed.segments(trace, 2, CONFIG.vocab)
    ops = [op for op, _ in log]
    for op, mode in log:
        assert mode == ("exclusive" if op == "timed_step" else "work"), (op, mode)
    # Per segment: its timed steps back to back, then the reference over them; nothing else.
    at = 0
    for _, steps in segments:
        k = len(steps)
        assert ops[at : at + 2 * k] == ["timed_step"] * k + ["reference"] * k
        at += 2 * k
    # The child waits awake for a segment's next request only: "more" on all but each last one.
    assert kid.more == [i + 1 < len(steps) for _, steps in segments for i in range(len(steps))]
    assert ops[at:] == []


def test_every_timed_step_is_sampled_with_its_replys_time_and_carries_the_traces_lengths() -> None:
    samples, rec, _, kid, trace = timed_pass()
    timed = timed_requests(kid)
    assert samples == [float(kid.requests.index(r) + 1) for r in timed]
    assert [r["host_lengths"] for r in timed] == expected_lengths(trace, CONFIG.batch)
    tokens = [t for _, steps in step_timed.segments(trace, 2, CONFIG.vocab) for t in steps]
    assert len(timed) == len(tokens) == 9
    # At each segment's first step the arena holds its prompts and every stale slot poisoned.
    firsts = [expected_lengths(trace, CONFIG.batch)[i] for i in (0, 3, 6)]
    assert kid.pushed == [(lengths, True) for lengths in firsts]
    assert "boundary_us" not in rec


@pytest.mark.parametrize("steps", [3, 5])
def test_every_timed_step_runs_on_its_own_tokens(steps: int) -> None:
    """5: a segment whose last step is not a repeat of the one before (every third step of a
    trace repeats the previous tokens)."""
    trace = step_trace.fixed_trace(CONFIG, length=5, steps=steps, seed=3)
    _, rec, _, kid, _ = timed_pass(trace=trace)
    assert rec["codes"] == [], rec["codes"]
    assert kid.tokens == [t for _, s in step_timed.segments(trace, 2, CONFIG.vocab) for t in s]


def test_the_pass_times_with_this_processs_own_clock() -> None:
    verify = step_guard.StepVerify.__new__(step_guard.StepVerify)
    verify.env = type("Env", (), {"device": "cpu"})()
    verify.sync = None
    timed = step_timed.TimedPass(verify, None, {}, None, None, {})  # type: ignore[arg-type]
    assert timed.clock is time.perf_counter and timed.sync is None and not timed.spin


def test_the_pass_starts_from_empty_states_whatever_the_earlier_passes_left() -> None:
    """A trace whose first segment gives sequence 0 no prompt: it starts at length 0 only if the
    pass reset both States (the parent's truth and the arena's)."""
    trace = dynamic()
    first = trace["segments"][0]
    trace["segments"][0] = {**first, "lengths": [None, *first["lengths"][1:]],
                            "prompt_seeds": [None, *first["prompt_seeds"][1:]]}  # fmt: skip
    _, rec, _, kid, _ = timed_pass(trace=trace, dirty=True)
    assert rec["codes"] == [], rec["codes"]
    assert [r["host_lengths"] for r in timed_requests(kid)] == expected_lengths(trace, CONFIG.batch)
    assert kid.pushed[0] == (expected_lengths(trace, CONFIG.batch)[0], True)


def test_on_a_gpu_a_timed_step_ends_once_the_parent_has_read_its_logits() -> None:
    """The slot is device memory there: the parent's read of it (and its NaN and the next
    tokens) is synchronised inside the step's time, so device work a child left running after
    its reply is timed; and before each segment's first step the prompts and poison are
    synchronised onto the device with the GPU shared, then (held alone) its first tokens."""
    samples, rec, log, kid, trace = timed_pass(device="cuda")
    assert rec["codes"] == [], rec["codes"]
    timed = timed_requests(kid)
    assert samples == pytest.approx([kid.requests.index(r) + 1 + SYNC_US for r in timed])
    at = 0
    for _, steps in step_timed.segments(trace, 2, CONFIG.vocab):
        head = [("sync", "work"), ("sync", "exclusive")]
        k = len(steps)
        assert log[at : at + len(head) + 3 * k] == head + [
            ("timed_step", "exclusive"), ("sync", "exclusive")] * k + [("reference", "work")] * k  # fmt: skip
        at += len(head) + 3 * k


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_only_timed_steps_on_a_gpu_wait_for_their_reply_spinning(device: str) -> None:
    _, rec, _, kid, _ = timed_pass(device=device)
    assert rec["codes"] == []
    assert {r["op"] for r in kid.requests} == {"timed_step"}
    assert {r["spin"] for r in timed_requests(kid)} == {device == "cuda"}


class Misbehaving(Kid):
    """Misbehaves at the `at`-th request of op `op` (0-based), in the way `how` names."""

    op, at, how = "timed_step", 0, "error"

    def now(self, op: str) -> bool:
        return op == self.op and sum(r["op"] == op for r in self.requests) == self.at + 1

    def timed_step(self) -> dict[str, Any]:
        if self.how == "unwritten" and self.now("timed_step"):  # the step, its logits kept
            self.step(self.state, self.state.tokens.clone())
            self.state.lengths += 1
            return {"copied": True}
        return super().timed_step()

    def answer(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        if self.now(op):
            if self.how == "error":
                return {"error": "ValueError"}
            if self.how == "uncopied":
                return {"copied": False}
            if self.how == "wrong":
                self.state.logits.add_(1.0)
            if self.how == "lengths":
                self.state.lengths += 1  # a second advance: the harness's lengths changed
        return reply


def misbehave(op: str, at: int, how: str, trace: dict[str, Any] | None = None) -> tuple[Any, ...]:
    kid_type = type("Kid_" + how, (Misbehaving,), {"op": op, "at": at, "how": how})
    return timed_pass(kid_type, trace=trace)


@pytest.mark.parametrize(
    ("op", "at", "where", "timed"),
    [("timed_step", 4, "timed pass segment 1 step 1", 4),
     ("timed_step", 0, "timed pass segment 0 step 0", 0),
     ("timed_step", 8, "timed pass segment 2 step 2", 8)],
)  # fmt: skip
def test_a_child_error_is_the_reason_and_ends_the_pass_there(op, at, where, timed) -> None:
    samples, rec, _, kid, _ = misbehave(op, at, "error")
    assert rec["codes"] == [["candidate_error", f"t: {where}: the step raised ValueError"]]
    assert kid.requests[-1]["op"] == op  # nothing asked after the failed request
    assert len(samples) == timed == kid.timed - (op == "timed_step")


def test_a_step_whose_logits_were_not_copied_is_wrong_shape_and_ends_the_pass() -> None:
    samples, rec, _, kid, _ = misbehave("timed_step", 4, "uncopied")
    assert codes(rec) == ["wrong_shape"] and "segment 1 step 1" in rec["codes"][0][1]
    assert kid.requests[-1]["op"] == "timed_step" and len(samples) == 4


@pytest.mark.parametrize("how", ["wrong", "unwritten"])
def test_wrong_logits_of_any_timed_step_fail_its_segments_check_and_end_the_pass(how) -> None:
    samples, rec, log, kid, _ = misbehave("timed_step", 4, how)
    assert codes(rec) == ["wrong_output"] and "segment 1 step 1" in rec["codes"][0][1]
    if how == "unwritten":  # the slot is poisoned before each step: unwritten reads as NaN
        assert "NaN" in rec["codes"][0][1]
    assert len(samples) == 6  # the whole segment was timed before its check
    assert kid.requests[-1]["op"] == "timed_step" and log[-1] == ("reference", "work")
    assert [op for op, _ in log].count("reference") == 3 + 2  # segment 0, then up to step 1


def test_lengths_a_step_changed_fail_before_the_next_segment() -> None:
    samples, rec, _, kid, _ = misbehave("timed_step", 2, "lengths")  # segment 0's last step
    assert rec["codes"] == [["lengths_modified", "t: timed pass segment 1: the step changed the "
                             "lengths"]]  # fmt: skip
    assert len(kid.requests) == 3 and len(samples) == 3
    samples, rec, _, kid, _ = misbehave("timed_step", 8, "lengths")  # the pass's last step
    assert codes(rec) == ["lengths_modified"] and "after the timed pass" in rec["codes"][0][1]
    assert len(samples) == 9


class ForgetfulKid(Kid):
    """Right logits on every step, but the last timed step of the pass leaves the cache as it
    was: only the cache check after the pass can tell."""

    steps = 9  # the pass's (dynamic(): 3 segments of 3)

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        before = self.state.kv_cache.clone()
        got = super().ask(msg, spin=spin)
        if self.timed == self.steps:  # the pass's last step
            self.state.kv_cache.copy_(before)  # its cache write undone
        return got


def test_a_cache_left_unwritten_by_the_last_timed_step_fails_the_check_after_the_pass() -> None:
    samples, rec, _, _, trace = timed_pass(ForgetfulKid)
    assert [c[0] for c in rec["codes"]] == ["wrong_kv_cache"], rec["codes"]
    assert "after the timed pass" in rec["codes"][0][1]
    segments = step_timed.segments(trace, 2, CONFIG.vocab)
    assert len(samples) == sum(len(steps) for _, steps in segments)  # every step was timed


def test_timing_is_the_p50_and_p95_of_the_finite_samples() -> None:
    assert step_timed.timing([]) == {"steps_timed": 0, "p50_us": None, "p95_us": None}
    assert step_timed.timing([math.nan, math.inf]) == {"steps_timed": 0, "p50_us": None,
                                                       "p95_us": None}  # fmt: skip
    got = step_timed.timing([3, math.nan, 1, math.inf, 2])
    assert got == {"steps_timed": 3, "p50_us": 2.0, "p95_us": pytest.approx(2.9)}
    assert isinstance(got["p50_us"], float)


# -- the incumbent beside the candidate (A B B A per segment) -------------------------------------


class Watching(Kid):
    """An incumbent's kid that notes, at each timed step, whether the candidate's arena holds
    tokens the candidate has not stepped on yet (it never should while the incumbent runs)."""

    other: Kid

    def timed_step(self) -> dict[str, Any]:
        seen = self.other.state.tokens.tolist()
        self.peeks = [*getattr(self, "peeks", []), seen in [*self.other.tokens, [0] * CONFIG.batch]]
        return super().timed_step()


def roles_of_timed_steps(log: list[tuple[str, str]]) -> list[str]:
    return ["C" if op == "timed_step" else "I" for op, _ in log if op.startswith("timed_step")]


def test_with_an_incumbent_each_segment_is_timed_in_halves_a_b_b_a_then_b_a_a_b() -> None:
    samples, rec, log, kid, trace, inc, verify = abba_pass(Kid, Watching)
    assert rec["codes"] == [] and rec["incumbent"]["codes"] == [], rec
    # dynamic(): 3 segments of 3 steps, halves of 2 and 1 steps
    assert roles_of_timed_steps(log) == list("CCIIIC" + "IICCCI" + "CCIIIC")
    assert blocks_of(log, kid, inc) == [("C", 2), ("I", 2), ("I", 1), ("C", 1), ("I", 2), ("C", 2),
                                        ("C", 1), ("I", 1), ("C", 2), ("I", 2), ("I", 1), ("C", 1)]  # fmt: skip
    # both ran the trace's own steps in order, on the same tokens and lengths, each timed
    lengths = expected_lengths(trace, CONFIG.batch)
    for k in (kid, inc):
        assert [r["host_lengths"] for r in timed_requests(k)] == lengths
        assert k.tokens == [t for _, s in step_timed.segments(trace, 2, CONFIG.vocab) for t in s]
    # a block's last request says no "more" (the other side's block comes next)
    assert kid.more == [True, False, False] * 3 and inc.more == [True, False, False] * 3
    # the candidate's tokens for a block are written only just before it: never while the
    # incumbent runs (it would have an untimed turn with work it could do ahead)
    assert inc.peeks == [True] * 9
    assert len(samples) == 9 and rec["incumbent"]["passed"] is True
    assert rec["incumbent"]["steps_timed"] == 9 and rec["incumbent"]["p50_us"] > 0
    # one reference run per step serves both: each step's logits of both compared with it
    assert [op for op, _ in log].count("reference") == 9
    assert verify.phases["incumbent"] > 0 and not inc.closed


def blocks_of(log: list[tuple[str, str]], kid: Kid, inc: Kid) -> list[tuple[str, int]]:
    """Runs of timed steps by one side, each ended by its request without "more"."""
    more = {"C": iter(kid.more), "I": iter(inc.more)}
    out: list[tuple[str, int]] = []
    open_block = False
    for role in roles_of_timed_steps(log):
        if open_block and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + 1)
        else:
            out.append((role, 1))
        open_block = next(more[role])
    return out


def test_an_incumbent_alone_in_its_half_is_still_timed_once_per_step() -> None:
    """A segment of one step: no halves; the sides alternate which goes first."""
    trace = step_trace.fixed_trace(CONFIG, length=5, steps=1, seed=3)
    _, rec, log, *_ = abba_pass(Kid, Kid, trace=trace)
    assert roles_of_timed_steps(log) == ["C", "I"] and rec["incumbent"]["steps_timed"] == 1


@pytest.mark.parametrize("how", ["wrong", "error", "uncopied", "lengths"])
def test_an_incumbent_that_fails_leaves_the_pass_and_the_candidate_goes_on(how: str) -> None:
    inc_type = type("Inc_" + how, (Misbehaving,), {"op": "timed_step", "at": 1, "how": how})
    samples, rec, log, kid, _, inc, verify = abba_pass(Kid, inc_type)
    assert rec["codes"] == [] and len(samples) == 9  # the candidate: every step, passed
    assert rec["incumbent"]["passed"] is False and len(rec["incumbent"]["codes"]) == 1
    assert inc.closed and verify.kids == [kid]
    asked_after = len(timed_requests(inc))
    assert asked_after <= 3  # nothing asked of it after the segment it failed in
    assert roles_of_timed_steps(log).count("C") == 9


class Dying(Kid):
    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        if len(self.requests) == 2:
            from harnesslab.tools.gpu.verify.guard_kid import KidFailed

            raise KidFailed("candidate_crashed", "the process died", self.role)
        return super().ask(msg, spin=spin)


def test_an_incumbent_whose_process_dies_loses_the_comparison_not_the_candidates_pass() -> None:
    samples, rec, _, kid, _, inc, verify = abba_pass(Kid, Dying)
    assert rec["codes"] == [] and len(samples) == 9
    assert rec["incumbent"]["passed"] is False
    assert "candidate_crashed" in verify.result["incumbent_error"]
    assert inc.closed and verify.kids == [kid]


def test_a_candidate_that_fails_beside_an_incumbent_ends_the_pass_at_once() -> None:
    cand_type = type("Cand_error", (Misbehaving,), {"op": "timed_step", "at": 1, "how": "error"})
    _, rec, log, _, _, inc, _ = abba_pass(cand_type, Kid)
    assert codes(rec) == ["candidate_error"] and rec["incumbent"]["passed"] is False
    assert [op for op, _ in log][-1] == "timed_step"  # nothing after the candidate's failure
    assert timed_requests(inc) == []  # its second step came before the incumbent's first block


def test_blocks_split_a_segment_in_halves_a_b_b_a_and_alternate_who_starts() -> None:
    assert step_timed.blocks(1, 5, 3) == [(0, 0, 5)]  # the candidate alone: the segment whole
    assert step_timed.blocks(2, 1, 0) == [(0, 0, 1), (1, 0, 1)]
    assert step_timed.blocks(2, 2, 0) == [(0, 0, 1), (1, 0, 1), (1, 1, 2), (0, 1, 2)]
    assert step_timed.blocks(2, 4, 1) == [(1, 0, 2), (0, 0, 2), (0, 2, 4), (1, 2, 4)]
    assert step_timed.blocks(2, 5, 2) == [(0, 0, 3), (1, 0, 3), (1, 3, 5), (0, 3, 5)]


def test_the_candidates_time_is_its_phase_and_the_incumbents_its_own() -> None:
    *_, verify = abba_pass(Kid, None)
    assert verify.phases["timed"] > 0 and "incumbent" not in verify.phases
    *_, verify = abba_pass(Kid, Kid)
    assert verify.phases["timed"] > 0 and verify.phases["incumbent"] > 0


def test_an_incumbent_that_changed_its_lengths_is_caught_at_the_next_segment() -> None:
    inc_type = type("Inc_lengths", (Misbehaving,), {"op": "timed_step", "at": 2, "how": "lengths"})
    _, rec, _, kid, _, inc, verify = abba_pass(Kid, inc_type)
    assert rec["codes"] == [] and rec["incumbent"]["passed"] is False
    assert rec["incumbent"]["codes"] == [
        ["lengths_modified", "t: timed pass segment 1: the step changed the lengths"]
    ]
    assert inc.closed and verify.kids == [kid]


class ForgetfulLengths(ForgetfulKid):
    """The pass's last step leaves the cache unwritten and changes the lengths too."""

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        got = super().ask(msg, spin=spin)
        if self.timed == self.steps:
            self.state.lengths += 1
        return got


@pytest.mark.parametrize(
    ("inc_type", "code"),
    [(ForgetfulKid, "wrong_kv_cache"), (ForgetfulLengths, "lengths_modified")],
)
def test_an_incumbent_that_fails_after_the_pass_has_one_reason_and_no_figures(inc_type, code):
    samples, rec, _, kid, _, inc, verify = abba_pass(Kid, inc_type)
    assert rec["codes"] == [] and len(samples) == 9
    assert [c[0] for c in rec["incumbent"]["codes"]] == [code]
    assert "after the timed pass" in rec["incumbent"]["codes"][0][1]
    assert rec["incumbent"]["passed"] is False and "p50_us" not in rec["incumbent"]
    assert inc.closed and verify.kids == [kid]


def test_an_incumbent_beside_a_candidate_that_failed_after_the_pass_is_not_passed() -> None:
    _, rec, *_ = abba_pass(ForgetfulKid, Kid)
    assert [c[0] for c in rec["codes"]] == ["wrong_kv_cache"]
    assert rec["incumbent"]["codes"] == [] and rec["incumbent"]["passed"] is False


class Replayer(Kid):
    """step_replay.py's ops on top of Kid's: "prepare" writes each sequence's next slot (as its
    first untimed run writes this token's keys and values), "drop" is answered (a PrepareFails
    replay process raises in its first prepare)."""

    def answer(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        if op == "prepare" and getattr(self, "fails", False):
            return {"error": "RuntimeError"}
        if op == "prepare":
            for b, n in enumerate(self.state.lengths.tolist()):
                self.state.kv_cache[:, :, b, :, min(n, CONFIG.max_seq - 1)] = 1.0
        return reply


class PrepareFails(Replayer):
    fails = True


def test_replayed_segments_are_prepared_before_their_poison_and_name_their_programs() -> None:
    _, rec, log, kid, trace, *_ = abba_pass(Replayer, programs=True)
    assert rec["codes"] == [], rec["codes"]
    sizes = [len(seg["tokens"]) for seg in trace["segments"]]
    firsts = [sum(sizes[:i]) for i in range(len(sizes))]
    keys = [list(range(f, f + n)) for f, n in zip(firsts, sizes, strict=True)]
    asked = [r for r in kid.requests if r["op"] in ("prepare", "drop")]
    assert asked == [r for k in keys for r in ({"op": "prepare", "keys": k, "spin": False},
                                               {"op": "drop", "keys": k, "spin": False})]  # fmt: skip
    # every timed step names its program: its index in the trace, in order
    assert [r["program"] for r in timed_requests(kid)] == list(range(sum(sizes)))
    # a segment's programs are prepared before it (the lock shared), its first timed step still
    # finds every stale slot poisoned, and they are dropped after its reference check
    ops = [op for op, _ in log if op in ("prepare", "timed_step", "reference", "drop")]
    for n in sizes:
        assert ops[: 2 * n + 2] == ["prepare", *["timed_step"] * n, *["reference"] * n, "drop"]
        ops = ops[2 * n + 2 :]
    assert all(mode == "work" for op, mode in log if op in ("prepare", "drop"))
    assert all(poisoned for _, poisoned in kid.pushed)


def test_a_replay_that_cannot_prepare_fails_the_candidate_or_drops_the_incumbent() -> None:
    samples, rec, _, kid, *_ = abba_pass(PrepareFails, programs=True)
    assert codes(rec) == ["candidate_error"] and "could not prepare" in rec["codes"][0][1]
    assert samples == [] and not timed_requests(kid)
    samples, rec, _, kid, _, inc, verify = abba_pass(Replayer, PrepareFails, programs=True)
    assert rec["codes"] == [] and len(samples) == 9 and verify.kids == [kid]
    assert rec["incumbent"]["passed"] is False and inc.closed and not timed_requests(inc)


class DiesAtDrop(Replayer):
    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        if msg["op"] == "drop":
            from harnesslab.tools.gpu.verify.guard_kid import KidFailed

            raise KidFailed("candidate_crashed", "the process died", self.role)
        return super().ask(msg, spin=spin)


def test_an_incumbents_replay_that_dies_dropping_programs_loses_only_the_comparison() -> None:
    """A replay process lost between segments (its "drop") is the incumbent's failure, as one
    lost at a timed step is; the candidate's pass goes on over every segment."""
    samples, rec, _, kid, _, inc, verify = abba_pass(Replayer, DiesAtDrop, programs=True)
    assert rec["codes"] == [] and len(samples) == 9 and verify.kids == [kid]
    assert rec["incumbent"]["passed"] is False and inc.closed
    assert "candidate_crashed" in verify.result["incumbent_error"]

"""The timed pass of a step task's guarded verify, trusted parent side (step_guard.py runs it on
each hidden trace after its checked passes have passed): the step's latency as this process's
own clock sees it, every timed step's logits and the cache after the pass checked as in the
checked passes.

Staged beside step_guard.py (standard library + torch); trusted: it never runs agent Python,
and every number it records comes from this process's clock, never from the child's replies.

The pass has its own tokens and prompts (step_trace.schedule's variant PASSES), and the
candidate's State is the shared arena (step_arena.py: device memory on a GPU), resident where
its step runs: nothing is copied around a step. Per segment of the trace (new prompts:
continuous batching):
1. untimed, the GPU lock shared: the lengths checked (the child advanced them), the prompts
   prefilled and every stale slot poisoned in the arena (as in the checked passes), the first
   step's tokens and a NaN logits slot written, this process's device synchronised. No request
   to the child there (its former "push" and "pull", the copies of its State to and from its
   device, were untimed turns right after the poison, to undo it, or right before the cache
   check, to write what its timed steps left out): every turn it gets from the poison to the
   check is a timed step;
2. timed, the GPU lock held alone (phase_lock.exclusive, as the kernel verify's timed window):
   the segment's steps BACK TO BACK: per step the request sent, its reply awaited, then the
   step's logits copied out of the slot here, NaN written into the slot and the next step's
   tokens into the arena, and this process's device synchronised: a step's time runs from
   sending its request to the end of that synchronize, taken by this process's clock. The next
   request goes at once, so the candidate has no idle gap between timed steps in which to do
   work that does not need the tokens;
3. untimed, the lock shared: reference_step over the segment's stored tokens (the truth state
   advanced in lockstep) and every stored logits tensor compared with the tolerance.
After the last segment: the lengths and the cache's valid slots compared.

With an incumbent (step_guard.py 5.) the pass times it beside the candidate: each side has its
own arena, child and State, prefilled and poisoned alike at a segment's start, and the
segment's timed steps go in blocks (blocks()): its halves A B B A in even segments, B A A B in
odd ones (A the candidate). Why halves of segments: the score is a p50 over a trace's steps and
the host drifts (the same eager step scored 27204.9 and 22030.2 us in two verifies on an H100,
host-launch-bound), so the two sides must share the same stretch of time. Whole passes A B B A
would double each side's timed steps (four passes for two) and still leave each pass's
seconds of drift between the sides; single steps interleaved would make each side's time
something no run_objective measures (another process's step between any two of its steps,
its next request no longer at once) and give both children an idle gap every step. Halves of
a segment keep each side's steps back to back as in the dev objective, put both sides in the
same ~tens of ms of every segment, and cost per side one block boundary more per segment (a
request that finds the child asleep: `more` is false at a block's end, as at a segment's).
A block's first tokens are written just before its first request, so a side waiting for its
block holds no tokens it has not stepped on. The reference runs once per step for both; the
incumbent's stored logits and its cache after the pass are checked as the candidate's are,
and an incumbent that fails one of them, or whose process fails, leaves the pass and the
verify (StepVerify.drop_incumbent, Roles.lose_incumbent) while the candidate's pass goes on.
Not prevented: the candidate's process runs while the incumbent's blocks are timed (it is not
stopped), so a thread of its own could load the host or the GPU then, and slow the incumbent;
the host therefore never promotes a candidate on this comparison alone (incumbent.settle_best's
`contested`).

What the time means: a decode step's latency as the trusted parent observes it through the
sandbox's boundary: the step and its synchronize, a fixed IPC round trip (two pipe frames), and
this process's read of the logits with its writes for the next step (one copy of batch x vocab
values on the device, a fill, a few tokens: the same for every candidate). The read is inside
the time because on a GPU the slot is device memory the child writes: a child that replied
before its device work finished gains nothing, since this process's copy of the slot either
runs after that work (the GPU takes the two processes' contexts in turn), inside the time, or
finds the slot unwritten (NaN: rejected). With the slot in host memory, as before, the child's
own blocking copy to it was that barrier. On the CPU (the Triton interpreter) it is recorded
and scored but means nothing (`meaningful: false` on the host). With the replay (`programs`),
the kids are the roles' replay processes (step_replay.py), not the candidates': a segment's
recorded programs are prepared (captured) before its prompts and poison, each timed step names
its program, and they are dropped after the segment's check; what follows about the child's
own work then holds for the replay process, which runs no agent Python. Without it, not
certified: which kernels computed the step, and that the step did all of its work
between request and reply: the candidate's process runs everything in it (the harness's IPC and
synchronize included), so it could shave the round trip's few microseconds, or run work in a
thread of its own while the parent checks a segment (untimed, but with no tokens to work on and
no step of the segment left to serve). Both processes wait for each other's frames awake on a
GPU (the parent spins on the reply, the child on its segment's next request: `more`), so no
wake-up is in a step's time but a block's first (a segment's, or with an incumbent a half
segment's: its request finds the child asleep). Measured on an H100 (benchmarks/step_timed_diag.py), before the State moved to the
device: with the child awake for at most 10 ms after each reply, the Triton solution's timed
step read 5.07 ms (median) where its work in the child took 0.82 ms, the child starting on a
request 4.6 ms after it was readable; awake until its segment's next request came, 0.95 ms (the
same work in one process: 0.73 ms).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import step_trace
    from . import guard
    from .guard_kid import Kid, KidFailed
else:  # step_guard.py imported this from the staged folder on sys.path
    import guard
    import step_trace
    from guard_kid import Kid, KidFailed


def segments(trace: dict[str, Any], variant: int, vocab: int) -> list[tuple[list, list[list[int]]]]:
    """step_trace.schedule's steps grouped by segment: (prompts, [tokens per step]); a step that
    brings new prompts starts a segment."""
    out: list[tuple[list, list[list[int]]]] = []
    for prompts, toks in step_trace.schedule(trace, variant, vocab):
        if prompts or not out:
            out.append((prompts, []))
        out[-1][1].append(toks)
    return out


def blocks(n_sides: int, steps: int, segment: int) -> list[tuple[int, int, int]]:
    """The order of one segment's timed blocks: (side, first step, end), each side's steps in
    order. One side: the segment whole. Two (the candidate 0, the incumbent 1): the segment
    split in halves, A B B A in even segments and B A A B in odd ones, so a drift of the host
    within a segment (tens of ms) weighs on both alike, and each side still runs the trace
    once, its steps back to back within a block."""
    if n_sides == 1:
        return [(0, 0, steps)]
    a, b = (0, 1) if segment % 2 == 0 else (1, 0)
    half = (steps + 1) // 2  # a one-step segment: A B
    out = [(a, 0, half), (b, 0, half), (b, half, steps), (a, half, steps)]
    return [blk for blk in out if blk[1] < blk[2]]


class Side:
    """One process's part of the timed pass: its child, its arena's views, the parent's handle
    on its State, where its reasons go (`rec`: the trace's record for the candidate, the
    incumbent's own record for the incumbent), its samples and its segment's stored logits."""

    def __init__(self, role: str, kid: Kid, views: dict[str, Any], state, rec: dict[str, Any]
                 ) -> None:  # fmt: skip
        self.role, self.kid, self.views, self.state, self.rec = role, kid, views, state, rec
        self.samples: list[float] = []
        self.outputs: list[Any] = []


class TimedPass:
    """One timed pass of one trace: `verify` is the StepVerify (its torch, reference, lock,
    tolerances, phases), `views` the candidate's arena's tensors, `truth` the reference's State
    here and `cand` the parent's handle on the arena's State; reasons go into `rec` (the
    trace's record). `incumbent`: (its child, its arena's views, the handle on its State), timed
    beside the candidate block by block (blocks()); its reasons and figures go into
    rec["incumbent"], and a failure of its own drops it from the pass and the verify
    (StepVerify.drop_incumbent), never the candidate's verdict."""

    def __init__(self, verify, kid: Kid, views: dict[str, Any], truth, cand,
                 rec: dict[str, Any], incumbent: tuple[Kid, dict[str, Any], Any] | None = None,
                 programs: bool = False) -> None:  # fmt: skip
        self.v, self.truth, self.rec = verify, truth, rec
        # programs: the kids are replay processes (step_replay.py): each timed step names its
        # recorded program (its index in the trace), and a segment's programs are prepared
        # (captured) before the segment and dropped after its check
        self.programs = programs
        self.sides = [Side("candidate", kid, views, cand, rec)]
        if incumbent is not None:
            inc = rec.setdefault("incumbent", {"name": rec["name"], "codes": [], "passed": False})
            self.sides.append(Side("incumbent", *incumbent, inc))
        self.spin = verify.env.device == "cuda"  # a sleeping wake-up would land in the time;
        # on the CPU the parent's spin would take a core from the child it times
        self.sync = verify.sync  # this process's device synchronize (None on the CPU)
        self.clock = time.perf_counter

    def fail(self, side: Side, code: str, detail: str) -> bool:
        """`side` failed (its reason recorded): False for the candidate (the pass ends), True
        for the incumbent, which leaves the pass and the verify (the candidate goes on)."""
        self.v.fail(side.rec, code, detail)
        return self.drop(side)

    def drop(self, side: Side) -> bool:
        if side.role == "candidate":
            return False
        self.sides.remove(side)
        self.v.drop_incumbent()
        return True

    def ask(self, side: Side, where: str, **fields: Any) -> tuple[dict[str, Any], float] | None:
        """One timed step's request and reply (None: its error, recorded; for the incumbent
        also its process's death, which loses the comparison: Roles.lose_incumbent)."""
        try:
            reply, wall_us = side.kid.ask({"op": "timed_step", **fields}, spin=self.spin)
        except KidFailed as exc:
            self.v.lose_incumbent(self.v.result, exc)  # the candidate's: raised again
            self.sides.remove(side)
            return None
        err = guard.error_text(reply)
        if err:
            self.fail(side, "candidate_error", f"{where}: the step raised {err}")
            return None
        return reply, wall_us

    def next_step(self, side: Side, tokens) -> None:
        """NaN into the side's logits slot (an unwritten one shows), its next step's `tokens`
        (if any) into its arena, and this process's device synchronised: all of it in place
        before the next request, and everything queued before it (the copy of the last
        logits) finished."""
        side.views["logits"].fill_(float("nan"))
        if tokens is not None:
            side.views["tokens"].copy_(tokens)
        if self.sync is not None:
            self.sync()

    def lengths_kept(self, side: Side, where: str) -> bool:
        """The side's lengths as the trace gives them (False: the candidate's failed)."""
        if side.views["lengths"].tolist() != list(self.truth.host_lengths):
            return self.fail(side, "lengths_modified", f"{where}: the step changed the lengths")
        return True

    def run(self, trace: dict[str, Any], variant: int) -> list[float]:
        """The pass: the candidate's timed steps' microseconds (its failure ends it: see the
        record); the incumbent's figures, when it passed, in rec["incumbent"]."""
        torch, ref, lock = self.v.torch, self.v.ref, self.v.lock
        truth = self.truth
        cand = self.sides[0]
        for s in (truth, *(side.state for side in self.sides)):
            step_trace.reset_state(s)
        first = 0  # the segment's first step's index in the trace
        for n, (prompts, steps) in enumerate(segments(trace, variant, truth.config.vocab)):
            where = f"timed pass segment {n}"
            keys = list(range(first, first + len(steps)))
            with lock.work():
                if n and not all(self.lengths_kept(side, where) for side in list(self.sides)):
                    return cand.samples
                if not self.tell("prepare", keys, where):  # before the prompts and poison
                    return cand.samples
                for b, length, seed in prompts:
                    for s in (truth, *(side.state for side in self.sides)):
                        ref.prefill(s, b, length, seed)
                for side in self.sides:
                    side.state.host_lengths = list(truth.host_lengths)
                    step_trace.poison_stale(torch, side.state, truth.host_lengths)
                    side.outputs = []
                if self.sync is not None:  # on the device before the GPU is held alone
                    self.sync()
                tokens = torch.tensor(steps, dtype=torch.int64).to(cand.views["tokens"].device)
            start = list(truth.host_lengths)
            with lock.exclusive():
                for index, lo, end in blocks(len(self.sides), len(steps), n):
                    if index >= len(self.sides):  # the incumbent left in an earlier block
                        continue
                    if not self.block(self.sides[index], tokens, lo, end, start, where, first):
                        return cand.samples
            with lock.work():
                if not self.check_segment(steps, where):
                    return cand.samples
                if not self.tell("drop", keys, where):  # the segment's graphs freed
                    return cand.samples
            first += len(steps)
        with lock.work():
            where = "after the timed pass"
            for side in list(self.sides):
                if self.lengths_kept(side, where) and side in self.sides:
                    if not self.v.cache_ok(side.views, truth, side.rec, where):
                        self.drop(side)
        if len(self.sides) > 1 and not cand.rec["codes"]:
            inc = self.sides[1]
            inc.rec.update(passed=True, **timing(inc.samples))
        return cand.samples

    def tell(self, op: str, keys: list[int], where: str) -> bool:
        """With programs, each side's replay process asked to "prepare" the segment's programs
        (step_replay.py: a CUDA graph each on a GPU) or "drop" them. A side that fails it leaves
        the pass as a failed timed step does (the candidate's reason ends it: False; the
        incumbent leaves the verify)."""
        for side in list(self.sides) if self.programs else []:
            try:
                reply, _ = side.kid.ask({"op": op, "keys": keys})
            except KidFailed as exc:
                self.v.lose_incumbent(self.v.result, exc)  # the candidate's: raised again
                self.sides.remove(side)
                continue
            err = guard.error_text(reply)
            if err and not self.fail(side, "candidate_error", f"{where}: the replay could not "
                                     f"{op} the recorded steps ({err})"):  # fmt: skip
                return False
        return True

    def block(self, side: Side, tokens, lo: int, end: int, start: list[int], where: str,
              first: int = 0) -> bool:  # fmt: skip
        """Steps lo..end-1 of a segment by one side, back to back: per step the request sent,
        its reply awaited, then the step's logits copied out of the slot here, NaN written into
        it and the next step's tokens into the arena, and this process's device synchronised;
        a step's time runs from the request to the end of that synchronize. The block's first
        tokens are written just before its first request (a side waiting for its block holds
        no tokens to work on). False: the candidate failed (the pass ends)."""
        phase = "timed" if side.role == "candidate" else "incumbent"
        with self.v.phases(phase):
            self.next_step(side, tokens[lo])
            for i in range(lo, end):
                extra = {"program": first + i} if self.programs else {}
                got = self.ask(side, f"{where} step {i}", host_lengths=[x + i for x in start],
                               more=i + 1 < end, **extra)  # fmt: skip
                if got is None:
                    return side.role != "candidate"
                reply, wall_us = got
                if not reply.get("copied"):
                    return self.fail(side, "wrong_shape", f"{where} step {i}: the logits are "
                                     "not a plain tensor of the reference's shape and dtype")  # fmt: skip
                t0 = self.clock()
                side.outputs.append(side.views["logits"].clone())
                self.next_step(side, tokens[i + 1] if i + 1 < end else None)
                side.samples.append(wall_us + (self.clock() - t0) * 1e6)
        return True

    def check_segment(self, steps: list[list[int]], where: str) -> bool:
        """reference_step over the segment's tokens (the truth advanced in lockstep), run once
        for every side: each side's stored logits compared with it, as the checked passes
        compare theirs. False: the candidate's failed."""
        torch, ref, truth = self.v.torch, self.v.ref, self.truth
        device = truth.kv_cache.device
        for i, toks in enumerate(steps):
            want = ref.reference_step(truth, torch.tensor(toks, dtype=torch.long, device=device))
            for side in list(self.sides):
                phase = "timed" if side.role == "candidate" else "incumbent"
                with self.v.phases(phase):
                    ok = self.v.logits_ok(side.outputs[i].to(device), want, truth.config,
                                          side.rec, f"{where} step {i}")  # fmt: skip
                if not ok and not self.drop(side):
                    return False
            ref.advance(truth)
        return True


def timing(samples_us: list[float]) -> dict[str, Any]:
    """A trace's record of its timed pass: p50 and p95 of the step times (step_trace's
    percentile, the dev objective's), and how many steps were timed."""
    xs = [float(x) for x in samples_us if math.isfinite(x)]
    if not xs:
        return {"steps_timed": 0, "p50_us": None, "p95_us": None}
    return {"steps_timed": len(xs), "p50_us": step_trace.percentile(xs, 50),
            "p95_us": step_trace.percentile(xs, 95)}  # fmt: skip


__all__ = ["Side", "TimedPass", "blocks", "segments", "timing"]

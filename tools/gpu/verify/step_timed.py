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

What the time means: a decode step's latency as the trusted parent observes it through the
sandbox's boundary: the step and its synchronize, a fixed IPC round trip (two pipe frames), and
this process's read of the logits with its writes for the next step (one copy of batch x vocab
values on the device, a fill, a few tokens: the same for every candidate). The read is inside
the time because on a GPU the slot is device memory the child writes: a child that replied
before its device work finished gains nothing, since this process's copy of the slot either
runs after that work (the GPU takes the two processes' contexts in turn), inside the time, or
finds the slot unwritten (NaN: rejected). With the slot in host memory, as before, the child's
own blocking copy to it was that barrier. On the CPU (the Triton interpreter) it is recorded
and scored but means nothing (`meaningful: false` on the host). Not certified: which kernels
computed the step (no launch record or replay for steps), and that the step did all of its work
between request and reply: the candidate's process runs everything in it (the harness's IPC and
synchronize included), so it could shave the round trip's few microseconds, or run work in a
thread of its own while the parent checks a segment (untimed, but with no tokens to work on and
no step of the segment left to serve). Both processes wait for each other's frames awake on a
GPU (the parent spins on the reply, the child on its segment's next request: `more`), so no
wake-up is in a step's time but a segment's first (its request finds the child asleep). Measured on an H100 (benchmarks/step_timed_diag.py), before the State moved to the
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
    from .guard_kid import Kid
else:  # step_guard.py imported this from the staged folder on sys.path
    import guard
    import step_trace
    from guard_kid import Kid


def segments(trace: dict[str, Any], variant: int, vocab: int) -> list[tuple[list, list[list[int]]]]:
    """step_trace.schedule's steps grouped by segment: (prompts, [tokens per step]); a step that
    brings new prompts starts a segment."""
    out: list[tuple[list, list[list[int]]]] = []
    for prompts, toks in step_trace.schedule(trace, variant, vocab):
        if prompts or not out:
            out.append((prompts, []))
        out[-1][1].append(toks)
    return out


class TimedPass:
    """One timed pass of one trace: `verify` is the StepVerify (its torch, reference, lock,
    tolerances), `views` the arena's tensors, `truth` the reference's State here and `cand` the
    parent's handle on the arena's State; reasons go into `rec` (the trace's record)."""

    def __init__(self, verify, kid: Kid, views: dict[str, Any], truth, cand,
                 rec: dict[str, Any]) -> None:  # fmt: skip
        self.v, self.kid, self.views, self.truth, self.cand = verify, kid, views, truth, cand
        self.rec = rec
        self.spin = verify.env.device == "cuda"  # a sleeping wake-up would land in the time;
        # on the CPU the parent's spin would take a core from the child it times
        self.sync = verify.sync  # this process's device synchronize (None on the CPU)
        self.clock = time.perf_counter

    def fail(self, code: str, detail: str) -> None:
        self.v.fail(self.rec, code, detail)

    def ask(self, where: str, **fields: Any) -> tuple[dict[str, Any], float] | None:
        """One timed step's request and reply (None: its error, recorded)."""
        reply, wall_us = self.kid.ask({"op": "timed_step", **fields}, spin=self.spin)
        err = guard.error_text(reply)
        if err:
            self.fail("candidate_error", f"{where}: the step raised {err}")
            return None
        return reply, wall_us

    def next_step(self, tokens) -> None:
        """NaN into the logits slot (an unwritten one shows), the next step's `tokens` (if any)
        into the arena, and this process's device synchronised: all of it in place before the
        next request, and everything queued before it (the copy of the last logits) finished."""
        self.views["logits"].fill_(float("nan"))
        if tokens is not None:
            self.views["tokens"].copy_(tokens)
        if self.sync is not None:
            self.sync()

    def lengths_kept(self, where: str) -> bool:
        if self.views["lengths"].tolist() != list(self.truth.host_lengths):
            self.fail("lengths_modified", f"{where}: the step changed the lengths")
            return False
        return True

    def run(self, trace: dict[str, Any], variant: int) -> list[float]:
        """The pass: each timed step's microseconds (a failure ends it: see the record)."""
        torch, ref, lock = self.v.torch, self.v.ref, self.v.lock
        truth, cand = self.truth, self.cand
        samples: list[float] = []
        for s in (truth, cand):
            step_trace.reset_state(s)
        for n, (prompts, steps) in enumerate(segments(trace, variant, truth.config.vocab)):
            where = f"timed pass segment {n}"
            with lock.work():
                if n and not self.lengths_kept(where):
                    return samples
                for b, length, seed in prompts:
                    for s in (truth, cand):
                        ref.prefill(s, b, length, seed)
                cand.host_lengths = list(truth.host_lengths)
                step_trace.poison_stale(torch, cand, truth.host_lengths)
                tokens = torch.tensor(steps, dtype=torch.int64).to(self.views["tokens"].device)
                self.next_step(tokens[0])
            start = list(truth.host_lengths)
            outputs = []
            with lock.exclusive():
                for i in range(len(steps)):
                    got = self.ask(f"{where} step {i}",
                                   host_lengths=[x + i for x in start],
                                   more=i + 1 < len(steps))  # fmt: skip
                    if got is None:
                        return samples
                    reply, wall_us = got
                    if not reply.get("copied"):
                        self.fail("wrong_shape", f"{where} step {i}: the logits are not a plain "
                                  "tensor of the reference's shape and dtype")  # fmt: skip
                        return samples
                    t0 = self.clock()
                    outputs.append(self.views["logits"].clone())
                    self.next_step(tokens[i + 1] if i + 1 < len(steps) else None)
                    samples.append(wall_us + (self.clock() - t0) * 1e6)
            with lock.work():
                if not self.check_segment(steps, outputs, where):
                    return samples
        with lock.work():
            where = "after the timed pass"
            if self.lengths_kept(where):
                self.v.cache_ok(self.views, truth, self.rec, where)
        return samples

    def check_segment(self, steps: list[list[int]], outputs: list[Any], where: str) -> bool:
        """reference_step over the segment's tokens (the truth advanced in lockstep), every
        stored logits tensor compared with it, as the checked passes compare theirs."""
        torch, ref, truth = self.v.torch, self.v.ref, self.truth
        device = truth.kv_cache.device
        for i, (toks, got) in enumerate(zip(steps, outputs, strict=True)):
            want = ref.reference_step(truth, torch.tensor(toks, dtype=torch.long, device=device))
            if not self.v.logits_ok(
                got.to(device), want, truth.config, self.rec, f"{where} step {i}"
            ):
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


__all__ = ["TimedPass", "segments", "timing"]

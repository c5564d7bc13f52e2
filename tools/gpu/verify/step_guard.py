"""The guarded verify of a step task, trusted parent side (the runner's "step_verify" mode): the
process that decides and never runs agent Python.

Runs in a fresh runner process (never one that imported candidate code), staged and hash-checked
like runner.py; standard library, torch and triton only. For every hidden trace (drawn by the
host from the workspace's secret: tools/task/step.py `StepSpec.hidden`; the traces arrive on
stdin, mixed here with os.urandom for the weights) it
1. builds the reference's State here (its own weights, cache and lengths, in this process's
   memory: the candidate never sees them) and the candidate's State in a shared arena this
   process made (step_arena.py: a sealed memfd on the CPU, device memory shared by descriptor
   on a GPU): the same weights, the cache, the lengths, this step's tokens and a slot for the
   logits;
2. runs the candidate's step in a sandboxed process of its own (step_child.py, through
   guard_kid.Kid), whose State IS the arena (its views, on every device): before each step
   this process writes the prompts (continuous batching), POISONs every stale slot of the
   arena's cache, writes the tokens and NaN into the logits slot, and (on a GPU) synchronises
   its device, so all of it is in the memory the step reads before the request goes; then it
   asks for one step, and the child writes the logits into the slot. No copy of the State
   between the processes, host or device, and the poison needs nothing of the child;
3. compares each step's logits with reference_step run here on the same tokens (while the
   child steps: in the checked passes the two overlap), checks the
   lengths were left alone, and after each pass compares the cache's valid slots, all read
   from the arena. Two checked passes per trace (different tokens and prompts, the
   candidate's scratch kept between them), stopping at the first failure. Every reason's text
   is written here; the child's replies are facts;
4. then times one more pass (step_timed.py: its own tokens and prompts, each segment's steps
   sent back to back and timed by this process's clock from request to the logits read here,
   under the GPU lock held alone, every step's logits and the cache after it checked as
   above): the trace's p50 and p95 step latency. The host's score is the sum over traces of
   p50 (scores.score_of).
What this certifies: the outputs (every step's logits, the cache after each pass, the timed one
included) on hidden traces, and the step's latency as this process observes it through the
sandbox's boundary (a fixed IPC round trip included: the same for every candidate; meaningless
on the CPU). Not who computed them (no launch record or replay for steps yet).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import step_trace
    from ..isolation import sandbox_limits
    from ..isolation import sandbox_policy as sp
    from . import guard, guard_spawn, phase_lock, step_arena, step_timed
    from .guard_kid import Kid, KidFailed, stage_root
else:  # the runner that imports this put the staged folder on sys.path
    import guard
    import guard_spawn
    import phase_lock
    import sandbox_limits
    import sandbox_policy as sp
    import step_arena
    import step_timed
    import step_trace
    from guard_kid import Kid, KidFailed, stage_root

HERE = os.path.dirname(os.path.abspath(__file__))
PASSES = 2  # per hidden trace: each with its own tokens and prompts, the scratch kept between


class StepVerify:
    def __init__(self, env, req: dict[str, Any], rt: types.ModuleType) -> None:
        self.env, self.rt, self.torch = env, rt, env.torch
        self.started = time.perf_counter()
        # Where the verify's seconds go (summed over traces; operator-side evidence only):
        # start, state, reference, candidate, poison, compare, timed.
        self.phases = rt.Phases()
        self.sync = env.torch.cuda.synchronize if env.device == "cuda" else None
        digest = hashlib.sha256(f"{req.get('seed', 0)}:{os.urandom(16).hex()}".encode())
        self.req = {**req, "seed": int(digest.hexdigest()[:15], 16)}
        self.ref = rt.load_module(Path(req["reference"]), "_hl_step_verify_reference")
        self.timeout_s = float(req.get("case_timeout_s", 120))
        self.scratch_root = os.path.join(stage_root(), "scratch")
        os.makedirs(self.scratch_root, mode=0o700, exist_ok=True)
        held = req.get("gpu_lock") or {}
        self.lock = phase_lock.PhaseLock(
            held.get("file"), int(held.get("gpu", 0)),
            lambda message: rt.emit({"event": "waiting", "message": message}),
        )  # fmt: skip

    def candidate_kid(self, memfd: int) -> Kid:
        cand_dir = self.req["candidate_dir"]
        env = {"TRITON_INTERPRET": "1"} if self.env.interpret else {}
        cache, write = "", []
        if not self.env.interpret:  # per-candidate Triton cache: only this candidate writes it
            cache = os.path.join(stage_root(), "tcache", os.path.basename(cand_dir.rstrip("/")))
            os.makedirs(cache, mode=0o700, exist_ok=True)
            write = [cache]
        policy = sp.Policy(
            read=[HERE, cand_dir, os.path.dirname(self.req["reference"])], write=write,
            scratch_root=self.scratch_root, require=bool(self.req.get("sandbox_required", True)),
            env=env, env_allow=["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"], triton_cache=cache,
            namespaces=True, limits=sp.Limits.from_dict(self.req.get("sandbox_limits") or {}),
            **sp.python_policy(sp.import_roots()),
        )  # fmt: skip
        return Kid("candidate", "step_child.py", policy, self.timeout_s, (memfd,))

    def run(self) -> dict[str, Any]:
        torch, ref, req = self.torch, self.ref, self.req
        if self.env.device == "cpu":  # tiny tensors: one thread (step_trace.run_trace says why)
            torch.set_num_threads(1)
        sizes = req["step"]["interpreter" if self.env.interpret else "model"]
        plans = []
        for t in req["step"]["traces"]:
            params = {**t, **(t.get("interpreter") or {})} if self.env.interpret else t
            config = ref.Config(**sizes, dtype=t["dtype"])
            plans.append((t, config, step_trace.build(config, params)))
        size = max(step_arena.layout(c)[1] for _, c, _ in plans) + step_arena.ALIGN
        arena = step_arena.ARENAS[self.env.device].create(torch, size, self.scratch_root)
        result: dict[str, Any] = {"status": "measured", "input_seed": req["seed"],
                                  "nonce": req.get("nonce"), "cases": [], "load": {},
                                  "sandbox": {}, "certifies": "step_outputs"}  # fmt: skip
        kid = None
        try:
            with self.phases("start"):
                kid = self.candidate_kid(arena.fd)
                result["sandbox"]["candidate"] = kid.started()
                kid.send({"device": self.env.device, "candidate_dir": req["candidate_dir"],
                          "entry": req["entry"], "reference": req["reference"],
                          "memfd": arena.fd})  # fmt: skip
                reply, _ = kid.ask({"op": "load"})
            err = guard.error_text(reply)
            result["load"]["candidate"] = {"ok": bool(reply.get("ok")) and not err}
            if not result["load"]["candidate"]["ok"]:
                result["error"] = f"import failed: {err or 'no reply'}"
                result["error_code"] = "import_failed"
                return result
            kid.ask({"op": "arena", "size": arena.size})
            rng = random.Random(req["seed"])
            for index, (t, config, trace) in enumerate(plans):
                rec = {"name": t["name"], "dtype": t["dtype"], "codes": [], "steps_checked": 0}
                result["cases"].append(rec)
                self.one_trace(kid, arena, config, trace, rng.randrange(1 << 31), rec)
                self.rt.emit({"event": "case", "index": index, "status": "measured"})
                if rec["codes"]:
                    break  # rejected: the rest would cost time and change nothing
        except KidFailed as exc:
            if result["cases"]:
                result["cases"][-1].update(error=str(exc), error_code=exc.code)
            else:
                result["error"], result["error_code"] = f"{exc.role}: {exc}", exc.code
        finally:
            if kid is not None:
                kid.close()
            sandbox_limits.sweep(self.scratch_root)  # whatever the child did, nothing stays
            self.lock.close()
            arena.close()
            result["wall_s"] = time.perf_counter() - self.started
            result["phases_s"] = dict(self.phases)
        return result

    def one_trace(self, kid: Kid, arena: step_arena.HostArena | step_arena.DeviceArena, config, trace: dict[str, Any], weight_seed: int,
                  rec: dict[str, Any]) -> None:  # fmt: skip
        """The passes of one hidden trace, checked then timed; reasons go into rec["codes"] (the
        first stops it), the timed pass's figures into rec (step_timed.timing)."""
        layout, _ = step_arena.layout(config)
        views = arena.views(layout)
        with self.lock.work():
            with self.phases("state", self.sync):
                truth, cand = self.states(kid, views, layout, config, weight_seed)
            for variant in range(PASSES):
                if not self.checked_pass(kid, views, truth, cand, trace, variant, rec):
                    return None
        with self.phases("timed"):
            samples = step_timed.TimedPass(self, kid, views, truth, cand, rec).run(trace, PASSES)
        if not rec["codes"]:
            rec.update(step_timed.timing(samples))
        return None

    def states(self, kid: Kid, views: dict[str, Any], layout, config, weight_seed: int):
        """The reference's State here and the candidate's in the arena (the same weights), and
        the child told the trace's layout."""
        ref = self.ref
        truth = ref.new_state(config, seed=weight_seed, device=self.env.device)
        for name, w in truth.weights.items():
            views[f"w.{name}"].copy_(w)
        views["rope_cos"].copy_(truth.rope_cos)
        views["rope_sin"].copy_(truth.rope_sin)
        # The parent's handle on the candidate's State (the same arena the child's views see):
        # reference.prefill and advance write prompts and lengths into it as into any State.
        cand = ref.State(
            config=config, weights={}, kv_cache=views["kv_cache"], lengths=views["lengths"],
            host_lengths=[0] * config.batch, rope_cos=views["rope_cos"],
            rope_sin=views["rope_sin"],
        )  # fmt: skip
        kid.ask({"op": "trace", "layout": layout, "config": _config_dict(config)})
        return truth, cand

    def checked_pass(self, kid: Kid, views: dict[str, Any], truth, cand, trace: dict[str, Any],
                     variant: int, rec: dict[str, Any]) -> bool:  # fmt: skip
        """One checked pass: the prompts written, every stale slot poisoned, the tokens and a NaN
        logits slot written (and on a GPU this process's device synchronised: all of it in place
        before the child reads) before each step."""
        torch, ref, device, phase = self.torch, self.ref, self.env.device, self.phases
        for s in (truth, cand):
            step_trace.reset_state(s)
        for index, (prompts, toks) in enumerate(
            step_trace.schedule(trace, variant, truth.config.vocab)
        ):
            where = f"pass {variant} step {index}"
            with phase("reference", self.sync):  # the prompts, written into both States
                for b, length, seed in prompts:
                    for s in (truth, cand):
                        ref.prefill(s, b, length, seed)
            expected = list(truth.host_lengths)
            with phase("poison"):
                step_trace.poison_stale(torch, cand, expected)
                views["tokens"].copy_(torch.tensor(toks, dtype=torch.int64))
                views["logits"].fill_(float("nan"))
                if self.sync is not None:  # on the device before the request goes
                    self.sync()
            # The child steps while this process runs the reference on its own State (the
            # truth, memory the child never sees): the two overlap; the logits slot is read only
            # after the reply. Not in the timed pass, where the child runs alone.
            with phase("candidate"):
                sent = time.perf_counter()
                kid.send({"op": "step", "host_lengths": expected})
            with phase("reference", self.sync):
                want = ref.reference_step(truth, torch.tensor(toks, dtype=torch.long,
                                                              device=device))  # fmt: skip
            with phase("candidate"):
                reply, _ = kid.reply(sent)
            err = guard.error_text(reply)
            if err:
                self.fail(rec, "candidate_error", f"{where}: the step raised {err}")
                return False
            if not reply.get("copied"):
                self.fail(rec, "wrong_shape", f"{where}: the logits are not a plain tensor of "
                          "the reference's shape and dtype")  # fmt: skip
                return False
            with phase("compare", self.sync):
                got = views["logits"].to(device, copy=True)
                if not self.logits_ok(got, want, truth.config, rec, where):
                    return False
            if views["lengths"].tolist() != expected:
                self.fail(rec, "lengths_modified", f"{where}: the step changed the lengths")
                return False
            rec["steps_checked"] += 1
            for s in (truth, cand):
                ref.advance(s)
        with phase("compare", self.sync):
            return self.cache_ok(views, truth, rec, f"after pass {variant}")

    @staticmethod
    def fail(rec: dict[str, Any], code: str, detail: str) -> None:
        rec["codes"].append([code, f"{rec['name']}: {detail}"])

    def logits_ok(self, got, want, config, rec: dict[str, Any], where: str) -> bool:
        """One step's logits against the reference's (guard.output_check: a fixed reason)."""
        tol = self.req["tolerances"][config.dtype]
        spec = ((config.batch, config.vocab), config.torch_dtype)
        ok, why, stats = guard.output_check(self.rt, self.torch, got, want, tol, spec)
        rec["max_abs_err"] = max(rec.get("max_abs_err") or 0.0, stats.get("max_abs_err") or 0.0)
        if not ok:
            self.fail(rec, "wrong_output", f"{where}: logits: {why}")
        return ok

    def cache_ok(self, views: dict[str, Any], truth, rec: dict[str, Any], where: str) -> bool:
        """The cache's valid slots (every sequence's context) against the reference's."""
        torch, config = self.torch, truth.config
        want = step_trace.valid_slots(torch, truth.kv_cache, truth.host_lengths).float()
        got = step_trace.valid_slots(torch, views["kv_cache"], truth.host_lengths)
        ok, why, _ = guard.output_check(
            self.rt, torch, got.to(want.device), want, self.req["tolerances"][config.dtype],
            (tuple(want.shape), config.torch_dtype),
        )  # fmt: skip
        if not ok:
            self.fail(rec, "wrong_kv_cache", f"{where}: the cache's valid slots: {why}")
        return ok


def _config_dict(config) -> dict[str, Any]:
    return {k: getattr(config, k) for k in ("hidden", "heads", "kv_heads", "layers", "max_seq",
                                            "batch", "vocab", "dtype", "ffn", "rope_theta", "eps")}  # fmt: skip


def verify(env, req: dict[str, Any], rt: types.ModuleType) -> dict[str, Any]:
    """The guarded verify of req['candidate_dir'] on req['step']['traces'] (hidden)."""
    if any(name.startswith("_hl_candidate") for name in sys.modules):
        raise RuntimeError(
            "the guarded verify needs a fresh runner process (this one has run candidate code)"
        )
    guard_spawn.harden()  # non-dumpable: same-user processes cannot read the reference's state
    return StepVerify(env, req, rt).run()


__all__ = ["PASSES", "verify"]

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
   p50 (scores.score_of);
5. with an incumbent (the best final checkpoint, staged by the host as `baseline_dir`): a second
   sandboxed process (step_child.py on the incumbent's folder) over an arena of its own (its
   own memfd or device buffer: each process inherits its own descriptor only, so the
   candidate's can neither read nor write the incumbent's State, nor the reverse), started and
   imported beside the candidate's. Once the candidate's checked passes of a trace passed, the
   incumbent's State gets the same weights, one untimed pass warms it as the candidate's
   checked passes warmed the candidate (warm_up), and the timed pass times both, per segment in
   halves A B B A / B A A B (step_timed.blocks), every incumbent step's logits and its cache
   checked against the same reference run. An incumbent that fails (a check, its import, its
   process) leaves the verify (guard_kid.Roles): its record says so, the candidate's verdict is
   untouched. The incumbent's figures go into the trace's record["incumbent"] and the host
   compares them (integrity/incumbent.py: a new best must beat it by 1%).
6. with the replay (req["step"]["replay"]: "gpu", the default, replays on a GPU only; "always";
   "never"): the last checked pass records every step in the candidate's process
   (step_record.py, the step's reply carries it), each recording is checked here
   (step_schema.py) and handed to the role's replay process (step_replay.py: sandboxed, over
   the same arena, no agent Python; one program per distinct recording of the trace), and the
   timed pass times that process instead of the candidate's (step_timed.TimedPass with
   programs: each timed step replays the same step of the recorded pass on the timed pass's
   tokens and prompts), with the candidate's and the incumbent's own processes stopped
   (guard_kid.frozen). The incumbent is recorded in its warm-up pass and replayed likewise.
What this certifies: the outputs (every step's logits, the cache after each pass, the timed one
included) on hidden traces, and the step's latency as this process observes it through the
sandbox's boundary (a fixed IPC round trip included: the same for every candidate; meaningless
on the CPU). With the replay ("step_replayed"), that the timed steps were the candidate's
recorded kernels and ATen calls, run without its Python; without it ("step_outputs"), not who
computed them. Without the replay the incumbent's timing is as fair as the candidate's process
lets it be: that process is alive (and may run threads) while the incumbent's blocks are timed
(step_timed.py); with it, every process of both roles' own sandboxes (not their replay
processes) is stopped for the timed pass (guard_kid.frozen), and only device work queued before
could still run then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
    from . import guard, guard_spawn, phase_lock, step_arena, step_schema, step_timed
    from .guard_kid import Kid, KidFailed, Roles, close_all, frozen, stage_root
    from .guard_schema import Bad
else:  # the runner that imports this put the staged folder on sys.path
    import guard
    import guard_spawn
    import phase_lock
    import sandbox_limits
    import sandbox_policy as sp
    import step_arena
    import step_schema
    import step_timed
    import step_trace
    from guard_kid import Kid, KidFailed, Roles, close_all, frozen, stage_root
    from guard_schema import Bad

HERE = os.path.dirname(os.path.abspath(__file__))
PASSES = 2  # per hidden trace: each with its own tokens and prompts, the scratch kept between


class StepVerify(Roles):
    def __init__(self, env, req: dict[str, Any], rt: types.ModuleType) -> None:
        self.env, self.rt, self.torch = env, rt, env.torch
        self.started = time.perf_counter()
        # Where the verify's seconds go (summed over traces; operator-side evidence only):
        # start, state, reference, candidate, poison, compare, timed, and with an incumbent
        # its own: incumbent (its State, its timed blocks, the compare of its logits).
        self.phases = rt.Phases()
        self.kids: list[Any] = []  # the candidate's process, and the incumbent's (Roles)
        # The replay (step_replay.py): a replay process per role over the role's arena, the
        # kernels each role's recordings brought, and those its replay process has loaded.
        mode = (req.get("step") or {}).get("replay", "gpu")
        self.replay = mode == "always" or (mode == "gpu" and env.device == "cuda")
        self.replayers: dict[str, Kid] = {}
        self.kernels: dict[str, dict[str, Any]] = {}
        self.loaded: dict[str, set[str]] = {}
        self.recorded: dict[str, dict[str, int]] = {}  # per role, this trace: digest -> key
        self.result: dict[str, Any] = {}
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

    def candidate_kid(self, role: str, folder: str | None, memfd: int) -> Kid:
        """A role's sandboxed step process (the candidate's, or the incumbent's from its staged
        checkpoint): it reads its own folder and inherits its own arena's descriptor only. With
        no folder: the role's replay process (step_replay.py), which reads the harness only."""
        env = {"TRITON_INTERPRET": "1"} if self.env.interpret else {}
        cache, write = "", []
        if folder and not self.env.interpret:  # per-candidate Triton cache: only it writes it
            cache = os.path.join(stage_root(), "tcache", os.path.basename(folder.rstrip("/")))
            os.makedirs(cache, mode=0o700, exist_ok=True)
            write = [cache]
        read = [HERE, folder, os.path.dirname(self.req["reference"])] if folder else [HERE]
        policy = sp.Policy(
            read=read, write=write,
            scratch_root=self.scratch_root, require=bool(self.req.get("sandbox_required", True)),
            env=env, env_allow=["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"], triton_cache=cache,
            namespaces=True, limits=sp.Limits.from_dict(self.req.get("sandbox_limits") or {}),
            **sp.python_policy(sp.import_roots()),
        )  # fmt: skip
        script = "step_child.py" if folder else "step_replay.py"
        return Kid(role, script, policy, self.timeout_s, (memfd,))

    def incumbent(self) -> Kid | None:
        """The incumbent's process while it is in the verify (Roles drops it on a failure)."""
        replayers = list(self.replayers.values())
        return next((k for k in self.kids if k.role == "incumbent" and k not in replayers), None)

    def drop_incumbent(self) -> None:
        super().drop_incumbent()
        self.replayers.pop("incumbent", None)

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
        # One arena per role (a memfd each, or device memory each): a role's process inherits
        # its own descriptor only, so neither reads or writes the other's State.
        roles = guard_spawn.roles(req)
        arena_of = step_arena.ARENAS[self.env.device]
        arenas = {role: arena_of.create(torch, size, self.scratch_root) for role, _ in roles}
        result: dict[str, Any] = {"status": "measured", "input_seed": req["seed"],
                                  "nonce": req.get("nonce"), "cases": [], "load": {},
                                  "sandbox": {}, "certifies": "step_replayed" if self.replay
                                  else "step_outputs"}  # fmt: skip
        self.result = result
        try:
            self.start(roles, arenas, result)
            if not result["load"]["candidate"]["ok"]:
                return result
            rng = random.Random(req["seed"])
            for index, (t, config, trace) in enumerate(plans):
                rec = {"name": t["name"], "dtype": t["dtype"], "codes": [], "steps_checked": 0}
                result["cases"].append(rec)
                self.one_trace(arenas, config, trace, rng.randrange(1 << 31), rec)
                self.rt.emit({"event": "case", "index": index, "status": "measured"})
                if rec["codes"]:
                    break  # rejected: the rest would cost time and change nothing
        except KidFailed as exc:  # the candidate's (Roles keeps the incumbent's apart)
            if result["cases"]:
                result["cases"][-1].update(error=str(exc), error_code=exc.code)
            else:
                result["error"], result["error_code"] = f"{exc.role}: {exc}", exc.code
        finally:
            close_all(self.kids)
            sandbox_limits.sweep(self.scratch_root)  # whatever the children did, nothing stays
            self.lock.close()
            for arena in arenas.values():
                arena.close()
            result["wall_s"] = time.perf_counter() - self.started
            result["phases_s"] = dict(self.phases)
        return result

    def start(self, roles: list[tuple[str, str]], arenas: dict[str, Any],
              result: dict[str, Any]) -> None:  # fmt: skip
        """Every role's process started and its step imported (both at once), its arena
        mapped; an incumbent that fails any of it leaves the verify (Roles.lose_incumbent)."""
        req = self.req
        with self.phases("start"):
            for role, folder in roles:
                with self.incumbent_may_fail(result):
                    kid = self.candidate_kid(role, folder, arenas[role].fd)
                    self.kids.append(kid)
                    result["sandbox"][role] = kid.started()
                    kid.send({"device": self.env.device, "candidate_dir": folder,
                              "entry": req["entry"], "reference": req["reference"],
                              "memfd": arenas[role].fd, "record": self.replay})  # fmt: skip
                    if self.replay:
                        rep = self.replayers[role] = self.candidate_kid(role, None, arenas[role].fd)
                        self.kids.append(rep)
                        result["sandbox"][f"{role}_replay"] = rep.started()
                        rep.send({"device": self.env.device, "memfd": arenas[role].fd})
                        self.loaded[role] = set()
            asked = {}
            children = [k for k in self.kids if k not in self.replayers.values()]
            for kid in children:
                with self.incumbent_may_fail(result):
                    kid.send({"op": "load"})
                    asked[kid.role] = time.perf_counter()
            for kid in children:
                if kid not in self.kids:  # the incumbent left (its replay process failed)
                    continue
                with self.incumbent_may_fail(result):
                    reply, _ = kid.reply(asked[kid.role])
                    err = guard.error_text(reply)
                    result["load"][kid.role] = {"ok": bool(reply.get("ok")) and not err}
                    if result["load"][kid.role]["ok"]:
                        kid.ask({"op": "arena", "size": arenas[kid.role].size})
                        if kid.role in self.replayers:
                            self.replayers[kid.role].ask(
                                {"op": "arena", "size": arenas[kid.role].size}
                            )
                    elif kid.role == "candidate":
                        result["error"] = f"import failed: {err or 'no reply'}"
                        result["error_code"] = "import_failed"
                    else:
                        raise KidFailed("import_failed", "import failed", kid.role)

    def one_trace(self, arenas: dict[str, Any], config, trace: dict[str, Any], weight_seed: int,
                  rec: dict[str, Any]) -> None:  # fmt: skip
        """The passes of one hidden trace, checked then timed; reasons go into rec["codes"] (the
        first stops it), the timed pass's figures into rec (step_timed.timing), the
        incumbent's (timed beside the candidate's, its outputs checked) into rec["incumbent"]."""
        layout, _ = step_arena.layout(config)
        views = arenas["candidate"].views(layout)
        kid = self.kids[0]  # the candidate's: roles() lists it first, Roles never drops it
        with self.lock.work():
            with self.phases("state", self.sync):
                truth = self.ref.new_state(config, seed=weight_seed, device=self.env.device)
                cand = self.arena_state(kid, views, layout, truth)
            for variant in range(PASSES):
                if not self.checked_pass(kid, views, truth, cand, trace, variant, rec):
                    return None
            incumbent = None
            inc_kid = self.incumbent()
            if inc_kid is not None:  # only for a candidate that passed its checks
                rec["incumbent"] = {"name": rec["name"], "codes": [], "passed": False}
                with self.phases("incumbent", self.sync), self.incumbent_may_fail(self.result):
                    inc_views = arenas["incumbent"].views(layout)
                    inc_state = self.arena_state(inc_kid, inc_views, layout, truth)
                    if self.warm_up(inc_kid, inc_views, inc_state, trace, rec["incumbent"]):
                        incumbent = (inc_kid, inc_views, inc_state)
                    else:
                        self.drop_incumbent()
        children: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.replay:  # the timed pass times the replay processes, while the candidates'
            # own processes (the candidate's, the incumbent's) are stopped
            children = frozen([k for k in self.kids if k not in self.replayers.values()])
            kid = self.replayers["candidate"]
            if incumbent is not None and "incumbent" in self.replayers:
                incumbent = (self.replayers["incumbent"], *incumbent[1:])
        with self.phases("timed"), children:
            samples = step_timed.TimedPass(self, kid, views, truth, cand, rec, incumbent,
                                           programs=self.replay).run(trace, PASSES)  # fmt: skip
        if not rec["codes"]:
            rec.update(step_timed.timing(samples))
        return None

    def arena_state(self, kid: Kid, views: dict[str, Any], layout, truth):
        """A role's State in its arena: the reference's weights and rotary tables copied in, the
        child told the trace's layout; returns the parent's handle on it."""
        config = truth.config
        for name, w in truth.weights.items():
            views[f"w.{name}"].copy_(w)
        views["rope_cos"].copy_(truth.rope_cos)
        views["rope_sin"].copy_(truth.rope_sin)
        # The parent's handle on the role's State (the same arena the child's views see):
        # reference.prefill and advance write prompts and lengths into it as into any State.
        handle = self.ref.State(
            config=config, weights={}, kv_cache=views["kv_cache"], lengths=views["lengths"],
            host_lengths=[0] * config.batch, rope_cos=views["rope_cos"],
            rope_sin=views["rope_sin"],
        )  # fmt: skip
        kid.ask({"op": "trace", "layout": layout, "config": _config_dict(config)})
        if kid.role in self.replayers:  # its replay process: the same views, no program left
            self.replayers[kid.role].ask({"op": "trace", "layout": layout})
            self.recorded[kid.role] = {}
        return handle

    def warm_up(self, kid: Kid, views: dict[str, Any], state, trace: dict[str, Any],
                rec: dict[str, Any]) -> bool:  # fmt: skip
        """The incumbent's untimed pass before the timed one (variant 0's prompts and tokens):
        as warm as the candidate is after its two checked passes (Triton's compiles, a graph per
        bucket captured), so its first step of a bucket in the timed pass is not slower for that
        alone (the bias would favour the candidate). Its replies are checked for errors, its
        logits are not (no reference run: the timed pass checks every step it times). False: it
        failed (the reason in `rec`)."""
        torch, ref = self.torch, self.ref
        # No reset, poison or NaN slot: nothing of this pass is checked, and a trace's first step
        # gives every sequence its prompt (step_trace's fixed and dynamic traces).
        for index, (prompts, toks) in enumerate(step_trace.schedule(trace, 0, state.config.vocab)):
            for b, length, seed in prompts:
                ref.prefill(state, b, length, seed)
            views["tokens"].copy_(torch.tensor(toks, dtype=torch.int64))
            if self.sync is not None:
                self.sync()
            reply, _ = kid.ask({"op": "step", "host_lengths": list(state.host_lengths),
                                "record": self.replay})  # fmt: skip
            err = guard.error_text(reply)
            if err or not reply.get("copied"):
                why = f"the step raised {err}" if err else "the logits are not a plain tensor"
                self.fail(rec, "candidate_error" if err else "wrong_shape",
                          f"warm-up step {index}: {why}")  # fmt: skip
                return False
            if self.replay and not self.program(kid.role, index, reply, rec,
                                                f"warm-up step {index}"):  # fmt: skip
                return False
            ref.advance(state)
        return True

    def program(self, role: str, key: int, reply: dict[str, Any], rec: dict[str, Any],
                where: str) -> bool:  # fmt: skip
        """The recording in a step's reply checked (step_schema) and handed to the role's
        replay process as program `key` (the step's index in the trace), with the kernels that
        process has not loaded yet. False: refused (the reason in `rec`)."""
        kernels = self.kernels.setdefault(role, {})
        try:
            prog = step_schema.validate(reply.get("recording"), self.env.device, kernels)
        except Bad as exc:
            self.fail(rec, exc.code, f"{where}: the recorded step: {exc}")
            return False
        loaded = self.loaded[role]
        new = [kernels[k] for k in prog.pop("uses") if k not in loaded]
        # A step whose recording repeats an earlier one of the trace (the same calls on the same
        # storages: a bucket's steps, for most steps) names that one: one program, one graph.
        digest = hashlib.sha256(json.dumps(prog, sort_keys=True).encode()).hexdigest()
        same = self.recorded[role].setdefault(digest, key)
        counts = self.result.setdefault("replay", {}).setdefault(
            f"{role}:{rec['name']}", {"steps": 0, "programs": 0})  # fmt: skip
        counts["steps"] += 1
        counts["programs"] += same == key
        msg = {"key": key, "same_as": same} if same != key else {"key": key, "program": prog}
        answer, _ = self.replayers[role].ask({"op": "program", **msg, "kernels": new})
        err = guard.error_text(answer)
        if err:
            self.fail(rec, "candidate_error", f"{where}: the replay could not load the recorded "
                      f"step ({err})")  # fmt: skip
            return False
        loaded.update(k["id"] for k in new)
        return True

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
            record = self.replay and variant == PASSES - 1  # the timed pass replays these
            with phase("candidate"):
                sent = time.perf_counter()
                kid.send({"op": "step", "host_lengths": expected, "record": record})
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
            if record and not self.program(kid.role, index, reply, rec, where):
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

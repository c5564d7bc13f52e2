"""Guarded verify, parent side: the trusted process that never imports candidate code.

Runs inside the GPU-side runner (`mode: "verify"`), next to runner.py (staged and hash-checked
the same way); standard library, torch and triton only. For every hidden case it
1. draws fresh inputs (a seed mixed with os.urandom, so no file ever predicts them), keeps
   private pristine copies and computes the expected values from those copies BEFORE any
   candidate call; the expected tensors never leave this process;
2. shares the input buffers (>= 2, so addresses differ) and output slots with the candidate's
   child process (guard_child.py, started before any of that exists) and asks it to call the
   candidate; the child copies each output into a slot and answers with JSON facts;
3. judges every call here: output compared with the expected values, inputs compared with the
   pristine copies, the child's observations (Triton launches, torch calls, threads, audit
   events, patched functions) turned into reason codes;
4. on a GPU: a profiler pass (kernel list and streams of one call), then CUDA-graph timing in
   the child with the buffers refilled from a pool in a random order and the outputs poisoned
   before every sample, every timed call's output checked here with a fused compare kernel,
   and this process's wall clock around each sample kept for the cross-check;
5. with an incumbent (the best final checkpoint), a second child in the same layout, timed
   interleaved A B B A on the same buffers.
It returns raw measurements; the host (tools/verify.py) computes the verdict from them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
import types
from typing import Any

import guard_child
import guard_gpu

_perf = time.perf_counter
PRECISION_PROBES = ("large_magnitude", "tiny_magnitude")


class KidFailed(Exception):
    def __init__(self, code: str, detail: str, role: str) -> None:
        super().__init__(detail)
        self.code, self.role = code, role


class Kid:
    """One child process running one candidate (the candidate or the incumbent)."""

    def __init__(self, ctx, role: str, cfg: dict[str, Any], timeout_s: float) -> None:
        self.role, self.timeout_s, self.dir = role, timeout_s, cfg["candidate_dir"]
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=guard_child.main, args=(child_conn, cfg), daemon=True)
        self.proc.start()
        child_conn.close()
        self.names: set[str] = set()  # the candidate's own Triton kernels seen launching

    def ask(
        self, *msg: Any, timeout_s: float | None = None, spin: bool = False
    ) -> tuple[dict[str, Any], float]:
        """Send a request, wait for the JSON answer; returns (answer, wall-clock us here).
        `spin` busy-waits instead of sleeping: a sleeping CPU's wake-up (hundreds of us on some
        hosts) would otherwise land in the wall clock of a timed sample."""
        t0 = _perf()
        try:
            self.conn.send(msg)
            if not self._wait(timeout_s or self.timeout_s, spin):
                raise KidFailed("timeout", f"no answer to {msg[0]!r} in time", self.role)
            raw = self.conn.recv_bytes(maxlength=8 << 20)
        except (EOFError, OSError, BrokenPipeError) as exc:
            self.proc.join(1)
            raise KidFailed(
                "candidate_crashed", f"process died (exit {self.proc.exitcode})", self.role
            ) from exc
        wall_us = (_perf() - t0) * 1e6
        reply = json.loads(raw)  # JSON only: nothing the child sends is ever unpickled
        if not isinstance(reply, dict):
            raise KidFailed("harness_tampered", f"answered {type(reply).__name__}", self.role)
        if "fatal" in reply:
            raise KidFailed("candidate_crashed", str(reply["fatal"]), self.role)
        return reply, wall_us

    def _wait(self, timeout_s: float, spin: bool) -> bool:
        if not spin:
            return self.conn.poll(timeout_s)
        deadline = _perf() + timeout_s
        while not self.conn.poll(0):
            if _perf() > deadline:
                return False
        return True

    def close(self) -> None:
        try:
            self.conn.send(("exit",))
        except OSError:
            pass
        self.proc.join(3)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(3)


# ----------------------------------------------------------------------------------------------
# judging one call


def facts_codes(facts: dict[str, Any], names: set[str]) -> list[list[str]]:
    """[code, detail] for everything the child observed that an honest call never shows."""
    codes: list[list[str]] = []
    if facts.get("error"):
        codes.append(["candidate_error", str(facts["error"])])
    if not facts.get("plain", False):
        codes.append(["not_plain_tensor", f"returned {facts.get('type')}, not a torch.Tensor"])
    if facts.get("aliases_input"):
        codes.append(["output_aliases_input", "the output shares storage with an input"])
    if facts.get("reused_output"):
        codes.append(["output_reused", "the output is the storage of an earlier output"])
    launches = [x for x in facts.get("launches") or [] if isinstance(x, list) and len(x) == 3]
    own = [str(n) for n, mine, _ in launches if mine]
    names.update(own)
    if not own and not facts.get("error"):
        codes.append(["no_triton_launch", "no @triton.jit function of kernel.py was launched"])
    foreign = sorted({str(n) for n, mine, _ in launches if not mine})
    if foreign:
        codes.append(["foreign_kernel", f"launched kernels from outside kernel.py: {foreign}"])
    if not all(ok for _, _, ok in launches):
        codes.append(["side_stream", "a kernel was launched on another stream than the caller's"])
    if facts.get("torch_ops"):
        codes.append(["torch_compute", f"torch math outside Triton: {facts['torch_ops'][:8]}"])
    if facts.get("host"):
        codes.append(["host_compute", f"tensor data moved to the host: {facts['host']}"])
    codes += load_codes(facts)
    return codes


def load_codes(facts: dict[str, Any]) -> list[list[str]]:
    codes = [[str(c), str(d)] for c, d in (facts.get("audit") or [])]
    if facts.get("tampered"):
        codes.append(["monkey_patch", f"replaced: {facts['tampered']}"])
    if facts.get("threads"):
        codes.append(["background_thread", f"threads left running: {facts['threads']}"])
    return codes


def judge(rt, torch, facts, slot, expected, tol, spec, bufs, pristine, kid) -> dict[str, Any]:
    """One call's record: passed, codes, errors. Restores the inputs for the next call."""
    codes = facts_codes(facts, kid.names)
    out_shape, out_dtype = spec
    stats: dict[str, Any] = {}
    if facts.get("plain") and (
        list(facts.get("shape") or []) != list(out_shape)
        or facts.get("dtype") != str(out_dtype).removeprefix("torch.")
        or facts.get("device") != slot.device.type
    ):
        codes.append(
            [
                "wrong_shape",
                f"{facts.get('shape')} {facts.get('dtype')} "
                f"{facts.get('device')}, expected {list(out_shape)} {out_dtype}",
            ]
        )
    elif facts.get("copied"):
        ok, reason, stats = rt.compare(torch, slot, expected, tol, out_shape, out_dtype, [])
        if not ok:
            codes.append(["wrong_output", reason])
    elif facts.get("plain") and not facts.get("error"):
        codes.append(["wrong_output", "the output never reached the checker"])
    changed = [
        i
        for i, (b, p) in enumerate(zip(bufs, pristine, strict=True))
        if isinstance(b, torch.Tensor) and not torch.equal(b, p)
    ]
    for i in changed:
        bufs[i].copy_(pristine[i])
    if changed:
        codes.append(["inputs_modified", f"input(s) {changed} changed by the call"])
    return {
        "passed": not codes,
        "codes": codes,
        "max_abs_err": stats.get("max_abs_err"),
        "wall_us": facts.get("wall_us"),
        "os_threads": facts.get("os_threads"),
    }


def null_control(torch, args, expected, tol, spec) -> dict[str, bool]:
    """Outputs that compute nothing must fail the checker, or this case proves nothing."""
    out_shape, out_dtype = spec
    zeros = torch.zeros(out_shape, dtype=out_dtype, device=expected.device)
    copy = args[0].clone() if tuple(args[0].shape) == tuple(out_shape) else zeros
    out = {}
    for name, t in (("zeros_rejected", zeros), ("input_copy_rejected", copy.to(out_dtype))):
        diff = (t.float() - expected).abs()
        accepted = bool((diff <= tol["atol"] + tol["rtol"] * expected.abs()).all())
        out[name] = not accepted
    return out


# ----------------------------------------------------------------------------------------------
# one case


class CaseRun:
    def __init__(self, rt, env, ev, kids: list[Kid], rng: random.Random, req: dict) -> None:
        self.rt, self.env, self.ev, self.kids, self.rng, self.req = rt, env, ev, kids, rng, req
        self.torch = env.torch

    def inputs(self, shape, dtype, salt: int):
        args, kwargs = self.ev.make(shape, dtype, salt)
        pristine = [a.clone() if isinstance(a, self.torch.Tensor) else a for a in args]
        expected = self.ev.ref.reference(*pristine, **kwargs)  # private: computed, never shared
        return list(args), kwargs, pristine, expected

    def run(self, case: dict[str, Any], idx: int, probes: list[str]) -> dict[str, Any]:
        torch, ev, env = self.torch, self.ev, self.env
        self.partial: dict[str, Any] = {**case, "calls": []}
        shape = ev.case_shape(case)
        dtype = self.rt.dtype_of(torch, case["dtype"])
        tol = ev.tolerances[case["dtype"]]
        nbytes = int(ev.ref.bytes_moved(shape, torch.finfo(dtype).bits // 8))
        n_check = max(2, int(self.req.get("checks", 3)))
        n_sets = n_check
        if not env.interpret:  # as runner.py: input sets that together exceed 2.5x the L2
            n_sets = max(2, -(-int(2.5 * env.l2_bytes) // max(nbytes, 1)))
            n_sets = min(n_sets, max(2, (4 << 30) // max(nbytes, 1)), 64)
        salt = idx * 1009
        sets = [self.inputs(shape, dtype, salt + j) for j in range(max(n_check, n_sets))]
        spec = ev.ref.output_spec(*sets[0][2], **sets[0][1])
        plan = [(j, "check") for j in range(n_check)]
        # Buffer 0 again with new contents: a result cached by address, id or shape goes stale.
        fresh = self.inputs(shape, dtype, salt + 991)
        sets.append((sets[0][0], fresh[1], fresh[2], fresh[3]))
        recheck = len(sets) - 1
        plan.append((recheck, "recheck"))
        gen = torch.Generator().manual_seed(ev.seed + salt)
        for name in probes:
            a, k = ev.ref.PROBES[name](dtype, env.device, gen)
            p = [t.clone() if isinstance(t, torch.Tensor) else t for t in a]
            sets.append((list(a), k, p, ev.ref.reference(*p, **k)))
            plan.append((len(sets) - 1, f"precision:{name}"))
        if not env.interpret:
            plan.append((recheck, "profile"))  # its kernels and streams listed
        res: dict[str, Any] = {
            "name": case["name"],
            "dtype": case["dtype"],
            "shape": shape,
            "bytes": nbytes,
            "calls": [],
            "error": "",
            "null_control": null_control(torch, sets[0][2], sets[0][3], tol, spec),
        }
        specs = [ev.ref.output_spec(*sets[j][2], **sets[j][1]) for j, _ in plan]
        slots = {
            k.role: [torch.empty(sh, dtype=dt, device=env.device) for sh, dt in specs]
            for k in self.kids
        }
        self.partial = res  # what was judged so far survives a dying child
        for kid in self.kids:
            kid.ask("case", [(s[0], s[1]) for s in sets], slots[kid.role])
        for n, (j, kind) in enumerate(plan):
            args, _, pristine, expected = sets[j]
            if kind == "recheck":
                for buf, src in zip(args, pristine, strict=True):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(src)
            # A B, B A, A B, ...: the incumbent's calls interleave with the candidate's.
            for kid in self.kids[:: 1 if n % 2 == 0 else -1]:
                facts, wall_us = kid.ask("call", j, n, kind == "profile")
                slot = slots[kid.role][n]
                rec = judge(
                    self.rt, torch, facts, slot, expected, tol, specs[n], args, pristine, kid
                )
                if kind.startswith("precision"):
                    rec["codes"] = [
                        ["precision" if c == "wrong_output" else c, d] for c, d in rec["codes"]
                    ]
                if kind == "profile":
                    rec["profile"] = guard_gpu.kernel_list(facts.get("kernels"), kid.names)
                    rec["codes"] += rec["profile"]["codes"]
                    rec["passed"] = not rec["codes"]
                rec.update(role=kid.role, kind=kind, set=j, parent_wall_us=wall_us)
                res["calls"].append(rec)
        ok = all(r["passed"] for r in res["calls"] if r["role"] == "candidate")
        if ok and not env.interpret:
            device_us = res["calls"][-1].get("profile", {}).get("device_us", 0.0)
            extra = self.inputs(shape, dtype, salt + 997)
            res["timing"] = guard_gpu.time_samples(
                self, sets[:n_sets], extra, spec, tol, device_us, load_codes
            )
        for kid in self.kids:
            kid.ask("end_case")
        return res


# ----------------------------------------------------------------------------------------------
# the mode


def _harden() -> None:
    """Make this process non-dumpable: same-user processes (the candidate's child) can then not
    read its memory through /proc/<pid>/mem or open its file descriptors."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        except (OSError, AttributeError):
            pass


def verify(env, req: dict[str, Any], rt: types.ModuleType) -> dict[str, Any]:
    """The guarded verify of req['candidate_dir'] (and req['baseline_dir'], the incumbent)."""
    started = _perf()
    if any(name.startswith("_hl_candidate") for name in sys.modules):
        raise RuntimeError(
            "the guarded verify needs a fresh runner process (this one has run "
            "candidate code); the launcher's fresh=True gives one"
        )
    torch = env.torch
    stage = os.path.dirname(os.path.abspath(str(rt.__file__)))
    # The request file names the hidden cases: gone before any candidate process exists.
    if req.get("request_id"):
        try:
            os.unlink(os.path.join(stage, "requests", f"{req['request_id']}.json"))
        except OSError:
            pass
    # A GPU needs "spawn": CUDA cannot be forked once initialised. On the interpreter the child
    # is forked here, before any input or expected value exists, with the protocol stream
    # closed in it first thing: it inherits nothing secret and skips a torch import (~1.7 s of
    # CPU, a third of a verify).
    method = "spawn" if env.device == "cuda" else "fork"
    ctx = torch.multiprocessing.get_context(method)
    timeout_s = float(req.get("case_timeout_s", 120))
    protected = [stage, *req.get("protected_paths", [])]
    close = [rt._OUT.fileno()] if method == "fork" and hasattr(rt, "_OUT") else []
    kids = []
    for role, key in (("candidate", "candidate_dir"), ("incumbent", "baseline_dir")):
        if req.get(key):
            cfg = {
                "device": env.device,
                "candidate_dir": req[key],
                "protected": protected,
                "close_fds": close,
            }
            kids.append(Kid(ctx, role, cfg, timeout_s))
    _harden()
    # Expected values come from inputs nobody can predict: the host's seed mixed with urandom.
    digest = hashlib.sha256(f"{req.get('seed', 0)}:{os.urandom(16).hex()}".encode()).hexdigest()
    req = {**req, "seed": int(digest[:15], 16)}
    ev = rt.Evaluator(env, req)
    copy_gbps = env.copy_gbps()
    rng = random.Random(digest)
    result: dict[str, Any] = {
        "status": "measured",
        "input_seed": req["seed"],
        "cases": [],
        "copy_gbps": copy_gbps,
        "nonce": req.get("nonce"),
        "load": {},
        "clocks": {} if env.interpret else guard_gpu.clocks(),
    }
    try:
        return _run_cases(rt, env, ev, kids, rng, req, result, started)
    except KidFailed as exc:
        result["error"], result["error_code"] = f"{exc.role}: {exc}", exc.code
        result["wall_s"] = _perf() - started
        return result
    finally:
        for kid in kids:
            kid.close()


def _run_cases(rt, env, ev, kids: list[Kid], rng, req, result, started) -> dict[str, Any]:
    live = []
    for kid in kids:
        reply, _ = kid.ask("load", kid.dir, req["entry"])
        result["load"][kid.role] = {
            "ok": bool(reply.get("ok")),
            "error": reply.get("error"),
            "codes": load_codes(reply),
        }
        if reply.get("ok") or kid.role == "candidate":
            live.append(kid)
    if not result["load"]["candidate"]["ok"]:
        result["error"] = result["load"]["candidate"]["error"]
        result["error_code"] = "import_failed"
        return result
    run = CaseRun(rt, env, ev, live, rng, req)
    seen_dtypes: set[str] = set()
    for idx, case in enumerate(req["cases"]):
        # Precision probes (wide-range inputs) once per dtype: fp16 accumulation fails them.
        probes = (
            []
            if case["dtype"] in seen_dtypes
            else [p for p in PRECISION_PROBES if p in getattr(ev.ref, "PROBES", {})]
        )
        seen_dtypes.add(case["dtype"])
        try:
            res = run.run(case, idx, probes)
        except KidFailed as exc:
            if exc.role != "incumbent":
                run.partial.update(error=str(exc), error_code=exc.code)
                result["cases"].append(run.partial)
                raise
            result["incumbent_error"] = f"{exc.code}: {exc}"  # the comparison is lost, not the
            run.kids = [k for k in run.kids if k.role == "candidate"]  # verdict
            res = run.run(case, idx, probes)
        rt.emit({"event": "case", "name": res["name"], "status": "measured"})
        result["cases"].append(res)
        if not all(c["passed"] for c in res["calls"] if c["role"] == "candidate"):
            break  # rejected: the remaining cases would cost time and change nothing
    result["wall_s"] = _perf() - started
    return result

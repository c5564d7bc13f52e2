"""Guarded verify, trusted parent side: the process that decides and never runs agent Python.

Runs inside the GPU-side runner (`mode: "verify"`, a fresh process that never imported candidate
code), staged and hash-checked like runner.py; standard library, torch and triton only. For
every hidden case it
1. draws fresh inputs (the host's seed mixed with os.urandom, so no file predicts them) for the
   check calls, for every size edge and value family of the generic suite (numerics.py: odd
   dims, a single row, an empty batch, a long reduction; offsets, per-column and per-row
   scales, outliers, near-overflow, subnormals, signed zeros, ties) and for the task's own
   edge cases (reference.edge_cases), keeps pristine copies and computes the expected values
   from them BEFORE any candidate code runs; the expected values never leave this process;
2. runs the candidate (and the incumbent, the best final checkpoint) in sandboxed processes
   (sandbox.py; guard_child.py; guard_kid.Kid is this side's handle on one) that it cannot
   trust:
   - on the Triton CPU interpreter the candidate's process computes each output into a slot of
     a shared arena; this process compares;
   - on a GPU the candidate's process only records its launches (replay.py's docstring); a
     replay process with no agent Python launches them on inputs this process wrote, in memory
     this process owns, and this process compares every output, the timed ones included, in
     its own CUDA context; the replay process times its own replays;
3. judges every call here and writes every reason's text itself (the candidate's process
   reports reason codes; no string it produced is kept).
It returns raw measurements; the host (tools/integrity/verify.py) computes the verdict from them.
The candidates' processes (their sandbox, their early start) are guard_spawn.py, the interpreter's
path (the shared arena, a case) guard_cpu.py, the GPU path (record, replay, time) guard_gpu.py;
siblings are imported by the one rule in runner.py's docstring.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import random
import sys
import time
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import numerics
    from ..isolation import sandbox_limits
    from ..isolation import sandbox_policy as sp
    from . import guard_spawn, phase_lock
    from .guard_kid import Kid, KidFailed, Roles, close_all, stage_root
else:  # the runner that imports this put the staged folder on sys.path
    import guard_spawn
    import numerics
    import phase_lock
    import sandbox_limits
    import sandbox_policy as sp
    from guard_kid import Kid, KidFailed, Roles, close_all, stage_root

_perf = time.perf_counter
PRECISION_PROBES = ("large_magnitude", "tiny_magnitude")
# Reason codes a candidate's process may report (anything else it sends is dropped).
CHILD_CODES = {
    "torch_compute": "torch math ran outside Triton launches",
    "foreign_kernel": "a kernel not defined in the candidate's files was launched",
    "side_stream": "a kernel was launched on another stream than the caller's",
    "host_compute": "tensor data was moved to the host",
    "background_thread": "threads started by the candidate were alive after the call",
    "introspection": "frame, gc or ctypes introspection",
    "subprocess": "processes were started or signalled",
    "monkey_patch": "attributes of library or harness objects were replaced",
    "dynamic_code": "exec/eval/compile",
    "exfiltration": "a network connection was attempted",
    "harness_access": "the candidate imported the harness's own modules",
}


# ----------------------------------------------------------------------------------------------
# judging one call (the texts here are the harness's own)


def child_codes(reply: dict[str, Any], where: str) -> list[list[str]]:
    """Reason codes the candidate's process observed, with text composed here."""
    codes = reply.get("codes")
    if not isinstance(codes, list):
        return []
    out = []
    for c in codes:
        if isinstance(c, str) and c in CHILD_CODES:
            out.append([c, f"{where}: {CHILD_CODES[c]} (seen in the candidate's process)"])
    return out


def error_text(reply: dict[str, Any]) -> str:
    kind = reply.get("error")
    if not isinstance(kind, str) or not kind:
        return ""
    ok = kind.replace(".", "").replace("_", "").isalnum() and len(kind) <= 80
    return kind if ok else "CandidateDefinedError"


def output_check(rt, torch, out, expected, tol: dict[str, float], spec) -> tuple[bool, str, Any]:
    """rt.compare, with a fixed reason: no size, index or count (they would give the hidden
    shape away) and no error value (the candidate chooses it: a value written where the
    reference is 0 comes back as the error). The figures stay in `stats`, for the operator."""
    out_shape, out_dtype = spec
    ok, _, stats = rt.compare(torch, out, expected, tol, out_shape, out_dtype, [])
    if ok:
        return True, "", stats
    if tuple(out.shape) != tuple(out_shape) or out.dtype != out_dtype:
        return False, "output shape or dtype differs from the reference's", stats
    if stats.get("nan") or stats.get("inf"):
        return False, "output has NaN or Inf values (unwritten or overflowed)", stats
    return False, "output out of tolerance", stats


def null_control(torch, args, expected, tol, spec) -> dict[str, bool]:
    """Outputs that compute nothing must fail the checker, or this case proves nothing."""
    out_shape, out_dtype = spec
    if expected.numel() == 0:
        return {"zeros_rejected": True, "input_copy_rejected": True}
    zeros = torch.zeros(out_shape, dtype=out_dtype, device=expected.device)
    copy = args[0].clone() if tuple(args[0].shape) == tuple(out_shape) else zeros
    out = {}
    for name, t in (("zeros_rejected", zeros), ("input_copy_rejected", copy.to(out_dtype))):
        diff = (t.float() - expected).abs()
        accepted = bool((diff <= tol["atol"] + tol["rtol"] * expected.abs()).all())
        out[name] = not accepted
    return out


def _precision_kind(kind: str) -> bool:
    """Wide and tiny magnitudes test the arithmetic's precision; other edges (zero rows,
    saturation, odd sizes) test plain correctness."""
    name = kind.split(":", 1)[-1]
    return kind.startswith("precision") or any(w in name for w in ("range", "tiny", "magnitude"))


class Variant:
    """One set of inputs a case is checked on: args, kwargs, pristine copies, expected."""

    def __init__(self, kind: str, args: list[Any], kwargs: dict[str, Any], torch, ref,
                 family: str = "") -> None:  # fmt: skip
        self.kind, self.family = kind, family or kind  # the family: raw record, operator's text
        self.args, self.kwargs = list(args), dict(kwargs)
        self.pristine = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.args]
        self.expected = ref.reference(*self.pristine, **self.kwargs)  # computed before any call
        self.spec = ref.output_spec(*self.pristine, **self.kwargs)

    def signature(self) -> str:
        """Shapes, dtypes and scalar values: what a recording depends on."""
        parts = []
        for a in self.args:
            if hasattr(a, "shape"):
                parts.append(f"T{list(a.shape)}:{str(a.dtype).removeprefix('torch.')}")
            else:
                parts.append(repr(a))
        return "|".join(parts) + "|" + json.dumps(self.kwargs, sort_keys=True, default=str)


def arg_specs(torch, variant: Variant) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = []
    for a in variant.args:
        if isinstance(a, torch.Tensor):
            specs.append({"tensor": {"shape": list(a.shape), "dtype": str(a.dtype)[6:]}})
        elif isinstance(a, bool | int | float) or a is None:
            specs.append({"value": a})
        else:
            raise TypeError(f"unsupported input argument type {type(a).__name__}")
    return specs


# ----------------------------------------------------------------------------------------------
# the mode


class Verify(Roles):
    def __init__(self, env, req: dict[str, Any], rt: types.ModuleType) -> None:
        self.env, self.req, self.rt, self.torch = env, req, rt, env.torch
        self.started = _perf()
        digest = hashlib.sha256(f"{req.get('seed', 0)}:{os.urandom(16).hex()}".encode())
        self.req = {**req, "seed": int(digest.hexdigest()[:15], 16)}
        self.rng = random.Random(digest.hexdigest())
        self.ev = rt.Evaluator(env, self.req)
        self.timeout_s = float(req.get("case_timeout_s", 120))
        self.kids: list[Any] = []
        self.scratch_root = os.path.join(stage_root(), "scratch")
        # State the case methods fill in as the verify goes (declared here, not stashed):
        self.skipped: dict[str, list[list[str]]] = {}  # per case: edges the reference cannot take
        self.partial: dict[str, Any] | None = None  # the last case record (kept on a failure)
        self.arena: mmap.mmap | None = None  # the CPU path's shared arena (guard_cpu.py) ...
        self.arena_size = 0  # ... its size (guard_cpu.arena_fd) ...
        self.arena_sent = False  # ... and whether the candidate's processes have mapped it
        self.replayers: dict[str, Kid] = {}  # the GPU path, per role: guard_gpu.replayer
        self.replay_sandbox: dict[str, dict[str, Any]] = {}  # per role: its sandbox's report
        self.loaded: dict[str, set[str]] = {}  # per role: kernel ids its replayer holds
        os.makedirs(self.scratch_root, mode=0o700, exist_ok=True)
        # The GPU's lock file, held here phase by phase (phase_lock.py), when the host asked.
        held = req.get("gpu_lock") or {}
        self.phases = rt.Phases()  # `with self.phases("load"):` adds the block's wall time
        self.lock = phase_lock.PhaseLock(
            held.get("file"), int(held.get("gpu", 0)),
            lambda message: rt.emit({"event": "waiting", "message": message}),
        )  # fmt: skip

    def policy(self, read: list[str], **kw: Any) -> sp.Policy:
        return guard_spawn.child_policy(self.req, self.scratch_root, read, **kw)

    def candidate_kid(self, role: str, cand_dir: str, memfd: int | None) -> Any:
        kid = guard_spawn.EARLY.pop(role, None)  # started before this process imported torch
        if kid is not None and (
            self.env.interpret or memfd is not None or kid.cand_dir != cand_dir
        ):
            kid.close()  # started for another mode than this process found: not used
            kid = None
        if kid is None:
            kid = guard_spawn.spawn_child(self.req, role, cand_dir, self.env.interpret, memfd)
        kid.cfg = {  # type: ignore[attr-defined]
            "device": self.env.device,
            "candidate_dir": cand_dir,
            "entry": self.req["entry"],
            "module": getattr(self.ev.ref, "MODULE", None),  # how to build a ModelNew class
            "memfd": memfd,
        }
        return kid

    def run(self) -> dict[str, Any]:
        req, env = self.req, self.env
        cases = req["cases"]
        self.variants_per_case: dict[int, list[Variant]] = {}
        if env.interpret:  # every case's inputs first: the one shared arena fits the largest
            for idx, case in enumerate(cases):
                self.case_variants(case, idx)
        memfd = _cpu().arena_fd(self) if env.interpret else None
        result: dict[str, Any] = {
            "status": "measured",
            "input_seed": req["seed"],
            "cases": [],
            "copy_gbps": None,  # measured in the timed window (time_cases)
            "nonce": req.get("nonce"),
            "load": {},
            "sandbox": {},
            # The interpreter certifies outputs only: there the candidate's process reports its
            # own launches (and can forge the report); a GPU's replay runs them itself.
            "certifies": "outputs" if env.interpret else "correctness_and_speed",
            "clocks": {} if env.interpret else _gpu().clocks(),
        }
        try:
            with self.phases("start"):
                for role, folder in guard_spawn.roles(req):
                    self.kids.append(self.candidate_kid(role, folder, memfd))
                for kid in list(self.kids):
                    with self.incumbent_may_fail(result):
                        result["sandbox"][kid.role] = kid.started()
                        kid.send({**kid.cfg})
            asked = {}
            for kid in list(self.kids):  # every role imports at once: the host's CPUs
                with self.incumbent_may_fail(result):
                    kid.send({"op": "load"})
                    asked[kid.role] = _perf()
            if not env.interpret and self.kids and cases:  # the first case's inputs meanwhile
                self.case_variants(cases[0], 0)
            for kid in list(self.kids):
                with self.incumbent_may_fail(result):
                    with self.phases("load"):  # what is left of the imports after that
                        reply, _ = kid.reply(asked[kid.role])
                    err = error_text(reply)
                    result["load"][kid.role] = {
                        "ok": bool(reply.get("ok")) and not err,
                        "error": f"import failed: {err}" if err else "",
                        "codes": child_codes(reply, "at import"),
                    }
                    if not result["load"][kid.role]["ok"] and kid.role == "incumbent":
                        raise KidFailed("import_failed", "import failed", kid.role)
            if not result["load"]["candidate"]["ok"]:
                result["error"] = result["load"]["candidate"]["error"] or "import failed"
                result["error_code"] = "import_failed"
                return result
            self.run_cases(result, memfd)
        except KidFailed as exc:
            result["error"], result["error_code"] = f"{exc.role}: {exc}", exc.code
        finally:
            close_all([*self.kids, *self.replayers.values()])
            sandbox_limits.sweep(self.scratch_root)  # whatever a child did, nothing stays
            self.lock.close()
            if memfd is not None:
                os.close(memfd)
            result["wall_s"] = _perf() - self.started
            # where the time went (the operator's view: withheld from a public verdict)
            result["phases_s"] = {**self.phases, "gpu_lock_wait": self.lock.waited_s}
        return result

    # -- inputs ----------------------------------------------------------------------------------
    def variants(self, case: dict[str, Any], idx: int) -> list[Variant]:
        """Check calls on fresh inputs, then every size edge and value family of the generic
        suite (numerics.py) and the task's own edge cases, all drawn from this verify's seed
        (a task without edge_cases gets its precision probes on the first two cases). Edges
        the reference cannot take are left out and listed in the case's raw record. A reason
        text names the kind (edge or precision) and the family; an agent never reads it (the
        public verdict has one fixed sentence per reason code)."""
        torch, ev = self.torch, self.ev
        shape = ev.case_shape(case)
        dtype = self.rt.dtype_of(torch, case["dtype"])
        n_check = max(2, int(self.req.get("checks", 3)))
        out = []
        for j in range(n_check):
            args, kwargs = ev.make(shape, dtype, idx * 1009 + j)
            out.append(Variant("check", list(args), kwargs, torch, ev.ref))
        gen = torch.Generator(device=self.env.device)
        gen.manual_seed((ev.seed + idx * 7919) % (2**63))
        suite = self.suite()
        skipped = self.skipped.setdefault(case["name"], [])
        for edge in suite.edges(shape, dtype, gen, ev.tolerances[case["dtype"]]):
            if not edge.applicable:
                skipped.append([edge.name, edge.why])
                continue
            kind = "precision" if edge.precision else "edge"
            out.append(Variant(kind, list(edge.args), edge.kwargs, torch, ev.ref, edge.name))
        edges = getattr(ev.ref, "edge_cases", None)
        if edges is not None:
            small = suite.family_shape(shape)
            for name, (args, kwargs) in edges(small, dtype, self.env.device, gen):
                kind = "precision" if _precision_kind(f"edge:{name}") else "edge"
                out.append(Variant(kind, list(args), kwargs, torch, ev.ref, name))
        elif idx < 2:
            cpu = torch.Generator().manual_seed(ev.seed + idx)
            for name in PRECISION_PROBES:
                if name in getattr(ev.ref, "PROBES", {}):
                    args, kwargs = ev.ref.PROBES[name](dtype, self.env.device, cpu)
                    out.append(Variant("precision", list(args), kwargs, torch, ev.ref, name))
        return out

    def suite(self) -> Any:
        """The generic adversarial inputs (numerics.py) for this task and device."""
        return numerics.Suite(
            self.torch, self.ev.ref, self.env.device, self.req.get("numerics"),
            interpret=self.env.interpret, scale=lambda s: self.ev.case_shape({"shape": s}),
        )  # fmt: skip

    # -- cases -----------------------------------------------------------------------------------
    def run_cases(self, result: dict[str, Any], memfd: int | None) -> None:
        """Check every case (stopping at the first the candidate fails), then time them all."""
        timers: list[tuple[dict[str, Any], Any]] = []
        for idx, case in enumerate(self.req["cases"]):
            try:
                res, timer = self.without_failed_incumbent(
                    result, functools.partial(self.one_case, case, idx, memfd)
                )
            except KidFailed as exc:  # the candidate's: its case so far goes to the verdict
                partial = self.partial or {"calls": []}
                partial.update(error=str(exc), error_code=exc.code)
                result["cases"].append(partial)
                raise
            self.rt.emit({"event": "case", "index": idx, "status": "measured"})
            result["cases"].append(res)
            if not self.env.interpret:  # on a GPU one case's tensors live at a time
                self.variants_per_case.pop(idx, None)
                self.torch.cuda.empty_cache()  # to the verifies beside this one
            if not all(c["passed"] for c in res["calls"] if c["role"] == "candidate"):
                timers = []  # rejected: timing the rest would cost time and change nothing
                break
            if timer is not None:
                timers.append((res, timer))
        self.time_cases(result, timers)

    def case_variants(self, case: dict[str, Any], idx: int) -> list[Variant]:
        """A case's inputs and expected values, made when first asked. On a GPU that is when
        the case is checked, and run_cases drops them after it: one case's tensors live at a
        time (with all six of rmsnorm_gate's held, a verify's parent had 13.6 GiB allocated when
        four verifies at once ran an H100 out of memory)."""
        if idx not in self.variants_per_case:
            with self.phases("inputs"), self.lock.work():
                self.variants_per_case[idx] = self.variants(case, idx)
        return self.variants_per_case[idx]

    def one_case(self, case: dict[str, Any], idx: int, memfd: int | None) -> tuple[Any, Any]:
        variants = self.case_variants(case, idx)
        if not self.env.interpret:
            return _gpu().gpu_case(self, case, idx, variants)
        with self.phases("check"), self.lock.work():  # the interpreter times by its checked calls
            return _cpu().cpu_case(self, case, idx, variants, memfd), None

    def time_cases(self, result: dict[str, Any], timers: list[tuple[dict[str, Any], Any]]) -> None:
        """The verify's one timed window: the GPU held alone (phase_lock.py) for the copy
        bandwidth and every case's timed samples, after every check passed. One window, not
        one hold per sample: per sample, four verifies on an H200 all ended together as late
        as the last of them does with one window each (2.29x one alone against 2.30x), so
        their mean wait was longer (BENCHMARKS.md)."""
        with self.phases("time"), self.lock.exclusive():
            result["copy_gbps"] = self.env.copy_gbps()
            for res, timer in timers:  # each times the roles still in self.kids
                res["timing"] = self.without_failed_incumbent(result, timer)

    def case_record(self, case: dict[str, Any], variants: list[Variant]) -> dict[str, Any]:
        torch = self.torch
        v0 = variants[0]
        tol = self.ev.tolerances[case["dtype"]]
        shape = self.ev.case_shape(case)
        nbytes = int(self.ev.ref.bytes_moved(shape, torch.finfo(v0.args[0].dtype).bits // 8))
        rec = {
            "name": case["name"],
            "dtype": case["dtype"],
            "shape": shape,
            "bytes": nbytes,
            "calls": [],
            "error": "",
            "null_control": null_control(torch, v0.pristine, v0.expected, tol, v0.spec),
            # the raw record only: which family each call set was, which edges did not apply
            "families": [v.family for v in variants],
            "inapplicable": self.skipped.get(case["name"], []),
        }
        self.partial = rec
        return rec

    def judge_call(self, reply, out, variant: Variant, tol, where: str,
                   inputs_now: list[Any]) -> dict[str, Any]:  # fmt: skip
        """One call's record from the child's reply (codes only) and this process's checks."""
        torch = self.torch
        codes = child_codes(reply, where)
        err = error_text(reply)
        if err:
            codes.append(["candidate_error", f"{where}: the entry function raised {err}"])
        if reply.get("plain") is False and not err:
            codes.append(["not_plain_tensor", f"{where}: the output is not a plain torch.Tensor"])
        if reply.get("aliases_input"):
            codes.append(["output_aliases_input", f"{where}: the output shares an input's storage"])
        if reply.get("reused_output"):
            codes.append(["output_reused", f"{where}: the output is an earlier call's storage"])
        if reply.get("plain") and not err and not int(reply.get("own_launches") or 0):
            if variant.expected.numel():
                codes.append(
                    ["no_triton_launch", f"{where}: no Triton kernel of the candidate ran"]
                )
        stats: dict[str, Any] = {}
        if out is not None:
            ok, why, stats = output_check(self.rt, torch, out, variant.expected, tol, variant.spec)
            if not ok:
                code = "precision" if _precision_kind(variant.kind) else "wrong_output"
                codes.append([code, f"{where}: {why}"])
        elif reply.get("plain") and not err:
            codes.append(["wrong_output", f"{where}: the output never reached the checker"])
        changed = [
            i for i, (now, p) in enumerate(zip(inputs_now, variant.pristine, strict=True))
            if isinstance(p, torch.Tensor) and not torch.equal(now, p)
        ]  # fmt: skip
        if changed:
            codes.append(["inputs_modified", f"{where}: input(s) {changed} changed by the call"])
        return {"passed": not codes, "codes": codes, "max_abs_err": stats.get("max_abs_err"),
                "max_rel_err": stats.get("max_rel_err")}  # fmt: skip


def _cpu():
    """The interpreter's path (guard_cpu.py), by plain name: it imports this module, so it is
    imported when first used (runner.py's docstring)."""
    import guard_cpu

    return guard_cpu


def _gpu():
    """The GPU path (guard_gpu.py), imported as _cpu() imports the interpreter's."""
    import guard_gpu

    return guard_gpu


def verify(env, req: dict[str, Any], rt: types.ModuleType) -> dict[str, Any]:
    """The guarded verify of req['candidate_dir'] (and req['baseline_dir'], the incumbent)."""
    if any(name.startswith("_hl_candidate") for name in sys.modules):
        raise RuntimeError(
            "the guarded verify needs a fresh runner process (this one has run candidate code)"
        )
    guard_spawn.harden()
    try:
        return Verify(env, req, rt).run()
    finally:
        close_all(guard_spawn.EARLY.values())  # any prespawn did not hand over
        guard_spawn.EARLY.clear()

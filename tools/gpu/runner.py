"""GPU-side runner: the protocol loop and the evaluator of a candidate kernel against a task's
reference (correctness per case, then timing).

Self-contained on purpose: it needs only the standard library, torch and triton, because the
toolkit copies it with its staged siblings to the GPU host (hash-checked) for every run. It
never imports harnesslab. Side of the trust boundary: in dev modes it runs inside sandbox.py
with the candidate; in the guarded verify (mode "verify") it hands over to guard.py. A step
task's dev traces (mode "step") run through step_trace.py, in the same sandboxed process. Usage:

    python runner.py REQUEST.json      one request, JSON events on stdout
    python runner.py --worker          warm worker: one JSON request per stdin line

Output protocol: one JSON object per line on the ORIGINAL stdout. Candidate code's own prints
are redirected to stderr so they cannot corrupt the stream. Events:
    {"event": "case", ...}     one per finished case (partial results survive a kill)
    {"event": "result", ...}   the whole result, last line of a request

One concern per file: timing.py (the device, the one timing implementation, a request's seconds
per phase), scores.py (the one score definition), correctness.py (checking an output),
failures.py (what a failed case says, the per-case deadline), diagnostics.py (the modes that
report without a score: probe, profile_target, step_profile), this file (the protocol loop and
the Evaluator's scoring modes). Env, Phases, compare, dtype_of and the score functions stay
importable from here for the lab, the benchmarks and guard.py, which are handed this module.

The sibling import rule (every staged module that imports a sibling at import time): this file
is used three ways, as the package module harnesslab.tools.gpu.runner (the host), loaded by
file path (the lab and benchmarks), and run as a script in the staged folder (the GPU host):

    if TYPE_CHECKING or __package__:   # the host's package import, and mypy
        from . import scores
    else:                              # by path or as a script: siblings by plain name
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        import scores

so mypy and the host see the package modules, and the staged folder needs no package.
(Modules imported only lazily on the GPU host, as guard.py is, import by plain name.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":  # the staged runner (not a module the lab loads by path)
    if HERE not in sys.path:  # started with -I: the staged siblings (guard.py, ...) by path
        sys.path.insert(0, HERE)
    # Bytecode beside the staged files is never trusted (a planted .pyc would run instead of
    # the hash-checked source): the harness imports its siblings from source, -B writes none.
    shutil.rmtree(os.path.join(HERE, "__pycache__"), ignore_errors=True)
if TYPE_CHECKING or __package__:  # the sibling import rule (above)
    from . import correctness, diagnostics, failures, scores, step_trace, timing
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import correctness
    import diagnostics
    import failures
    import scores
    import step_trace
    import timing

# The names the lab, the benchmarks and guard.py (handed this module) use from here.
Env = timing.Env
Phases = timing.Phases
compare, dtype_of = correctness.compare, correctness.dtype_of
deadline = failures.deadline  # the benchmarks time a call under it

SWEEP_WARMUP, SWEEP_REPEATS = 3, 10  # per case in sweeps (a score takes 10 and 30: time_case)
SWEEP_MIN_SAMPLES = 5  # a sweep ranks configs: 5 samples suffice where the median is stable
_OUT = sys.stdout  # replaced in main() by a dup of fd 1 before candidate code can print
# A warm worker's imported candidates by folder, module name (the folder's content hash) and entry
# file (one folder may hold several entries, as a task's solutions/ does; the same content in
# another folder is imported there, so tracebacks and failure reasons name that folder's
# files): an unchanged
# candidate is not imported again, so its Triton kernels stay loaded. A fresh import makes new
# JITFunction objects, each of which looks every specialization up in the disk cache and loads
# it onto the device again (eight on rmsnorm_gate's nine dev cases). A config's private copy
# (sweeps) is always imported afresh.
_IMPORTED: dict[tuple[str, str, str], types.ModuleType] = {}

# ----------------------------------------------------------------------------------------------
# plumbing


def emit(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj, default=_json_default) + "\n")
    _OUT.flush()


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def tree_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# evaluation


class Evaluator:
    def __init__(self, env: Env, req: dict[str, Any]) -> None:
        self.env = env
        self.req = req
        self.phases = Phases()
        self.torch = env.torch
        self.ref = load_module(
            Path(req["reference"]), f"_hl_reference_{tree_hash(Path(req['reference']).parent)}"
        )
        self.tolerances = req["tolerances"]
        self.seed = int(req.get("seed", 0))
        self.interpret = env.interpret
        self.case_timeout_s = float(req.get("case_timeout_s", 120))

    # -- candidate loading ---------------------------------------------------------------------
    def load_candidate(self, candidate_dir: str, config: dict[str, Any] | None = None):
        """Import the candidate's entry function (an unchanged candidate once a process:
        _IMPORTED). With `config`, a private copy of the folder gets that kernel_config.json,
        so sweeps never touch the workspace."""
        folder = Path(candidate_dir)
        if config is not None:
            tmp = Path(tempfile.mkdtemp(prefix="hl_variant_"))
            shutil.copytree(folder, tmp, dirs_exist_ok=True)
            (tmp / self.req["config_file"]).write_text(json.dumps(config))
            folder = tmp
        file_name, func_name = self.req["entry"].split(":", 1)
        path = folder / file_name
        if not path.is_file():
            raise FileNotFoundError(f"{file_name} not found in the candidate")
        name = f"_hl_candidate_{tree_hash(folder)}"
        key = (str(path.resolve()), name, file_name)
        mod = _IMPORTED.get(key) if config is None else None
        if mod is None:
            mod = load_module(path, name)
            if config is None:
                _IMPORTED[key] = mod
        modelnew = load_module(Path(HERE) / "modelnew.py", "_hl_modelnew")
        module = getattr(self.ref, "MODULE", None)  # a declared module task (KernelBench)
        fn = modelnew.resolve(mod, func_name, module)
        if not callable(fn):
            also = f" or class {modelnew.ENTRY_CLASS}" if module is not None else ""
            raise AttributeError(f"{file_name} defines no function {func_name}(){also}")
        if modelnew.is_module_class(fn):
            fn = modelnew.ModuleEntry(fn, module)
        return fn, str(folder)

    def case_shape(self, case: dict[str, Any]) -> dict[str, int]:
        shape = dict(case["shape"])
        if self.interpret and hasattr(self.ref, "interpreter_shape"):
            shape = self.ref.interpreter_shape(shape)
        return shape

    def make(self, shape, dtype, salt: int):
        # Inputs are drawn on the device (a CPU draw of a 4096x8192 case costs ~0.3 s a tensor).
        gen = self.torch.Generator(device=self.env.device)
        gen.manual_seed((self.seed * 1_000_003 + salt) % (2**63))
        return self.ref.make_inputs(shape, dtype, self.env.device, gen)

    # -- one case --------------------------------------------------------------------------------
    def run_case(self, fn, case: dict[str, Any], idx: int, cand_dir: str, *, timing: bool) -> dict:
        torch = self.torch
        shape = self.case_shape(case)
        dtype = dtype_of(torch, case["dtype"])
        tol = self.tolerances[case["dtype"]]
        res: dict[str, Any] = {
            "name": case["name"],
            "dtype": case["dtype"],
            "shape": shape,
            "rows": shape.get("rows"),
            "dim": shape.get("dim"),
            "passed": False,
            "status": "failed",
            "reason": "",
        }
        try:
            with failures.deadline(self.case_timeout_s):
                checks = int(self.req.get("checks", 1))
                for check in range(checks):
                    with self.phases("inputs", self.env.sync):
                        args, kwargs = self.make(shape, dtype, salt=idx * 101 + check)
                        expected = self.ref.reference(*args, **kwargs)
                        out_shape, out_dtype = self.ref.output_spec(*args, **kwargs)
                        saved = correctness.snapshot_inputs(torch, args)
                        correctness.poison_allocator(torch, self.env.device, expected.numel() * 2)
                    with self.phases("correctness"):
                        out = fn(*args, **kwargs)
                        self.env.sync()
                        ok, reason, stats = compare(
                            torch, out, expected, tol, out_shape, out_dtype, args
                        )
                        res.update(stats)
                        if ok and not correctness.inputs_unchanged(torch, args, saved):
                            ok, reason = False, "the candidate modified its inputs"
                    if not ok:
                        res["reason"] = reason
                        return res
                    del out, expected, saved
                if timing:
                    with self.phases("timing", self.env.sync):
                        res.update(self.time_case(fn, shape, dtype, idx))
        except Exception as exc:
            # The Triton interpreter re-raises what a kernel body raised, the deadline too, as
            # InterpreterError(repr(e)) from e.
            timed_out = failures.caused_by(exc, failures.CaseTimeout) is not None
            res.update(
                status="timeout" if timed_out else "error", reason=failures.one_line(exc, cand_dir)
            )
            return res
        res.update(passed=True, status="passed")
        return res

    def time_case(self, fn, shape, dtype, idx: int) -> dict[str, Any]:
        nbytes = int(self.ref.bytes_moved(shape, self.torch.finfo(dtype).bits // 8))
        samples = int(self.req.get("repeats", 30))  # the cap of adaptive sampling
        return timing.time_case(
            self.env,
            fn,
            lambda salt: self.make(shape, dtype, salt=idx * 101 + salt),
            nbytes,
            warmup=int(self.req.get("warmup", 10)),
            samples=samples,
            floor=max(1, min(int(self.req.get("min_samples", timing.MIN_SAMPLES)), samples)),
            phases=self.phases,
        )

    # -- modes ------------------------------------------------------------------------------------
    def evaluate(
        self, candidate_dir: str, config: dict[str, Any] | None = None, *, timing=True
    ) -> dict:
        started = time.perf_counter()
        cases = self.req["cases"]
        try:
            with self.phases("load"):
                fn, cand_dir = self.load_candidate(candidate_dir, config)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            reason = f"import failed: {failures.one_line(exc, str(candidate_dir))}"
            results = [{"name": c["name"], "dtype": c["dtype"], "shape": c["shape"],
                        "passed": False, "status": "error", "reason": reason} for c in cases]  # fmt: skip
            for r in results:
                emit({"event": "case", **r})
            return self._summary(results, started, error=reason)
        results = []
        for i, case in enumerate(cases):
            r = self.run_case(fn, case, i, cand_dir, timing=timing)
            emit({"event": "case", **r})
            results.append(r)
        return self._summary(results, started)

    def _summary(self, results, started, error: str = "") -> dict[str, Any]:
        passed = all(r["passed"] for r in results) and bool(results)
        score = scores.score_of([r.get("median_us") for r in results], passed)
        geo = scores.geomean([r.get("pct_of_copy_bw") for r in results]) if passed else None
        status = "passed" if passed else "failed"
        failed = [r for r in results if not r["passed"]]
        return {
            "status": status,
            "score_us": score,
            "geomean_pct_of_copy_bw": geo,
            "cases": results,
            "reason": error or (f"{failed[0]['name']}: {failed[0]['reason']}" if failed else ""),
            "wall_s": time.perf_counter() - started,
            "phases_s": dict(self.phases),
        }

    def step_traces(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """A step task's dev traces (step_trace.objective): the candidate's step(state, tokens)
        run over the task's [step] traces, every step checked against the reference. With
        `config`, a private copy of the candidate gets that launch config (a sweep)."""
        started = time.perf_counter()
        try:
            with self.phases("load"):
                fn, cand_dir = self.load_candidate(self.req["candidate_dir"], config)
        except Exception as exc:
            reason = f"import failed: {failures.one_line(exc, str(self.req['candidate_dir']))}"
            rows = [{"name": t["name"], "dtype": t["dtype"], "passed": False, "status": "error",
                     "reason": reason} for t in self.req["step"]["traces"]]  # fmt: skip
            for r in rows:
                emit({"event": "case", **r})
            result: dict[str, Any] = {"status": "failed", "score_us": None, "cases": rows,
                                      "reason": reason}  # fmt: skip
        else:
            with self.phases("traces"):
                result = step_trace.objective(
                    self.torch, self.ref, fn, self.req, interpret=self.interpret,
                    device=self.env.device, emit=emit, candidate_dir=cand_dir,
                )  # fmt: skip
        return {**result, "wall_s": time.perf_counter() - started, "phases_s": dict(self.phases)}

    def sweep(self) -> dict[str, Any]:
        """Evaluate every config in req['configs']; one bad config never fails the sweep.
        Ranking needs fewer samples than a score: unless the request says otherwise, each
        case takes SWEEP_MIN_SAMPLES to SWEEP_REPEATS samples (adaptive) after SWEEP_WARMUP
        calls. A step task's config is scored by the step objective over its dev traces."""
        self.req.setdefault("warmup", SWEEP_WARMUP)
        self.req.setdefault("repeats", SWEEP_REPEATS)
        self.req.setdefault("min_samples", SWEEP_MIN_SAMPLES)
        out = []
        compile_only = bool(self.req.get("compile_only"))
        for i, config in enumerate(self.req["configs"]):
            t0 = time.perf_counter()
            if "step" in self.req:
                res = self.step_traces(config)
            else:
                res = self.evaluate(self.req["candidate_dir"], config, timing=not compile_only)
            entry = {
                "config": config,
                "status": res["status"],
                "score_us": res["score_us"],
                "reason": res["reason"],
                "cases": res["cases"],
                "wall_s": time.perf_counter() - t0,
            }
            emit(
                {
                    "event": "config",
                    "index": i,
                    **{k: entry[k] for k in ("config", "status", "score_us", "reason")},
                }
            )
            out.append(entry)
        return {"status": "passed", "configs": out}


def check_harness(expected: dict[str, str]) -> None:
    """The staged files this process may import are the ones the host's package holds (a
    file changed on the GPU host after staging is never imported)."""
    for name, digest in expected.items():
        path = os.path.join(HERE, os.path.basename(name))
        try:
            with open(path, "rb") as fh:
                actual = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            actual = ""
        if actual != digest:
            raise RuntimeError(
                f"staged harness file {os.path.basename(name)} does not match "
                "the installed package; the host re-stages it on the next call"
            )


def prespawn(req: dict[str, Any]) -> None:
    """The guarded verify's early start (guard_spawn.prespawn), after the staged files are
    checked."""
    if isinstance(req.get("harness_sha256"), dict):
        check_harness(req["harness_sha256"])
    import guard_spawn

    guard_spawn.prespawn(req)


def _verify(env: Env, req: dict[str, Any], ev: Evaluator) -> dict[str, Any]:
    """The guarded verify: the candidate runs in a child process (guard.py)."""
    import guard

    return guard.verify(env, req, sys.modules[__name__])


def _step_verify(env: Env, req: dict[str, Any], ev: Evaluator) -> dict[str, Any]:
    """A step task's guarded verify (step_guard.py)."""
    import step_guard

    return step_guard.verify(env, req, sys.modules[__name__])


# The modes other than health: what each runs (a step task's dev traces are mode "step").
MODES = {
    "evaluate": lambda env, req, ev: ev.evaluate(req["candidate_dir"], req.get("config")),
    "step": lambda env, req, ev: ev.step_traces(),
    "sweep": lambda env, req, ev: ev.sweep(),
    "probe": lambda env, req, ev: diagnostics.probe(ev, emit),
    "profile_target": lambda env, req, ev: diagnostics.profile_target(ev),
    "step_profile": lambda env, req, ev: diagnostics.profile_step(ev),
    "verify": _verify,
    "step_verify": _step_verify,
}


def dispatch(env: Env, req: dict[str, Any], ev: Evaluator, mode: str) -> dict[str, Any]:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    return MODES[mode](env, req, ev)


def handle(env: Env, req: dict[str, Any]) -> dict[str, Any]:
    mode = req.get("mode", "evaluate")
    t0 = time.perf_counter()
    if isinstance(req.get("harness_sha256"), dict):
        check_harness(req["harness_sha256"])
    if mode == "health":
        result: dict[str, Any] = {"status": "passed"}
        if req.get("measure_copy", True):
            result["copy_gbps"] = env.copy_gbps()
    else:
        cache = req.get("triton_cache")
        if mode not in ("verify", "step_verify") and isinstance(cache, str) and cache:
            # The candidate's dev cache (the launcher grants it): compile workers fill it, the
            # timing worker reads it. Triton reads the variable at each compile.
            os.makedirs(cache, exist_ok=True)
            os.environ["TRITON_CACHE_DIR"] = cache
        ev = Evaluator(env, req)
        try:
            result = dispatch(env, req, ev, mode)
        finally:
            # Cached blocks stay between the cases of a request (a case's inputs reuse the last
            # one's: no cudaMalloc/cudaFree per case, ~12 ms over rmsnorm_gate's nine dev
            # cases) and go back to the device once it ends, for the processes beside this one.
            if env.device == "cuda":
                with ev.phases("release"):  # its own phase: what holding the blocks would save
                    env.torch.cuda.empty_cache()
        if mode in ("evaluate", "sweep"):
            with ev.phases("copy_bandwidth"):  # measured once per process (cached after)
                result["copy_gbps"] = env.copy_gbps() if not req.get("compile_only") else None
            result["phases_s"] = dict(ev.phases)
    result.update(mode=mode, env=env.info(), seed=req.get("seed"), request_id=req.get("request_id"))
    result["runner_wall_s"] = time.perf_counter() - t0
    return result


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    global _OUT
    argv = list(sys.argv[1:] if argv is None else argv)
    # Keep the protocol stream private: candidate prints go to stderr.
    _OUT = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = "--worker" in argv
    env: Env | None = None

    def get_env(req: dict[str, Any]) -> Env:
        nonlocal env
        if env is None:
            env = Env(timing.wants_interpreter(req, cuda_available))
        return env

    if not worker:
        paths = [a for a in argv if not a.startswith("--")]
        if not paths:
            sys.stderr.write("usage: runner.py REQUEST.json | --worker\n")
            return 2
        req = json.loads(Path(paths[0]).read_text()) if paths[0] != "-" else json.load(sys.stdin)
        try:
            if req.get("mode") == "verify":  # its sandboxed processes start before torch loads
                prespawn(req)
            emit({"event": "result", **handle(get_env(req), req)})
        except Exception as exc:
            emit(
                {
                    "event": "result",
                    "status": "error",
                    "reason": failures.one_line(exc),
                    "mode": req.get("mode"),
                }
            )
            traceback.print_exc()
            return 1
        return 0
    idle_s = float(os.environ.get("HARNESSLAB_WORKER_IDLE_S", "0")) or None
    emit({"event": "ready", "pid": os.getpid()})
    import select  # noqa: PLC0415

    while True:
        # Exit when idle so a forgotten worker does not hold GPU memory forever.
        ready, _, _ = select.select([sys.stdin], [], [], idle_s)
        if not ready:
            return 0
        line = sys.stdin.readline()
        if not line:
            return 0
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            emit({"event": "result", **handle(get_env(req), req)})
        except Exception as exc:
            emit({"event": "result", "status": "error", "reason": failures.one_line(exc)})
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())

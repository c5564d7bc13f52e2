"""The runner's modes that report on a candidate without scoring it: `probe` (numerical edge
cases: the task's reference.PROBES and numerics.py's generic suite; a step task's are
step_probe.py's), `profile_target` (one case between cudaProfilerStart/Stop, ncu's target) and
`step_profile` (a step task's per-kernel breakdown, step_profile.py). Each takes the runner's
Evaluator (its request, reference, device and candidate loader); the runner's MODES name them.

Staged (tools/gpu STAGED and LAB; standard library at import, torch the Evaluator's). Side of
the trust boundary: it runs in the runner's sandboxed process with the candidate, so what it
reports is dev feedback, never a verdict. Siblings by the one rule in runner.py's docstring.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import correctness, failures, step_probe, step_profile
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import correctness
    import failures
    import step_probe
    import step_profile
if TYPE_CHECKING:
    from .runner import Evaluator


def probe(ev: Evaluator, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Numerical edge cases against the candidate: the task's reference.PROBES (fixed
    shapes), then the generic suite (numerics.py: size edges and value families) at the
    first dev case of each dtype. A task probe of the same name as a suite edge wins. A step
    task's probes are traces at its decode step's edges (step_probe.py). One "probe" event
    per probe and dtype."""
    if "step" in ev.req:
        fn, cand_dir = ev.load_candidate(ev.req["candidate_dir"])
        return step_probe.run(ev.torch, ev.ref, fn, ev.req, interpret=ev.interpret,
                              device=ev.env.device, emit=emit, candidate_dir=cand_dir)  # fmt: skip
    import numerics  # noqa: PLC0415 - staged sibling (the host imports this module too)

    torch = ev.torch
    fn, cand_dir = ev.load_candidate(ev.req["candidate_dir"])
    probes = getattr(ev.ref, "PROBES", {})
    notes = {**numerics.NOTES, **getattr(ev.ref, "PROBE_NOTES", {})}
    suite = numerics.Suite(torch, ev.ref, ev.env.device, ev.req.get("numerics"),
                           interpret=ev.interpret,
                           scale=lambda s: ev.case_shape({"shape": s}))  # fmt: skip
    wanted = ev.req.get("probes") or [*probes, *(n for n in suite.names() if n not in probes)]
    cases = ev.req.get("cases") or [{"dtype": None, "shape": {}}]
    results = []
    for name in wanted:
        for dname in ev.req.get("dtypes") or list(ev.tolerances):
            dtype, tol = correctness.dtype_of(torch, dname), ev.tolerances[dname]
            seed = ev.seed + zlib.crc32(name.encode()) % 10_000  # hash() is salted
            r: dict[str, Any] = {"probe": name, "dtype": dname, "note": notes.get(name, "")}
            try:
                with failures.deadline(ev.case_timeout_s):
                    if name in probes:
                        gen = torch.Generator().manual_seed(seed)
                        args, kwargs = probes[name](dtype, ev.env.device, gen)
                        expected = ev.ref.reference(*args, **kwargs)
                    else:
                        case = next((c for c in cases if c["dtype"] == dname), cases[0])
                        gen = torch.Generator(device=ev.env.device).manual_seed(seed)
                        edge = suite.edge(name, ev.case_shape(case), dtype, gen, tol)
                        r.update(edge.describe())
                        args, kwargs, expected = edge.args, edge.kwargs, edge.expected
                    if expected is not None:
                        oshape, odtype = ev.ref.output_spec(*args, **kwargs)
                        out = fn(*args, **kwargs)
                        ev.env.sync()
                        ok, why, stats = correctness.compare(
                            torch, out, expected, tol, oshape, odtype, args
                        )
                        ratio = numerics.tolerance_ratio(torch, out, expected, tol)
                        r.update(stats, passed=ok, reason=why, shape=list(args[0].shape),
                                 tolerance_ratio=correctness.finite_or_none(ratio))  # fmt: skip
                    else:  # the reference cannot take this family here: nothing to judge
                        r.update(passed=True, reason=f"not applicable: {edge.why}")
            except Exception as exc:
                r.update(passed=False, reason=failures.one_line(exc, cand_dir))
            emit({"event": "probe", **r})
            results.append(r)
    return {
        "status": "passed" if all(r["passed"] for r in results) else "failed",
        "probes": results,
    }


def profile_target(ev: Evaluator) -> dict[str, Any]:
    """One case, `repeats` calls between cudaProfilerStart/Stop and nothing timed: the
    target of `ncu --profile-from-start off`. Warm-up calls (compile, autotune) run before
    the window, so the profiler sees only the candidate's steady-state launches."""
    torch = ev.torch
    fn, _ = ev.load_candidate(ev.req["candidate_dir"])
    case = ev.req["cases"][0]
    shape = ev.case_shape(case)
    args, kwargs = ev.make(shape, correctness.dtype_of(torch, case["dtype"]), salt=7)
    for _ in range(int(ev.req.get("warmup", 2))):
        fn(*args, **kwargs)
    ev.env.sync()
    repeats = int(ev.req.get("repeats", 3))
    profiled = ev.env.device == "cuda"
    if profiled:
        torch.cuda.profiler.start()
    for _ in range(repeats):
        fn(*args, **kwargs)
    ev.env.sync()
    if profiled:
        torch.cuda.profiler.stop()
    elem = torch.finfo(correctness.dtype_of(torch, case["dtype"])).bits // 8
    return {
        "status": "passed",
        "case": case["name"],
        "shape": shape,
        "calls": repeats,
        "bytes": int(ev.ref.bytes_moved(shape, elem)),
        "profiled": profiled,
    }


def profile_step(ev: Evaluator) -> dict[str, Any]:
    """A step task's per-kernel breakdown (step_profile.py)."""
    fn, cand_dir = ev.load_candidate(ev.req["candidate_dir"])
    return step_profile.profile(ev.torch, ev.ref, fn, ev.req, interpret=ev.interpret,
                                device=ev.env.device, candidate_dir=cand_dir)  # fmt: skip

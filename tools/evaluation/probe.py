"""numerical_probe's library half: the candidate against the reference on numerical edge cases,
through the runner's probe mode: the task's own (reference.PROBES: huge and tiny magnitudes,
zero rows, saturating gates, odd shapes, at fixed shapes) and the generic suite every kernel task
gets (tools/gpu/numerics.py: odd dims, a single row, an empty batch, a long reduction; offsets,
per-column and per-row scales, outliers, near-overflow, subnormals, signed zeros, ties), at a dev
case's shape per dtype: the same families the guarded verify runs on the hidden cases. Each
failing probe comes back with its numbers and a note on why it matters. A step task's probes are
decode-step traces at its edges (tools/gpu/step_probe.py: long and ragged contexts, large
embeddings and values), every step's logits checked, in the same request and result shape.

Probe names are read from reference.py's source (its PROBES dict) without importing it, so
validating a request costs no torch import in the server.
"""

from __future__ import annotations

import ast
import functools
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution import Launcher
from ..gpu.numerics import NAMES as SUITE_NAMES
from ..gpu.step_probe import NAMES as STEP_PROBES
from ..progress import Progress
from ..state import Workspace
from ..task import TaskSpec, kind_of
from .progress import case_events_progress
from .request import kernel_request


class ProbeResult(BaseModel):
    probe: str
    dtype: str
    passed: bool
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_index: list[int] | None = Field(default=None, description="[row, col] of the worst error")
    nan: int | None = Field(default=None, description="NaN values in the output")
    inf: int | None = Field(default=None, description="Inf values in the output")
    shape: list[int] | None = None
    tolerance_ratio: float | None = Field(
        default=None, description="worst |err| / (atol + rtol*|ref|): how many tolerances off"
    )
    family: str | None = Field(
        default=None, description="the generic edge or value family this probe ran"
    )
    context: int | None = Field(
        default=None, description="a step task's probe: the longest context a step attended"
    )
    inputs: list[int] | None = Field(
        default=None, description="positions of the inputs the family transformed"
    )
    level: float | None = Field(
        default=None, description="the family's strength (1: the dtype's full range)"
    )
    not_applicable: str | None = Field(
        default=None, description="why the family did not run here (it counts as passed)"
    )
    why_it_matters: str = ""


class ProbeReport(BaseModel):
    status: Literal["passed", "failed", "error"]
    passed: int
    failed: int
    failing: list[str] = Field(description="'probe/dtype' of every failure")
    results: list[ProbeResult]
    candidate: str
    reason: str = ""
    meaningful_timing: bool = Field(default=False, description="probes never time anything")


def probe_names(task: TaskSpec) -> list[str]:
    """The probes numerical_probe takes for `task` (PROBES_BY_KIND)."""
    return PROBES_BY_KIND[kind_of(task).name](task)


def _kernel_probes(task: TaskSpec) -> list[str]:
    """The task's own probes (the names in reference.py's PROBES dict literal, in order; a
    declared task has none), then the generic suite's edges and families the task does not
    skip ([numerics] in task.toml) and does not name itself."""
    own: list[str] = []
    if task.declare is None:
        try:
            st = task.reference_path.stat()
        except OSError:
            return []
        own = list(_probe_names(str(task.reference_path), st.st_mtime_ns, st.st_size))
    skip = set(task.numerics.skip) | set(own)
    return [*own, *(n for n in SUITE_NAMES if n not in skip)]


def _step_probes(task: TaskSpec) -> list[str]:
    """A step task's: the decode-step probes (tools/gpu/step_probe.py)."""
    return list(STEP_PROBES)


def _no_probes(task: TaskSpec) -> list[str]:
    return []  # a command task's candidate is no kernel the runner imports


# numerical_probe's probe names per task kind (tools/task/kinds.py KINDS).
PROBES_BY_KIND = {"kernel": _kernel_probes, "command": _no_probes, "step": _step_probes}


@functools.lru_cache(maxsize=32)
def _probe_names(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    # Parsing reference.py costs ~2 ms: most of inspect_context's budget, so once per version.
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id == "PROBES" and isinstance(value, ast.Dict):
            return tuple(
                k.value
                for k in value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return ()


def check_probe_request(
    task: TaskSpec, probes: list[str] | None, dtypes: list[str] | None
) -> tuple[list[str], list[str]]:
    known = probe_names(task)
    if not known:
        raise UsageError(
            f"task {task.name} declares no numerical probes (reference.PROBES).",
            next_step="use run_objective and guarded_final_verify instead",
        )
    for p in probes or []:
        if p not in known:
            raise UsageError(
                f"probes: unknown probe {p!r}.", next_step=f"use some of: {', '.join(known)}"
            )
    for d in dtypes or []:
        if d not in task.tolerances:
            raise UsageError(
                f"dtypes: {d!r} is not a dtype of this task.",
                next_step=f"use some of: {', '.join(task.tolerances)}",
            )
    return list(probes or known), list(dtypes or task.tolerances)


async def numerical_probe(
    ws: Workspace,
    launcher: Launcher,
    *,
    probes: list[str] | None = None,
    dtypes: list[str] | None = None,
    progress: Progress | None = None,
) -> ProbeReport:
    kind_of(ws.task).require_runner(ws.task, "numerical_probe")
    wanted, wanted_dtypes = check_probe_request(ws.task, probes, dtypes)
    candidate = ws.snapshot()
    # The generic edges run at a dev case's shape per dtype; a step task's at its [step] sizes.
    at = kind_of(ws.task).runner_cases(ws.task, None)
    request = kernel_request(
        ws,
        launcher,
        candidate,
        "probe",
        seed=secrets.randbelow(2**31),
        probes=wanted,
        dtypes=wanted_dtypes,
        **at,
    )
    total = len(wanted) * len(wanted_dtypes)
    call = await launcher.call(
        request, task=ws.task, on_event=case_events_progress(total, progress, unit="probe")
    )
    if (fault := call.fault()) is not None:  # killed from outside: the host's, not the probes'
        raise fault
    rows = (call.result or {}).get("probes")
    if rows is None:  # import failure or a killed runner: salvage the streamed probes
        rows = [ev for ev in call.events if ev.get("event") == "probe"]
        reason = (call.result or {}).get("reason") or call.failure()
    else:
        reason = ""
    results = [_probe_result(r) for r in rows]
    failing = [f"{r.probe}/{r.dtype}" for r in results if not r.passed]
    status: Literal["passed", "failed", "error"] = "failed" if failing else "passed"
    if reason or len(results) < total:
        status = "error" if not failing else "failed"
        reason = reason or f"only {len(results)} of {total} probes ran"
    return ProbeReport(
        status=status,
        passed=sum(r.passed for r in results),
        failed=len(failing),
        failing=failing,
        results=results,
        candidate=candidate.digest,
        reason=reason,
    )


def _probe_result(r: dict[str, Any]) -> ProbeResult:
    return ProbeResult(
        probe=str(r.get("probe")),
        dtype=str(r.get("dtype")),
        passed=bool(r.get("passed")),
        reason=str(r.get("reason") or ""),
        max_abs_err=r.get("max_abs_err"),
        max_rel_err=r.get("max_rel_err"),
        worst_index=r.get("worst_index"),
        nan=r.get("nan"),
        inf=r.get("inf"),
        shape=r.get("shape"),
        tolerance_ratio=r.get("tolerance_ratio"),
        family=r.get("family"),
        context=r.get("context"),
        inputs=r.get("inputs"),
        level=r.get("level"),
        not_applicable=r.get("not_applicable"),
        why_it_matters=str(r.get("note") or "") if not r.get("passed") else "",
    )


__all__ = ["ProbeReport", "ProbeResult", "check_probe_request", "numerical_probe", "probe_names"]

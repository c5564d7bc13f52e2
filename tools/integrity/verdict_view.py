"""What of a guarded final verification an agent may see: nothing a hidden case decides and
nothing the candidate's run chooses.

A candidate sees each hidden case's inputs while it runs, and anything the verdict repeats of
that run is a way to send them out of the sandbox: an error value it writes where the reference
is 0, which case or which check it fails on, how many of its calls are wrong, a time. So a
public verdict holds:
- the verdict and ONE reason: the first reason's code with the harness's fixed sentence for it
  (reasons.REASONS), never its detail (which case, which check, which input, any figure). A
  candidate that never ran (the static scan or the host refused it) gets every reason in full:
  they come from its source alone;
- per hidden case its public name (`final<i>_<dtype>`, fixed by the case set) and the verdict:
  every case passed, or none is shown as passed (which one failed is not said);
- the aggregate score and copy-bandwidth share of a passed verdict, the case set, what the
  verdict certifies, the sandbox, and evidence that no candidate run decides (hashes, versions,
  the device, the static scan's counts).
Per-case times, bytes, bandwidths and errors, the reasons' details, check counts, the
incumbent's per-case rows and wall times are withheld. docs/architecture.md lists each public
field and why it is safe.

Side of the trust boundary: the outbound gate for hidden cases. The CLI shows the full verdict
only under the operator's `--reveal-cases`; the MCP tool, the loop and the ledger use this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..evaluation import CaseResult, EvalResult
from .reasons import REASONS, SANDBOX_REFUSED

if TYPE_CHECKING:
    from .command_verify import CommandVerdict
    from .verdict import Verdict

WITHHELD = (
    "not shown: a verify that did not pass does not say which hidden case failed (the "
    "candidate could choose it); the verdict's reason says why it failed"
)
# Details a public reason may keep: the host's own text, the same on every run.
HOST_TEXT = {"sandbox_unavailable": SANDBOX_REFUSED}
# Evidence an agent may read: set before the candidate runs, or by the sandbox and the host.
PUBLIC_EVIDENCE = frozenset(
    {
        "candidate",
        "case_set_generation",
        "checks_per_case",
        "harness_sha256",
        "scan",
        "device",
        "driver",
        "clocks",
        "copy_gbps",
        "versions",
        "sandbox",
    }
)
PUBLIC_INCUMBENT = frozenset({"hash", "speedup", "faster", "meaningful"})
# A command verdict's evidence kept from an agent: values the objective's run chose.
COMMAND_WITHHELD = frozenset({"exit_code", "error_fields"})


def public_reasons(reasons: list[dict[str, str]], ran: bool) -> list[dict[str, str]]:
    """The reasons an agent may read: all of them, as they are, when the candidate never ran
    (static findings); else the first one's code with the harness's fixed sentence."""
    if not ran:
        return [dict(r) for r in reasons]
    if not reasons:
        return []
    code = str(reasons[0].get("code"))
    detail = HOST_TEXT.get(code) or REASONS.get(code) or "the verify did not pass"
    return [{"code": code, "detail": detail}]


def public_rows(rows: list[CaseResult], verdict: str) -> list[CaseResult]:
    """One row per hidden case, the same for every case: passed when the verdict passed."""
    passed = verdict == "passed"
    status: Literal["passed", "failed", "error"] = (
        "passed" if passed else ("error" if verdict == "error" else "failed")
    )
    return [
        CaseResult(
            name=r.name,
            dtype=r.dtype,
            passed=passed,
            status=status,
            reason="" if passed else WITHHELD,
        )
        for r in rows
    ]


def public_result(verdict: Verdict) -> EvalResult:
    """The verdict's EvalResult as an agent may read it: public rows and reason, no wall time,
    no seed."""
    shown = public_reasons(verdict.reasons, verdict.ran_on_hidden_cases)
    return verdict.result.model_copy(
        update={
            "cases": public_rows(verdict.result.cases, verdict.verdict),
            "reason": shown[0]["detail"] if shown else "",
            "wall_s": 0.0,
            "phases_s": {},
            "seed": None,
        }
    )


def public_verdict(verdict: Verdict) -> dict[str, Any]:
    """The verdict as JSON an agent may read (`harnesslab verify --json`, the MCP tool)."""
    passed = verdict.verdict == "passed"
    data = verdict.model_dump(mode="json")
    data["reasons"] = public_reasons(verdict.reasons, verdict.ran_on_hidden_cases)
    data["result"] = public_result(verdict).model_dump(mode="json")
    for key in ("wall_s", "phases_s", "seed"):
        data["result"].pop(key, None)
    data["evidence"] = {k: v for k, v in data["evidence"].items() if k in PUBLIC_EVIDENCE}
    inc = data.get("incumbent")
    # A rejected candidate's times (and the incumbent's fate on the cases it reached) are its
    # choice: the comparison is shown only beside a passed verdict's own score.
    data["incumbent"] = (
        {k: v for k, v in inc.items() if k in PUBLIC_INCUMBENT} if inc and passed else None
    )
    return data


def public_command_verdict(verdict: CommandVerdict) -> dict[str, Any]:
    """A command task's verdict as an agent may read it: its reasons are the harness's fixed
    sentences already (command_run.verdict_reason); the run's wall time, exit status and which
    error fields it set are withheld (the objective chose them, fed the hidden cases)."""
    data = verdict.model_dump(mode="json", exclude={"wall_s"})
    data["evidence"] = {k: v for k, v in data["evidence"].items() if k not in COMMAND_WITHHELD}
    return data


__all__ = [
    "PUBLIC_EVIDENCE",
    "WITHHELD",
    "public_command_verdict",
    "public_reasons",
    "public_result",
    "public_rows",
    "public_verdict",
]

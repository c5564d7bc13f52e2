"""What of a guarded final verification an agent may see: the verdict, its reasons, the aggregate
score and shape-independent figures; per hidden case only whether it passed and its numerical
error. Everything that gives a case's shape is withheld: the shapes themselves, and per-case
times, bytes and bandwidths (bytes / GB/s x median is a case's byte count, hence its shape; a
median next to the kernel's known share of copy bandwidth estimates it).

Side of the trust boundary: the outbound gate for hidden cases. The CLI shows the full verdict
only under the operator's `--reveal-cases`; the MCP tool never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..evaluation.results import CaseResult, EvalResult

if TYPE_CHECKING:
    from .verify import Verdict

# CaseResult fields an agent may see for a hidden case.
PUBLIC_CASE_FIELDS = frozenset(
    {"name", "dtype", "passed", "status", "reason", "max_abs_err", "max_rel_err"}
)


def public_case(case: CaseResult) -> CaseResult:
    return CaseResult.model_validate(
        {k: v for k, v in case.model_dump().items() if k in PUBLIC_CASE_FIELDS}
    )


def public_result(result: EvalResult) -> EvalResult:
    """`result` with its per-case rows reduced to the public fields."""
    return result.model_copy(update={"cases": [public_case(c) for c in result.cases]})


def public_verdict(verdict: Verdict) -> dict[str, Any]:
    """The verdict as JSON an agent may read."""
    data = verdict.model_dump(mode="json")
    data["result"] = public_result(verdict.result).model_dump(mode="json")
    data["evidence"] = {k: v for k, v in data.get("evidence", {}).items() if k != "cases"}
    if data.get("incumbent"):
        data["incumbent"] = {k: v for k, v in data["incumbent"].items() if k != "cases"}
    return data


__all__ = ["PUBLIC_CASE_FIELDS", "public_case", "public_result", "public_verdict"]

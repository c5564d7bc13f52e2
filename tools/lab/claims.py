"""The claims ledger of a lab run: every target of every task, judged case by case.

A claim is the target applied to the task's best harnesslab strategy on one case ("sol:fast
reaches 96% of copy bandwidth on 4096x8192_fp16 (target >= 90%)"). Its status:
- supported: correct, the target met, >= MIN_REPEATS measurements with spread < MAX_SPREAD, and
  a matching Nsight Compute counter (ncu's kernel time within NCU_TIME_TOL of the runner's
  median; for bandwidth claims also DRAM busy >= NCU_DRAM_MIN_PCT, so the bytes came from DRAM).
- caveated: the target met, but part of that evidence is missing or disagrees (said which).
- rejected: the output was wrong, or the measurement misses the target.
- pending: nothing meaningful was measured (interpreter run, skipped row, a comparator that is
  missing, failed correctness or was not measured: said which).
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import BaseModel, Field

MIN_REPEATS = 3
MAX_SPREAD = 0.05
NCU_TIME_TOL = 0.10
NCU_DRAM_MIN_PCT = 60.0
TIME = "gpu__time_duration.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_BPS = "dram__bytes.sum.per_second"
_TIME_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
_BPS_SCALE = {"byte/s": 1e-9, "byte/second": 1e-9, "Gbyte/s": 1.0, "Gbyte/second": 1.0,
              "Tbyte/s": 1e3, "Tbyte/second": 1e3, "Mbyte/s": 1e-3, "Mbyte/second": 1e-3}  # fmt: skip
Status = Literal["supported", "caveated", "rejected", "pending"]


class Claim(BaseModel):
    task: str
    target: str = Field(description="the target in words, e.g. '>= 90% of copy bandwidth'")
    strategy: str
    case: str
    statement: str
    status: Status
    reason: str = ""
    value: float | None = Field(default=None, description="% of copy, or the time ratio")
    threshold: float | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


def ncu_case(results: dict[str, Any], task: str, strategy: str, case: str) -> dict[str, Any]:
    """ncu's per-case medians (time in us, DRAM %, DRAM GB/s, ...) or {} when not profiled."""
    rec = results.get("ncu", {}).get(task) or {}
    raw = (rec.get("by_case") or {}).get(case)
    if rec.get("strategy") != strategy or not raw:
        return {}
    out: dict[str, Any] = {"kernel": raw.get("kernel", "")}
    for name, m in raw.items():
        if not isinstance(m, dict) or m.get("value") is None:
            continue
        v, unit = float(m["value"]), m.get("unit", "")
        if name == TIME:
            out["time_us"] = v * _TIME_SCALE.get(unit, 1e-3)
        elif name == DRAM_BPS:
            out["dram_gbps"] = v * _BPS_SCALE.get(unit, 1e-9)
        elif name == DRAM_PCT:
            out["dram_pct"] = v
        elif "warps_active" in name:
            out["warps_active_pct"] = v
        elif "tensor" in name and "tensor_pct" not in out:
            out["tensor_pct"] = v
            out["tensor_metric"] = name
        elif name.startswith("sm__throughput"):
            out["sm_pct"] = v
    return out


def row_of(results: dict[str, Any], task: str, strategy: str, case: str) -> dict[str, Any] | None:
    return next((r for r in results["rows"] if (r["task"], r["strategy"], r["case"]) ==
                 (task, strategy, case)), None)  # fmt: skip


def time_of(row: dict[str, Any]) -> float | None:
    medians = [m for m in row.get("repeat_medians_us") or [] if m]
    return statistics.median(medians) if medians else row.get("median_us")


def _repeat_gaps(row: dict[str, Any], who: str) -> list[str]:
    n = len([m for m in row.get("repeat_medians_us") or [] if m])
    spread = row.get("repeat_spread")
    gaps = []
    if n < MIN_REPEATS:
        gaps.append(f"{who}: {n} measurement(s), {MIN_REPEATS} needed")
    elif spread is None or spread >= MAX_SPREAD:
        gaps.append(f"{who}: spread {100 * (spread or 0):.1f}% over {n} measurements (>= 5%)")
    return gaps


def comparator_gap(name: str, row: dict[str, Any] | None) -> str:
    """Why a comparator gives no time, in its row's words: not in the matrix, missing (a peer
    whose package is not importable), failed correctness, or another status."""
    if row is None:
        return f"comparator {name} not measured (not in the matrix)"
    status, why = row.get("status") or "failed", row.get("reason") or ""
    if status == "missing":
        return f"comparator {name} missing: {why}"
    if status == "failed":
        return f"comparator {name} failed correctness: {why}"
    return f"comparator {name} not measured ({status}{': ' + why if why else ''})"


def _describe(target: dict[str, Any]) -> str:
    if target["kind"] == "pct_of_copy":
        return f">= {target['min']:g}% of copy bandwidth"
    return f">= {target['min']:g}x the speed of {target['vs']}"


def judge(results: dict[str, Any], task: str, strategy: str, target: dict[str, Any],
          case: str, meaningful: bool) -> Claim:  # fmt: skip
    base = {"task": task, "target": _describe(target), "strategy": strategy, "case": case,
            "threshold": target["min"]}  # fmt: skip
    row = row_of(results, task, strategy, case)
    kind = target["kind"]
    words = "of copy bandwidth" if kind == "pct_of_copy" else f"the speed of {target.get('vs')}"
    if row is None or row.get("status") == "skipped":
        why = "not in the matrix" if row is None else row.get("reason") or "skipped"
        return Claim(**base, statement=f"{strategy} on {case}: {_describe(target)}",
                     status="pending", reason=f"not measured ({why})")  # fmt: skip
    if not row["passed"]:
        return Claim(**base, statement=f"{strategy} is correct on {case}", status="rejected",
                     reason=f"correctness failed: {row.get('reason') or row.get('status')}")  # fmt: skip
    if not meaningful:
        return Claim(**base, statement=f"{strategy} on {case}: {_describe(target)}",
                     status="pending", reason="interpreter run: timings are not meaningful")  # fmt: skip
    evidence: dict[str, Any] = {"median_us": time_of(row), "repeats": row.get("repeat_medians_us"),
                                "repeat_spread": row.get("repeat_spread")}  # fmt: skip
    gaps = _repeat_gaps(row, strategy)
    if kind == "pct_of_copy":
        value = row.get("pct_of_copy_bw")
        evidence["gbps"] = row.get("gbps")
    else:
        other = row_of(results, task, target["vs"], case)
        if other is None or not other.get("passed") or not time_of(other):
            return Claim(**base, statement=f"{strategy} on {case}: {_describe(target)}",
                         status="pending", reason=comparator_gap(target["vs"], other))  # fmt: skip
        value = time_of(other) / time_of(row)  # type: ignore[operator]
        evidence["vs_median_us"] = time_of(other)
        gaps += _repeat_gaps(other, target["vs"])
    if value is None:
        return Claim(**base, statement=f"{strategy} on {case}", status="pending",
                     reason="no timing in the row")  # fmt: skip
    unit = "%" if kind == "pct_of_copy" else "x"
    statement = f"{strategy} reaches {value:.3g}{unit} {words} on {case}"
    ncu = ncu_case(results, task, strategy, case)
    evidence["ncu"] = ncu
    if not ncu and row.get("timing_method") == "step_trace":
        gaps.append("no ncu profile: the lab does not profile a step task (many kernels a step)")
    elif not ncu:
        gaps.append("no ncu profile of this case")
    else:
        runner_us = evidence["median_us"] or 0.0
        off = abs(ncu.get("time_us", 0.0) - runner_us) / runner_us if runner_us else 1.0
        if off > NCU_TIME_TOL:
            gaps.append(f"ncu time {ncu.get('time_us', 0):.1f} us vs runner {runner_us:.1f} us "
                        f"({100 * off:.0f}% apart, > {100 * NCU_TIME_TOL:.0f}%)")  # fmt: skip
        if kind == "pct_of_copy" and (ncu.get("dram_pct") or 0.0) < NCU_DRAM_MIN_PCT:
            gaps.append(
                f"ncu DRAM busy {ncu.get('dram_pct') or 0:.0f}% (< {NCU_DRAM_MIN_PCT:.0f}%)"
            )
    met = value >= target["min"]
    if not met:
        status: Status = "rejected"
        reason = f"measured {value:.3g}{unit}, target >= {target['min']:g}{unit}"
        if gaps:
            reason += "; also: " + "; ".join(gaps)
    else:
        status = "caveated" if gaps else "supported"
        reason = "; ".join(gaps)
    return Claim(**base, statement=statement, status=status, reason=reason, value=value,
                 evidence=evidence)  # fmt: skip


def claims_ledger(results: dict[str, Any]) -> list[Claim]:
    meaningful = bool(results.get("info", {}).get("meaningful"))
    claims: list[Claim] = []
    for task, summary in results.get("tasks", {}).items():
        strategy = summary.get("best_strategy") or next(
            (s for s in summary.get("strategies", []) if s.startswith("sol:")), "baseline"
        )
        for target in summary.get("targets", []):
            if not target.get("cases"):
                claims.append(Claim(task=task, target=_describe(target), strategy=strategy,
                                    case="-", statement=f"{strategy}: {_describe(target)}",
                                    status="pending", reason="no case of this target was run",
                                    threshold=target["min"]))  # fmt: skip
            for case in target.get("cases", []):
                claims.append(judge(results, task, strategy, target, case, meaningful))
    return claims


def counts(claims: list[Claim]) -> dict[str, int]:
    out = {s: 0 for s in ("supported", "caveated", "rejected", "pending")}
    for c in claims:
        out[c.status] += 1
    return out


__all__ = [
    "Claim",
    "claims_ledger",
    "comparator_gap",
    "counts",
    "judge",
    "ncu_case",
    "row_of",
    "time_of",
]

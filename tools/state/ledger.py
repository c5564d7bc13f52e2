"""The append-only evaluation ledger and best-so-far queries.

Side of the trust boundary: trusted. The ledger lives in the workspace's trusted store
(tools/state/trusted_store.py); the workspace gets a view of it (`view()`, written by the Workspace
after every append) that ranks candidates by their aggregate score only: a final record's
per-case numbers (bytes/GB/s x median give a hidden shape) never leave the store.

Scores compare only within a case set: a run on one dev case sums fewer medians than a run on
all of them, and two hidden case sets are different problems. Records imported from a workspace
made before the store existed carry `untrusted: true` and never count as a best until their
candidate is scored again.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .storage import append_jsonl, read_jsonl

VIEW_ROWS = 50  # per mode and case set in the workspace's view


def new_record_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def counts(rec: dict[str, Any]) -> bool:
    """Whether a record can be a best: passed, scored, and scored by this toolkit."""
    return (
        rec.get("status") == "passed"
        and isinstance(rec.get("score"), int | float)
        and not isinstance(rec.get("score"), bool)
        and not rec.get("untrusted")
    )


class Ledger:
    """One record per evaluation: id, time, mode, case set, candidate, config, cases, score,
    status, device, versions, seeds. Lower score is better unless higher_is_better."""

    def __init__(
        self,
        path: Path,
        *,
        higher_is_better: bool = False,
        on_append: Callable[[Ledger], None] | None = None,
        mode_higher: dict[str, bool] | None = None,
    ) -> None:
        self.path = path
        self.higher_is_better = higher_is_better
        self.on_append = on_append
        # A command task's dev and final objectives may rank opposite ways (us vs speedup).
        self.mode_higher = dict(mode_higher or {})

    def higher(self, mode: str | None) -> bool:
        return self.mode_higher.get(mode or "", self.higher_is_better)

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        record = {"id": new_record_id(), "time": time.time(), "pid": os.getpid(), **record}
        append_jsonl(self.path, record)
        if self.on_append is not None:
            self.on_append(self)
        return record

    def records(self, mode: str | None = None) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.path) if mode is None or r.get("mode") == mode]

    def better(self, a: float, b: float, mode: str | None = None) -> bool:
        return a > b if self.higher(mode) else a < b

    def best(self, mode: str, *, case_set: str) -> dict[str, Any] | None:
        """Best trusted passing record of `mode` on `case_set`."""
        ranked = self.ranked(mode, case_set=case_set)
        return ranked[0] if ranked else None

    def case_sets(self, mode: str, records: list[dict[str, Any]] | None = None) -> list[str]:
        """Case sets with a trusted passing record in `mode`, most recently scored last."""
        seen: dict[str, float] = {}
        for rec in self.records(mode) if records is None else records:
            if rec.get("mode") == mode and counts(rec):
                seen[str(rec.get("case_set"))] = float(rec.get("time", 0.0))
        return sorted(seen, key=lambda c: seen[c])

    def ranked(
        self, mode: str, *, case_set: str, records: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Trusted passing candidates on `case_set`, de-duplicated by hash (best record of
        each; the first of equal scores), best first."""
        by_hash: dict[str, dict[str, Any]] = {}
        for rec in self.records(mode) if records is None else records:
            if rec.get("mode") != mode or not counts(rec) or rec.get("case_set") != case_set:
                continue
            h = rec.get("candidate", "")
            if h not in by_hash or self.better(rec["score"], by_hash[h]["score"], mode):
                by_hash[h] = rec
        return sorted(by_hash.values(), key=lambda r: r["score"], reverse=self.higher(mode))

    def view(self) -> dict[str, Any]:
        """What the agent may read: per mode and case set, the ranked candidates with their
        aggregate score, never per-case numbers."""
        records = self.records()  # read once: the view is rewritten after every append
        modes: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for mode in sorted({str(r.get("mode")) for r in records}):
            for cs in self.case_sets(mode, records):
                ranked = self.ranked(mode, case_set=cs, records=records)
                modes.setdefault(mode, {})[cs] = [
                    {
                        "rank": i + 1,
                        "candidate": r.get("candidate"),
                        "score": r.get("score"),
                        "geomean_pct_of_copy_bw": r.get("geomean_pct_of_copy_bw"),
                        "config": r.get("config") or {},
                        "record_id": r.get("id"),
                        "time": r.get("time"),
                    }
                    for i, r in enumerate(ranked[:VIEW_ROWS])
                ]
        return {
            "about": "A view of the trusted ledger (kept outside the workspace): editing this "
            "file changes nothing. rank_history reads the ledger itself.",
            "lower_is_better": not self.higher_is_better,
            "lower_is_better_by_mode": {m: not self.higher(m) for m in modes},
            "modes": modes,
        }


__all__ = ["Ledger", "counts", "new_record_id"]

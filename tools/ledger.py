"""The append-only evaluation ledger (.harnesslab/history.jsonl) and best-so-far queries."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from .storage import append_jsonl, read_jsonl


def new_record_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


class Ledger:
    """One record per evaluation: id, time, mode, candidate, config, cases, score, status,
    device, versions, seeds. Lower score_us is better unless higher_is_better."""

    def __init__(self, path: Path, *, higher_is_better: bool = False) -> None:
        self.path = path
        self.higher_is_better = higher_is_better

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        record = {"id": new_record_id(), "time": time.time(), "pid": os.getpid(), **record}
        append_jsonl(self.path, record)
        return record

    def records(self, mode: str | None = None) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.path) if mode is None or r.get("mode") == mode]

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b

    def best(self, mode: str, *, case_set: str | None = None) -> dict[str, Any] | None:
        """Best passing record for `mode` (optionally only records on the same case set)."""
        best: dict[str, Any] | None = None
        for rec in self.records(mode):
            if rec.get("status") != "passed" or rec.get("score") is None:
                continue
            if case_set is not None and rec.get("case_set") != case_set:
                continue
            if best is None or self.better(rec["score"], best["score"]):
                best = rec
        return best

    def ranked(self, mode: str) -> list[dict[str, Any]]:
        """Passing candidates de-duplicated by hash (best record of each), best first."""
        by_hash: dict[str, dict[str, Any]] = {}
        for rec in self.records(mode):
            if rec.get("status") != "passed" or rec.get("score") is None:
                continue
            h = rec.get("candidate", "")
            if h not in by_hash or self.better(rec["score"], by_hash[h]["score"]):
                by_hash[h] = rec
        return sorted(by_hash.values(), key=lambda r: r["score"], reverse=self.higher_is_better)


__all__ = ["Ledger", "new_record_id"]

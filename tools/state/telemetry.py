"""Telemetry of MCP tool calls: one JSON line per call in `.harnesslab/telemetry.jsonl`.

A record holds the server, the tool, the argument NAMES (never their values: they can be the
user's code or paths), the duration, a status (ok / tool_error / bad_input / crash / cancelled),
an error code (an exception class or a short code, never a message: messages echo values) and
the size of the result in bytes. The meta-server reads it to see which tools agents use and which fail.

Telemetry is a workspace file (the meta-server and the agent read it), written as untrusted
territory: appended through tools/state/workspace_files.py, never through a symlink or a hard link
(a linked telemetry.jsonl would append tool names and argument names to any file).

Lines are flushed but not fsynced: telemetry is diagnostic, and an fsync costs 1-10 ms per call,
which is most of inspect_context's 5 ms round-trip budget. A crash loses at most the last lines;
a torn one is skipped when read. A deleted workspace is never recreated by a telemetry write.

Rotated by size (~145 B a call): once the file passes SEGMENT_BYTES it becomes
`telemetry.1.jsonl` (the one before, `.2`; ROTATED segments are kept), under a lock so that two
servers of one workspace rotate once. The oldest segment's calls are added to
`telemetry-totals.json` before it goes, so per-tool counts survive every rotation
(`usage`); readers (`read_records`) read the kept segments, each from its tail and at most
SEGMENT_BYTES x 2 of it, so reading takes a bounded time however long the file once grew.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ..errors import HarnesslabError
from . import workspace_files as wf

log = logging.getLogger(__name__)

CallStatus = Literal["ok", "tool_error", "bad_input", "crash", "cancelled"]

SEGMENT_BYTES = 4 << 20  # ~29k calls a segment
ROTATED = 2  # segments kept beside the current one: ~86k calls readable, 12 MiB
LINE_MAX = 4096  # a record is ~145 B; a longer line was not written by this module


def segment_names(rel: str, rotated: int = ROTATED) -> list[str]:
    """The telemetry file's segments, oldest first: `<stem>.<n>.jsonl` ... then `rel`."""
    pure = PurePosixPath(rel)
    older = [str(pure.with_name(f"{pure.stem}.{n}{pure.suffix}")) for n in range(rotated, 0, -1)]
    return [*older, rel]


def totals_name(rel: str) -> str:
    pure = PurePosixPath(rel)
    return str(pure.with_name(f"{pure.stem}-totals.json"))


def parse_lines(data: bytes, *, skip_first: bool = False) -> list[dict[str, Any]]:
    """The JSON-object lines of `data`; a torn, overlong or foreign line is skipped (the file
    is the agent's to write: no line decides anything, none can cost more than LINE_MAX)."""
    lines = data.split(b"\n")
    if skip_first:  # a tail starts mid-line
        lines = lines[1:]
    out = []
    for raw in lines:
        if not raw.strip() or len(raw) > LINE_MAX:
            continue
        try:  # a short line bounds the parse: nesting by the C parser's recursion limit,
            rec = json.loads(raw)  # an integer by its digits (LINE_MAX < int_max_str_digits)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_records(root: Path, rel: str) -> list[dict[str, Any]]:
    """The records of every kept segment, oldest first; missing or refused segments read as
    empty (see the module docstring for the bound)."""
    out: list[dict[str, Any]] = []
    limit = SEGMENT_BYTES * 2
    for name in segment_names(rel):
        size = wf.file_size(root, name)
        if not size:
            continue
        try:
            data = wf.read_tail(root, name, limit)
        except HarnesslabError:
            continue
        out.extend(parse_lines(data, skip_first=size > limit))
    return out


def read_totals(root: Path, rel: str) -> dict[str, Any]:
    """Calls of rotated-away segments: {"calls": n, "tools": {tool: {"calls", "status"}}}
    (an agent-writable file: anything malformed reads as none)."""
    empty: dict[str, Any] = {"calls": 0, "tools": {}}
    try:
        data = wf.read_json(root, totals_name(rel), max_bytes=1 << 20)
    except HarnesslabError:
        return empty
    if not isinstance(data, dict) or not isinstance(data.get("tools"), dict):
        return empty
    tools: dict[str, Any] = {}
    for tool, row in data["tools"].items():
        if not isinstance(row, dict) or not _count(row.get("calls")):
            continue
        status = row.get("status")
        status = status if isinstance(status, dict) else {}
        tools[str(tool)] = {
            "calls": row["calls"],
            "status": {str(k): v for k, v in status.items() if _count(v)},
        }
    calls = data.get("calls")
    return {"calls": calls if _count(calls) else 0, "tools": tools}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def usage(root: Path, rel: str) -> dict[str, dict[str, Any]]:
    """Per tool, since telemetry began: calls and failures by status (rotated segments
    included, from the totals), median duration (kept segments)."""
    return summarize(read_records(root, rel), totals=read_totals(root, rel))


class Telemetry:
    """Appends call records for one server to `path` inside the workspace `guard`, the folder
    that must still exist for a record to be written: telemetry never resurrects a deleted
    workspace."""

    def __init__(
        self, path: Path, server: str, *, guard: Path, segment_bytes: int = SEGMENT_BYTES
    ) -> None:
        self.path = path
        self.server = server
        self.guard = guard
        self.rel = wf.inside(guard, path)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()

    def record(
        self,
        tool: str,
        *,
        arg_names: list[str],
        duration_s: float,
        status: CallStatus,
        result_bytes: int = 0,
        error: str = "",
        server: str | None = None,
        gpu: bool = False,
    ) -> dict[str, Any] | None:
        rec: dict[str, Any] = {
            "time": time.time(),
            "server": server or self.server,
            "tool": tool,
            "args": sorted(arg_names),
            "duration_ms": round(duration_s * 1e3, 3),
            "status": status,
            "result_bytes": result_bytes,
        }
        if error:
            rec["error"] = error[:80]
        if gpu:  # a tool that takes the GPU lock: its duration counts as GPU-backed work
            rec["gpu"] = True
        if not self.guard.is_dir():
            log.warning("telemetry not written: %s is gone", self.guard)
            return None
        line = json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n"
        try:
            with self._lock:
                size = wf.append_line(self.guard, self.rel, line)
                if size > self.segment_bytes:
                    self.rotate()
        except (OSError, HarnesslabError) as exc:  # telemetry must never fail a tool call
            log.warning("telemetry not written to %s: %s", self.path, exc)
            return None
        return rec

    def rotate(self) -> None:
        """Current -> .1 -> .2 ...; the oldest segment's calls go into the totals first. Under
        a lock, and only while the current file is still over the limit (another server of the
        workspace may have rotated it a moment ago)."""
        names = segment_names(self.rel)
        with wf.locked(self.guard, f"{self.rel}.lock"):
            if (wf.file_size(self.guard, self.rel) or 0) <= self.segment_bytes:
                return
            oldest = names[0]
            if wf.file_size(self.guard, oldest):
                gone = parse_lines(wf.read_tail(self.guard, oldest, self.segment_bytes * 2))
                totals = read_totals(self.guard, self.rel)
                totals["calls"] += len(gone)
                for tool, row in summarize(gone).items():
                    kept = totals["tools"].setdefault(tool, {"calls": 0, "status": {}})
                    kept["calls"] += row["calls"]
                    for status, n in row["status"].items():
                        kept["status"][status] = kept["status"].get(status, 0) + n
                wf.write_json(self.guard, totals_name(self.rel), totals)
            for older, newer in itertools.pairwise(names):
                wf.rename(self.guard, newer, older)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.guard, self.rel)


def summarize(
    records: Iterable[dict[str, Any]], *, totals: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Per tool: calls, failures by status, median duration. For reports and the meta-server.
    `totals` (read_totals): calls of rotated-away segments, added to the counts."""
    by_tool: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_tool.setdefault(str(rec.get("tool")), []).append(rec)
    earlier = (totals or {}).get("tools", {})
    out: dict[str, dict[str, Any]] = {}
    for tool in sorted(set(by_tool) | set(earlier)):
        recs = by_tool.get(tool, [])
        durations = sorted(float(r.get("duration_ms", 0.0)) for r in recs)
        status = Counter(str(r.get("status")) for r in recs)
        status.update(earlier.get(tool, {}).get("status", {}))
        out[tool] = {
            "calls": len(recs) + earlier.get(tool, {}).get("calls", 0),
            "status": dict(status),
            "median_ms": durations[len(durations) // 2] if durations else None,
        }
    return out


__all__ = [
    "SEGMENT_BYTES",
    "CallStatus",
    "Telemetry",
    "read_records",
    "read_totals",
    "segment_names",
    "summarize",
    "usage",
]

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
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from ..errors import UsageError
from . import workspace_files as wf

log = logging.getLogger(__name__)

CallStatus = Literal["ok", "tool_error", "bad_input", "crash", "cancelled"]


class Telemetry:
    """Appends call records for one server to `path` inside the workspace `guard`, the folder
    that must still exist for a record to be written: telemetry never resurrects a deleted
    workspace."""

    def __init__(self, path: Path, server: str, *, guard: Path) -> None:
        self.path = path
        self.server = server
        self.guard = guard
        self.rel = wf.inside(guard, path)
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
                wf.append_line(self.guard, self.rel, line)
        except (OSError, UsageError) as exc:  # telemetry must never fail a tool call
            log.warning("telemetry not written to %s: %s", self.path, exc)
            return None
        return rec

    def records(self) -> list[dict[str, Any]]:
        return wf.read_jsonl(self.guard, self.rel)


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per tool: calls, failures by status, median duration. For reports and the meta-server."""
    by_tool: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_tool.setdefault(str(rec.get("tool")), []).append(rec)
    out: dict[str, dict[str, Any]] = {}
    for tool, recs in sorted(by_tool.items()):
        durations = sorted(float(r.get("duration_ms", 0.0)) for r in recs)
        out[tool] = {
            "calls": len(recs),
            "status": dict(Counter(str(r.get("status")) for r in recs)),
            "median_ms": durations[len(durations) // 2] if durations else None,
        }
    return out


__all__ = ["CallStatus", "Telemetry", "summarize"]

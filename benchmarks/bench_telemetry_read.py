"""Reading telemetry at its largest: the rotated segments (tools/state/telemetry.py) against the
old whole-file reader on a 63 MiB file. CPU only; prints one table.

    python benchmarks/bench_telemetry_read.py

Rows: the kept segments full (current + 2 rotated, 4 MiB each), read by read_records and by
usage (with the totals); a 63 MiB legacy file (~450k calls, what a long-lived workspace had
before rotation) read by read_records (its tail) and by the old reader
(workspace_files.read_jsonl, whole file, the per-line depth check); one append that rotates it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from harnesslab.tools.state import workspace_files as wf
from harnesslab.tools.state.telemetry import SEGMENT_BYTES, Telemetry, read_records, usage

REL = ".harnesslab/telemetry.jsonl"
RECORD = {"args": ["cases"], "duration_ms": 12.345, "result_bytes": 1234,
          "server": "harnesslab-task", "status": "ok", "time": 1700000000.123,
          "tool": "run_objective"}  # fmt: skip


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    line = (json.dumps(RECORD, sort_keys=True, separators=(",", ":")) + "\n").encode()
    full = Path(tempfile.mkdtemp(prefix="hl-tel-"))
    (full / ".harnesslab").mkdir()
    for name in ("telemetry.2.jsonl", "telemetry.1.jsonl", "telemetry.jsonl"):
        (full / ".harnesslab" / name).write_bytes(line * (SEGMENT_BYTES // len(line)))
    legacy = Path(tempfile.mkdtemp(prefix="hl-tel-legacy-"))
    (legacy / ".harnesslab").mkdir()
    (legacy / REL).write_bytes(line * ((63 << 20) // len(line)))
    rows = []
    recs, s = timed(lambda: read_records(full, REL))
    rows.append(("kept segments full (3 x 4 MiB): read_records", len(recs), s))
    counts, s = timed(lambda: usage(full, REL))
    rows.append(
        ("kept segments full: usage (counts + totals)", counts["run_objective"]["calls"], s)
    )
    recs, s = timed(lambda: read_records(legacy, REL))
    rows.append(("legacy 63 MiB file: read_records (its tail)", len(recs), s))
    recs, s = timed(lambda: wf.read_jsonl(legacy, REL, max_bytes=64 << 20))
    rows.append(("legacy 63 MiB file: the old reader (whole file)", len(recs), s))
    tel = Telemetry(legacy / REL, "bench", guard=legacy)
    _, s = timed(lambda: tel.record("t", arg_names=[], duration_s=0.0, status="ok"))
    rows.append(("one append that rotates the legacy file", 1, s))
    load = os.getloadavg()[0]
    print(f"# bench_telemetry_read  {platform.node()}  python {platform.python_version()}  "
          f"{time.strftime('%Y-%m-%d')}  load average {load:.1f}, {os.cpu_count()} CPUs")  # fmt: skip
    print("| read | records | seconds |")
    print("|---|---|---|")
    for what, n, secs in rows:
        print(f"| {what} | {n} | {secs:.2f} |")
    shutil.rmtree(full, ignore_errors=True)
    shutil.rmtree(legacy, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Telemetry rotated by size (tools/state/telemetry.py): counts survive rotation, readers see
every kept segment, and reading is bounded however long the file once grew."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnesslab.tools.state import telemetry as tm
from harnesslab.tools.state.telemetry import Telemetry, read_records, usage

REL = ".harnesslab/telemetry.jsonl"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / ".harnesslab").mkdir()
    return tmp_path


def writer(root: Path, segment_bytes: int = 2048) -> Telemetry:
    return Telemetry(root / REL, "srv", guard=root, segment_bytes=segment_bytes)


def test_rotation_keeps_segments_readable_and_every_call_counted(root: Path) -> None:
    tel = writer(root)
    for i in range(200):  # ~150 B each: ~15 segments of 2 KiB
        tel.record("run_objective" if i % 2 else "inspect_context", arg_names=["cases"],
                   duration_s=0.01, status="ok" if i % 5 else "tool_error")  # fmt: skip
    names = sorted(p.name for p in (root / ".harnesslab").glob("telemetry*.jsonl"))
    assert names == ["telemetry.1.jsonl", "telemetry.2.jsonl", "telemetry.jsonl"]
    assert all(p.stat().st_size <= 2048 + 200 for p in (root / ".harnesslab").glob("*.jsonl"))
    kept = read_records(root, REL)
    assert 0 < len(kept) < 200  # the kept segments only, oldest first
    assert [r["time"] for r in kept] == sorted(r["time"] for r in kept)
    counts = usage(root, REL)  # the rotated-away segments live on in the totals
    assert counts["run_objective"]["calls"] == 100 and counts["inspect_context"]["calls"] == 100
    assert sum(c["status"].get("tool_error", 0) for c in counts.values()) == 40


def test_two_servers_of_one_workspace_rotate_once_and_lose_no_count(root: Path) -> None:
    a, b = writer(root), writer(root)
    for i in range(120):
        (a if i % 2 else b).record("t", arg_names=[], duration_s=0.0, status="ok")
    assert usage(root, REL)["t"]["calls"] == 120


def test_a_file_past_the_old_64_mib_limit_is_read_from_its_tail_not_as_empty(root: Path) -> None:
    line = json.dumps({"tool": "t", "status": "ok", "time": 1.0, "server": "s"}) + "\n"
    with (root / REL).open("w") as fh:  # 65 MiB: what ~460k calls left before rotation existed
        fh.write(line * ((65 << 20) // len(line) + 1))
    kept = read_records(root, REL)
    assert kept and len(kept) <= (2 * tm.SEGMENT_BYTES) // len(line) + 1
    writer(root, segment_bytes=tm.SEGMENT_BYTES).record("t", arg_names=[], duration_s=0.0,
                                                         status="ok")  # fmt: skip
    assert (root / ".harnesslab" / "telemetry.1.jsonl").stat().st_size > 64 << 20  # rotated
    assert not (root / REL).exists()  # the next call starts a new segment


def test_lines_and_totals_the_agent_wrote_count_for_nothing(root: Path) -> None:
    ok = json.dumps({"tool": "t", "status": "ok", "time": 1.0}) + "\n"
    junk = "{not json\n" + "[" * 5000 + "\n" + '{"x": ' + "1" * 5000 + "}\n" + "x" * 10000 + "\n"
    (root / REL).write_text(ok + junk + ok)
    assert [r["tool"] for r in read_records(root, REL)] == ["t", "t"]
    (root / ".harnesslab" / "telemetry-totals.json").write_text(
        json.dumps({"calls": -3, "tools": {"t": {"calls": "9", "status": {"ok": -1}}}})
    )
    assert usage(root, REL)["t"]["calls"] == 2

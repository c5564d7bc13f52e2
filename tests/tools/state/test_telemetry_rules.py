"""Each rule of a telemetry record and of its readers (tools/state/telemetry.py), one test per
rule: what a record holds, when nothing is written, how segments are named, which lines and
totals count, and how the per-tool summary adds them up."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harnesslab.tools.state import telemetry as tm
from harnesslab.tools.state.telemetry import Telemetry, read_records, read_totals, summarize

REL = ".harnesslab/telemetry.jsonl"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / ".harnesslab").mkdir()
    return tmp_path


def test_a_record_holds_names_durations_and_codes_never_values(root: Path) -> None:
    tel = Telemetry(root / REL, "srv", guard=root)
    rec = tel.record("run", arg_names=["b", "a"], duration_s=0.0123456, status="crash",
                     result_bytes=7, error="E" * 100)  # fmt: skip
    assert rec is not None
    assert {k: v for k, v in rec.items() if k != "time"} == {
        "server": "srv", "tool": "run", "args": ["a", "b"], "duration_ms": 12.346,
        "status": "crash", "result_bytes": 7, "error": "E" * 80,
    }  # fmt: skip
    assert [{k: v for k, v in r.items() if k != "time"} for r in read_records(root, REL)] == [
        {k: v for k, v in rec.items() if k != "time"}]  # fmt: skip


def test_a_record_names_its_server_and_gpu_work_only_when_told(root: Path) -> None:
    tel = Telemetry(root / REL, "srv", guard=root)
    rec = tel.record("t", arg_names=[], duration_s=0, status="ok", server="other", gpu=True)
    assert rec is not None and rec["server"] == "other" and rec["gpu"] is True
    plain = tel.record("t", arg_names=[], duration_s=0, status="ok")
    assert plain is not None and "gpu" not in plain and "error" not in plain
    assert plain["server"] == "srv" and plain["result_bytes"] == 0


def test_nothing_is_written_for_a_deleted_workspace_or_through_a_refused_path(
    root: Path, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    tel = Telemetry(gone / "t.jsonl", "srv", guard=gone)
    gone.rmdir()
    assert tel.record("t", arg_names=[], duration_s=0, status="ok") is None
    assert not gone.exists()  # never recreated
    (root / ".harnesslab" / "real.jsonl").write_text("")
    (root / REL).symlink_to(root / ".harnesslab" / "real.jsonl")
    linked = Telemetry(root / REL, "srv", guard=root)
    assert linked.record("t", arg_names=[], duration_s=0, status="ok") is None
    assert (root / ".harnesslab" / "real.jsonl").read_text() == ""


def test_segments_are_named_oldest_first_and_totals_beside_them() -> None:
    assert tm.segment_names("d/tel.jsonl", 2) == ["d/tel.2.jsonl", "d/tel.1.jsonl", "d/tel.jsonl"]
    assert tm.segment_names("d/tel.jsonl") == ["d/tel.2.jsonl", "d/tel.1.jsonl", "d/tel.jsonl"]
    assert tm.totals_name("d/tel.jsonl") == "d/tel-totals.json"


def test_only_whole_short_object_lines_count() -> None:
    obj = b'{"tool":"a"}'
    long = b'{"tool":"' + b"x" * (tm.LINE_MAX - 11) + b'"}'
    assert len(long) == tm.LINE_MAX
    data = obj + b"\n\n  \n[1]\n" + long + b"\n" + long[:-1] + b'x"}\n{"tool":'
    assert [r["tool"][:1] for r in tm.parse_lines(data)] == ["a", "x"]
    assert tm.parse_lines(obj + b"\n" + obj, skip_first=True) == [{"tool": "a"}]


def test_a_line_past_4096_bytes_is_skipped_even_when_it_parses() -> None:
    def line(n: int) -> bytes:  # a JSON object line of n bytes
        return b'{"tool":"' + b"x" * (n - 11) + b'"}'

    lines = [line(4096), line(4097), line(40000)]
    assert [len(x) for x in lines] == [4096, 4097, 40000]
    assert [len(r["tool"]) for r in tm.parse_lines(b"\n".join(lines))] == [4096 - 11]


def test_a_segment_read_from_its_tail_skips_the_torn_first_line(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tm, "SEGMENT_BYTES", 16)  # a tail of 32 bytes
    torn = 'X {"tool": "torn"}\n'  # its last 18 bytes parse: the tail must not read them
    (root / REL).write_text(torn + '{"tool": "b"}\n')
    assert (root / REL).stat().st_size == 33
    assert [r["tool"] for r in read_records(root, REL)] == ["b"]
    (root / REL).write_text('{"tool": "b"}\n{"tool": "ccccc"}\n')  # at the bound: read whole
    assert (root / REL).stat().st_size == 32
    assert [r["tool"] for r in read_records(root, REL)] == ["b", "ccccc"]


def test_a_segment_that_cannot_be_read_reads_as_empty(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another server may rotate a segment away between its stat and its read.
    for name in ("telemetry.2.jsonl", "telemetry.1.jsonl", "telemetry.jsonl"):
        (root / ".harnesslab" / name).write_text(json.dumps({"tool": name}) + "\n")
    read_tail = tm.wf.read_tail

    def vanishing(guard: Path, rel: str, limit: int) -> bytes:
        if rel.endswith(".1.jsonl"):
            raise tm.HarnesslabError(f"{rel} is gone")
        return read_tail(guard, rel, limit)

    monkeypatch.setattr(tm.wf, "read_tail", vanishing)
    tel = Telemetry(root / REL, "srv", guard=root)
    assert [r["tool"] for r in tel.records()] == ["telemetry.2.jsonl", "telemetry.jsonl"]


def test_totals_keep_only_counts(root: Path) -> None:
    path = root / ".harnesslab" / "telemetry-totals.json"
    path.write_text(json.dumps({"calls": 5, "tools": {
        "a": {"calls": 3, "status": {"ok": 2, "crash": True, "x": -1, "bad_input": 1}},
        "b": {"calls": True}, "c": {"calls": 0, "status": ["ok"]}, "d": "x",
    }}))  # fmt: skip
    assert read_totals(root, REL) == {"calls": 5, "tools": {
        "a": {"calls": 3, "status": {"ok": 2, "bad_input": 1}},
        "c": {"calls": 0, "status": {}},
    }}  # fmt: skip
    path.write_text(json.dumps({"calls": True, "tools": {}}))
    assert read_totals(root, REL) == {"calls": 0, "tools": {}}
    path.write_text(json.dumps({"calls": 1, "tools": []}))
    assert read_totals(root, REL) == {"calls": 0, "tools": {}}
    path.write_text(json.dumps([1]))
    assert read_totals(root, REL) == {"calls": 0, "tools": {}}


def test_the_summary_counts_statuses_adds_totals_and_takes_the_upper_median() -> None:
    recs = [{"tool": "a", "status": "ok", "duration_ms": d} for d in (4.0, 1.0, 3.0, 2.0)]
    recs.append({"tool": "a", "status": "crash", "duration_ms": 9.0})
    recs.append({"tool": "b"})
    totals = {"calls": 7, "tools": {"a": {"calls": 6, "status": {"ok": 6}},
                                    "z": {"calls": 1, "status": {"crash": 1}}}}  # fmt: skip
    assert summarize(recs, totals=totals) == {
        "a": {"calls": 11, "status": {"ok": 10, "crash": 1}, "median_ms": 3.0},
        "b": {"calls": 1, "status": {"None": 1}, "median_ms": 0.0},
        "z": {"calls": 1, "status": {"crash": 1}, "median_ms": None},
    }
    assert summarize(recs[:4])["a"]["median_ms"] == 3.0  # even count: the upper middle
    assert list(summarize([{"tool": "b"}, {"tool": "a"}])) == ["a", "b"]


def test_rotation_happens_past_the_limit_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A record carries time.time(): held still, every record has the same length (a float's
    # repr drops trailing zeros, so two real timestamps can differ by a byte).
    monkeypatch.setattr(time, "time", lambda: 1795707551.25)
    line = len(json.dumps({"tool": "t"}))  # any record is longer than this
    tel = Telemetry(root / REL, "srv", guard=root, segment_bytes=10 * line)
    tel.record("t", arg_names=[], duration_s=0, status="ok")
    size = (root / REL).stat().st_size
    exact = Telemetry(root / REL, "srv", guard=root, segment_bytes=2 * size)
    exact.record("t", arg_names=[], duration_s=0, status="ok")  # at the limit: not past it
    assert (root / REL).stat().st_size == 2 * size
    assert not (root / ".harnesslab" / "telemetry.1.jsonl").exists()
    exact.record("t", arg_names=[], duration_s=0, status="ok")
    assert (root / ".harnesslab" / "telemetry.1.jsonl").stat().st_size == 3 * size
    assert not (root / REL).exists()


def test_a_segment_rotates_past_four_mib(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1795707551.25)  # every record one length
    probe = tmp_path / "probe"
    probe.mkdir()
    Telemetry(probe / "t.jsonl", "srv", guard=probe).record("t", arg_names=[], duration_s=0,
                                                            status="ok")  # fmt: skip
    size = (probe / "t.jsonl").stat().st_size
    (root / REL).write_bytes(b"x" * ((4 << 20) - size - 1) + b"\n")
    tel = Telemetry(root / REL, "srv", guard=root)  # the default segment size
    tel.record("t", arg_names=[], duration_s=0, status="ok")
    assert (root / REL).stat().st_size == 4 << 20  # at the bound: kept
    tel.record("t", arg_names=[], duration_s=0, status="ok")
    assert (root / ".harnesslab" / "telemetry.1.jsonl").stat().st_size == (4 << 20) + size


def test_a_record_is_one_compact_line_with_sorted_keys(root: Path) -> None:
    tel = Telemetry(root / REL, "srv", guard=root)
    tel.record("t", arg_names=["x"], duration_s=0.5, status="tool_error", error="E", gpu=True)
    line = (root / REL).read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    assert line[:-1] == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"))
    assert line.startswith('{"args":["x"],"duration_ms":500.0,"error":"E","gpu":true,')


def test_a_record_not_written_says_why_once(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    tel = Telemetry(gone / "t.jsonl", "srv", guard=gone)
    gone.rmdir()
    with caplog.at_level("WARNING", logger=tm.__name__):
        assert tel.record("t", arg_names=[], duration_s=0, status="ok") is None
    assert [r.getMessage() for r in caplog.records] == [f"telemetry not written: {gone} is gone"]
    caplog.clear()
    (root / REL).mkdir()  # a folder in the file's place: the append is refused
    with caplog.at_level("WARNING", logger=tm.__name__):
        assert Telemetry(root / REL, "srv", guard=root).record(
            "t", arg_names=[], duration_s=0, status="ok"
        ) is None  # fmt: skip
    assert [r.getMessage()[:40] for r in caplog.records] == [
        f"telemetry not written to {root / REL}"[:40]
    ]


def test_rotate_moves_nothing_at_the_limit_or_once_the_file_is_gone(root: Path) -> None:
    older = root / ".harnesslab" / "telemetry.1.jsonl"
    older.write_text('{"tool":"t"}\n')
    # The current file was rotated away by another server a moment ago: nothing moves,
    # whatever the limit.
    Telemetry(root / REL, "srv", guard=root, segment_bytes=0).rotate()
    assert older.exists() and not (root / ".harnesslab" / "telemetry.2.jsonl").exists()
    (root / REL).write_text('{"tool":"t"}\n')  # 13 bytes
    Telemetry(root / REL, "srv", guard=root, segment_bytes=13).rotate()
    assert (root / REL).exists() and older.exists()
    assert not (root / ".harnesslab" / "telemetry.2.jsonl").exists()


def test_rotation_adds_the_oldest_segments_calls_read_from_a_bounded_tail(root: Path) -> None:
    line = '{"status":"ok","tool":"t"}\n'
    (root / ".harnesslab" / "telemetry.2.jsonl").write_text(line * 10)  # grown by the agent
    (root / ".harnesslab" / "telemetry.1.jsonl").write_text(line)
    (root / REL).write_text(line * 3)
    Telemetry(root / REL, "srv", guard=root, segment_bytes=2 * len(line)).rotate()
    # Its last 2 x segment_bytes only: 4 of its 10 lines.
    assert read_totals(root, REL) == {"calls": 4, "tools": {"t": {"calls": 4,
                                                                  "status": {"ok": 4}}}}  # fmt: skip
    assert (root / ".harnesslab" / "telemetry.1.jsonl").read_text() == line * 3
    assert (root / ".harnesslab" / "telemetry.2.jsonl").read_text() == line
    assert not (root / REL).exists()


def test_totals_past_one_mib_read_as_none(root: Path) -> None:
    path = root / ".harnesslab" / "telemetry-totals.json"
    text = json.dumps({"calls": 5, "tools": {}})
    path.write_text(text.ljust(1 << 20))  # trailing blanks: still one JSON value
    assert read_totals(root, REL)["calls"] == 5
    path.write_text(text.ljust((1 << 20) + 1))
    assert read_totals(root, REL) == {"calls": 0, "tools": {}}

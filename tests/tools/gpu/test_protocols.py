"""The guarded verify's two message protocols dispatch through their op tables: the replayer
(replay.serve: each op to its Replayer method with its fields, an unknown op or a missing field
answered as an error, exit ends it) and the candidate's process (guard_child.Child.serve: each
op to its handler, anything else ends it). CPU only: the Replayer and the Child's handlers are
stand-ins that record what they were asked."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, ClassVar

import pytest

from harnesslab.tools.gpu import wire


@pytest.fixture
def staged(monkeypatch):
    """Import a staged module by package name; its own sys.path insert is undone after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    return lambda name: importlib.import_module(f"harnesslab.tools.gpu.{name}")


def frames(*requests: Any) -> int:
    r, w = os.pipe()
    for req in requests:
        wire.send(w, req)
    os.close(w)
    return r


def replies(fd: int) -> list[Any]:
    out = []
    while True:
        try:
            out.append(wire.recv(fd, 1))
        except wire.WireError:
            return out


class FakeReplayer:
    calls: ClassVar[list[tuple[str, tuple[Any, ...]]]] = []

    def __getattr__(self, name: str):
        def method(*args: Any) -> dict[str, Any]:
            FakeReplayer.calls.append((name, args))
            return {"method": name}

        return method


REQUESTS = {  # each op with its fields, and the Replayer call it must become
    "hello": ({"sock": 7}, ("hello", (7,))),
    "kernels": ({"kernels": [{"id": "k"}]}, ("load_kernels", ([{"id": "k"}],))),
    "arena": ({"id": "a", "nbytes": 64}, ("arena", ("a", 64))),
    "close_arena": ({"id": "a"}, ("close_arena", ("a",))),
    "program": ({"id": "p", "steps": [1], "calls": [2]}, ("program", ("p", [1], [2]))),
    "run": ({"id": "p", "calls": [0]}, ("run", ("p", [0]))),
    "capture": ({"id": "p"}, ("capture", ("p",))),
    "time": ({"id": None}, ("time", (None,))),
    "drop": ({"id": "p"}, ("drop", ("p",))),
}


def test_every_replayer_op_reaches_its_method_with_its_fields(staged, monkeypatch):
    replay = staged("verify.replay")
    monkeypatch.setattr(replay, "Replayer", FakeReplayer)
    monkeypatch.setattr(replay, "SPIN_S", 0.0)
    FakeReplayer.calls = []
    assert set(replay.OPS) == set(REQUESTS)
    fd_in = frames(*({"op": op, **fields} for op, (fields, _) in REQUESTS.items()))
    r, w = os.pipe()
    assert replay.serve(fd_in, w) == 0  # EOF on the requests
    os.close(w)
    assert FakeReplayer.calls == [call for _, call in REQUESTS.values()]
    assert replies(r) == [{"ok": True, "method": name} for _, (name, _) in REQUESTS.values()]


def test_the_replayer_answers_an_unknown_op_or_a_missing_field_as_an_error_and_exit_ends_it(
    staged, monkeypatch
):
    replay = staged("verify.replay")
    monkeypatch.setattr(replay, "Replayer", FakeReplayer)
    monkeypatch.setattr(replay, "SPIN_S", 0.0)
    FakeReplayer.calls = []
    fd_in = frames({"op": "nope"}, {"op": ["x"]}, {"op": "run", "id": "p"}, {"op": "exit"},
                   {"op": "drop", "id": "never"})  # fmt: skip
    r, w = os.pipe()
    assert replay.serve(fd_in, w) == 0
    os.close(w)
    assert replies(r) == [
        {"error": "unknown request 'nope'"},
        {"error": "unknown request ['x']"},
        {"error": "KeyError: 'calls'"},
    ]
    assert FakeReplayer.calls == []  # nothing after exit ran


def test_the_candidate_process_dispatches_each_op_and_stops_at_anything_else(staged):
    guard_child = staged("verify.guard_child")
    seen: list[Any] = []
    child = guard_child.Child.__new__(guard_child.Child)
    child.load = lambda: seen.append("load")
    for name in ("map_arena", "call", "record", "end_case", "mark"):
        setattr(child, name, lambda msg, name=name: seen.append((name, msg["op"])))
    requests = [{"op": "load"}, {"op": "arena", "size": 8}, {"op": "mark"}, {"op": "call"},
                {"op": "record"}, {"op": "end_case"}]  # fmt: skip
    child.serve(frames(*requests, {"op": "exit"}, {"op": "load"}))
    assert seen == ["load", ("map_arena", "arena"), ("mark", "mark"), ("call", "call"),
                    ("record", "record"), ("end_case", "end_case")]  # fmt: skip
    seen.clear()
    child.serve(frames({"op": ["load"]}, {"op": "load"}))  # not an op name: ends it
    assert seen == []


def test_a_marked_window_walks_no_class_and_a_closed_window_forgets_its_mark(staged, monkeypatch):
    """Observer.mark takes the class snapshot (between windows, at the parent's request), so
    the window opened after it walks none inside the parent's clock; close spends the mark, so
    a window opened without one walks the classes itself (never judged by a stale one)."""
    guard_observer = staged("verify.guard_observer")
    walks: list[int] = []
    monkeypatch.setattr(guard_observer, "every_class",
                        lambda: walks.append(1) or {len(walks): int})  # fmt: skip
    obs = guard_observer.Observer(None, "/nowhere")
    obs.mark()
    assert (walks, obs.before) == ([1], {1: int})
    obs.open()
    assert (walks, obs.recording) == ([1], True)  # the mark's snapshot, no walk in the window
    obs.stream = 5
    obs.close()
    assert (obs.recording, obs.stream, obs.before) == (False, None, None)
    obs.open()
    assert (walks, obs.before) == ([1, 1], {2: int})  # no mark since: walked on open

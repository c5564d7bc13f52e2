"""The framed JSON between the trusted verify process and its sandboxed children (gpu/wire.py):
what a child sends is hostile, so frames are bounded in size, time and nesting, and every
breach is a WireError of its kind. Over real pipes, no GPU."""

from __future__ import annotations

import json
import os
import select
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from harnesslab.tools.gpu import wire


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_frame_is_a_big_endian_length_and_compact_json() -> None:
    frame = wire.encode({"a": [1, 2], "b": "é"})
    body = json.dumps({"a": [1, 2], "b": "é"}, separators=(",", ":")).encode()
    assert frame == struct.pack(">I", len(body)) + body
    assert frame[:4] == len(body).to_bytes(4, "big")


def test_a_frame_round_trips_over_a_pipe(pipe) -> None:
    r, w = pipe
    wire.send(w, {"x": 1})
    wire.send(w, [1, "two"])
    assert wire.recv(r, timeout_s=5) == {"x": 1}
    assert wire.recv(r, timeout_s=5, spin=True) == [1, "two"]
    wire.send(w, None)
    assert wire.recv(r, timeout_s=None) is None


def test_a_large_frame_is_written_and_read_whole(pipe) -> None:
    r, w = pipe
    big = {"blob": "x" * (3 << 20)}  # larger than a pipe's buffer and the 1 MiB read chunk
    writer = threading.Thread(target=wire.send, args=(w, big))
    writer.start()
    assert wire.recv(r, timeout_s=30) == big
    writer.join()


def test_nothing_to_read_is_a_timeout_with_what_arrived(pipe) -> None:
    r, w = pipe
    with pytest.raises(wire.WireError, match="^timeout: no answer within the limit \\(0 of 4"):
        wire.recv(r, timeout_s=0.05)
    os.write(w, struct.pack(">I", 10) + b'{"a"')
    with pytest.raises(wire.WireError) as err:
        wire.recv(r, timeout_s=0.05, spin=True)
    assert err.value.kind == "timeout" and "(4 of 10 bytes)" in str(err.value)


def test_a_closed_peer_is_eof(pipe) -> None:
    r, w = pipe
    os.write(w, b"\x00\x00")
    os.close(w)
    with pytest.raises(wire.WireError) as err:
        wire.recv(r, timeout_s=5)
    assert err.value.kind == "eof" and str(err.value) == "eof: the process closed its end"


def test_an_oversized_frame_is_refused_before_it_is_read(pipe) -> None:
    r, w = pipe
    os.write(w, struct.pack(">I", wire.MAX_FRAME + 1))
    with pytest.raises(wire.WireError, match=f"^protocol: frame of {wire.MAX_FRAME + 1} bytes"):
        wire.recv(r, timeout_s=5)
    assert wire.MAX_FRAME == 256 << 20


def test_a_frame_of_exactly_the_limit_is_not_refused_for_its_size(pipe) -> None:
    r, w = pipe
    os.write(w, struct.pack(">I", wire.MAX_FRAME) + b"[]")
    with pytest.raises(wire.WireError) as err:  # it waits for the rest of its bytes
        wire.recv(r, timeout_s=0.05)
    assert err.value.kind == "timeout"


@pytest.mark.parametrize("raw", [b"{", b"[1,]", b"NaN?", b"\xff"])
def test_malformed_json_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(raw)
    assert err.value.kind == "protocol" and "Error" in str(err.value)


def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def doc(depth: int, extra: int) -> bytes:
    """A JSON array holding `depth` nested arrays and `extra` empty ones: nesting depth + 1,
    depth + 1 + extra opening brackets."""
    return b"[" + nest(depth) + b",[]" * extra + b"]"


def test_deep_nesting_with_many_brackets_is_refused_before_parsing() -> None:
    with pytest.raises(wire.WireError, match="^protocol: nesting too deep"):
        wire.decode(doc(64, 576))  # depth 65, 641 brackets
    objects = b'{"a":' * 65 + b"1" + b"}" * 65
    with pytest.raises(wire.WireError, match="nesting too deep"):
        wire.decode(b"[" + objects + b",{}" * 600 + b"]")


def test_nesting_up_to_the_limit_parses_and_one_deeper_is_refused_with_few_brackets_too() -> None:
    assert wire.decode(doc(63, 600)) is not None  # depth 64: fine
    assert wire.decode(nest(64)) is not None  # exactly the limit, exactly its brackets
    for deeper in (doc(64, 0), doc(64, 575), nest(65)):  # depth 65 whatever the count
        with pytest.raises(wire.WireError, match="nesting"):
            wire.decode(deeper)
    assert wire.MAX_DEPTH == 64


def test_brackets_in_strings_are_not_nesting() -> None:
    assert wire.decode(json.dumps(["[" * 700, "{" * 700]).encode()) == ["[" * 700, "{" * 700]
    quoted = json.dumps(['"' + "[" * 700]).encode()  # an escaped quote does not end the string
    assert wire.decode(quoted) == ['"' + "[" * 700]


def test_closing_brackets_and_escaped_backslashes_are_counted_right() -> None:
    closers = b"[" + b"[[]]," * 300 + nest(60) + b"]"  # depth 61 once closers count
    assert wire.decode(closers) is not None
    backslash = b'["\\\\",' + nest(64) + b",[]" * 600 + b"]"  # the string ends at its quote
    with pytest.raises(wire.WireError, match="nesting too deep"):
        wire.decode(backslash)


def test_read_exact_reads_exactly_and_times_out(pipe) -> None:
    r, w = pipe
    os.write(w, b"abcdef")
    assert wire.read_exact(r, 4, timeout_s=5) == b"abcd"
    assert wire.read_exact(r, 2, timeout_s=5) == b"ef"
    with pytest.raises(wire.WireError, match="timeout"):
        wire.read_exact(r, 1, timeout_s=0.05)


def test_read_line_reads_one_line_within_its_limit(pipe) -> None:
    r, w = pipe
    os.write(w, b"sandbox: full\nrest")
    assert wire.read_line(r, timeout_s=5) == b"sandbox: full\n"
    assert wire.read_exact(r, 4, timeout_s=5) == b"rest"
    os.write(w, b"x" * 4096 + b"\n")
    assert wire.read_line(r, timeout_s=5) == b"x" * 4096 + b"\n"  # 4096 + newline: at the limit
    os.write(w, b"y" * 4097 + b"\n")
    with pytest.raises(wire.WireError, match="^protocol: line too long"):
        wire.read_line(r, timeout_s=5)
    assert wire.read_exact(r, 1, timeout_s=5) == b"\n"  # it stopped one byte past the limit
    os.write(w, b"abc\nabcd\n")
    assert wire.read_line(r, timeout_s=5, limit=3) == b"abc\n"
    with pytest.raises(wire.WireError, match="line too long"):
        wire.read_line(r, timeout_s=5, limit=3)
    assert wire.read_exact(r, 1, timeout_s=5) == b"\n"
    with pytest.raises(wire.WireError, match="timeout"):
        wire.read_line(r, timeout_s=0.05)


def test_wire_errors_carry_their_kind() -> None:
    assert str(wire.WireError("eof")) == "eof" and wire.WireError("eof").kind == "eof"
    assert str(wire.WireError("protocol", "x")) == "protocol: x"


# -- waiting: how long, and how ----------------------------------------------------------------
class SelectSpy:
    """select.select, recording each call's timeout (0 is a poll: the spinning wait)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.timeouts: list[float | None] = []
        real = select.select

        def spy(r, w, x, timeout=None):
            self.timeouts.append(timeout)
            return real(r, w, x, timeout)

        monkeypatch.setattr(select, "select", spy)


def test_a_plain_read_blocks_in_select_and_a_spinning_one_polls(
    pipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    spy = SelectSpy(monkeypatch)
    wire.send(w, {"a": 1})
    assert wire.recv(r, timeout_s=5) == {"a": 1}  # spin is off by default
    assert spy.timeouts and all(t is not None and t > 0 for t in spy.timeouts)
    spy.timeouts.clear()
    wire.send(w, "x")
    assert wire.read_exact(r, 4, timeout_s=5) and wire.read_exact(r, 3, timeout_s=5)
    os.write(w, b"line\n")
    assert wire.read_line(r, timeout_s=5) == b"line\n"
    assert spy.timeouts and all(t is not None and t > 0 for t in spy.timeouts)
    spy.timeouts.clear()
    wire.send(w, {"b": 2})
    assert wire.recv(r, timeout_s=5, spin=True) == {"b": 2}
    assert spy.timeouts and all(t == 0 for t in spy.timeouts)


def test_without_a_deadline_even_a_spinning_read_blocks(pipe, monkeypatch) -> None:
    r, w = pipe
    spy = SelectSpy(monkeypatch)
    wire.send(w, [1])
    assert wire.recv(r, timeout_s=None, spin=True) == [1]
    assert spy.timeouts == [None, None]


def test_data_arriving_later_within_the_limit_is_read(pipe) -> None:
    r, w = pipe
    late = threading.Timer(0.05, lambda: (os.write(w, b"ab\n"), wire.send(w, 7)))
    late.start()
    try:
        assert wire.read_exact(r, 1, timeout_s=10) == b"a"
        assert wire.read_line(r, timeout_s=10) == b"b\n"
        assert wire.recv(r, timeout_s=10, spin=True) == 7
    finally:
        late.join()


@pytest.mark.parametrize("spin", [False, True])
def test_a_short_limit_is_kept_short(pipe, spin: bool) -> None:
    # Bounds, not timings: a 50 ms limit must not stretch to a second-long wait or poll.
    r, _ = pipe
    began = time.monotonic()
    with pytest.raises(wire.WireError, match="timeout"):
        wire.recv(r, timeout_s=0.05, spin=spin)
    assert time.monotonic() - began < 0.9


def test_a_frame_read_in_pieces_never_takes_bytes_of_the_next(
    pipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    wire.send(w, {"first": "x" * 10})
    wire.send(w, {"second": 2})
    real = os.read
    calls = [0]

    def short_first(fd, n):
        calls[0] += 1
        return real(fd, min(n, 2) if calls[0] in (1, 3) else n)  # a short read per part

    monkeypatch.setattr(os, "read", short_first)
    assert wire.recv(r, timeout_s=5) == {"first": "x" * 10}
    assert wire.recv(r, timeout_s=5) == {"second": 2}


def test_closing_braces_close_a_level_as_brackets_do() -> None:
    objects = b"[" + b"{}," * 700 + b"{}]"  # depth 2, 702 openers
    assert wire.decode(objects) == [{}] * 701
    climbing = b"[" + b"[]," * 600 + nest(64) + b"]"  # depth 65 after 600 closed pairs
    with pytest.raises(wire.WireError, match="nesting too deep"):
        wire.decode(climbing)

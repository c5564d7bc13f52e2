"""Framed JSON over pipes between the trusted verify process and its sandboxed children, and the
one reader of hostile JSON lines.

Staged beside runner.py; standard library only. A frame is a 4-byte big-endian length and that
many bytes of UTF-8 JSON. The reader is bounded in size, in time and in JSON nesting, because
what a candidate's process sends is hostile input; binary payloads (kernel binaries) travel as
base64 strings inside the JSON. The host reads every JSON line that a process running agent code
printed (runner events, compile workers, a command objective's output) with `json_object`:
bounded in size and nesting (checked before json.loads recurses), objects only.
"""

from __future__ import annotations

import json
import os
import re
import select
import struct
import time
from typing import Any

MAX_FRAME = 256 << 20
MAX_LINE = 64 << 20  # the executors' longest stdout line
MAX_DEPTH = 64
MAX_STRINGS = 2 << 20  # strings in one frame or line: each costs the depth check ~1 us
_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone: linear, never backtracking
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")  # one opener, one closer


class WireError(Exception):
    """The peer broke the protocol: EOF, timeout, an oversized or malformed frame."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind  # "eof" | "timeout" | "protocol"


def encode(obj: Any) -> bytes:
    """One frame: the length prefix and the JSON."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


def decode(raw: bytes) -> Any:
    """A frame's payload (after its length prefix), checked for nesting before it is parsed
    (json.loads recurses once per level: deep enough, it raises RecursionError)."""
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and too_deep(raw):
        raise WireError("protocol", "nesting too deep")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: also an int over 4300 digits
        raise WireError("protocol", type(exc).__name__) from None


def json_object(line: str | bytes, max_bytes: int = MAX_LINE) -> dict[str, Any] | None:
    """One line of hostile JSON as an object, or None when it is longer than `max_bytes`,
    nested deeper than MAX_DEPTH, not JSON, or not an object. Never raises for its input."""
    raw = line.encode(errors="replace") if isinstance(line, str) else bytes(line)
    if len(raw) > max_bytes:
        return None
    try:
        obj = decode(raw)
    except WireError:
        return None
    return obj if isinstance(obj, dict) else None


def send(fd: int, obj: Any) -> None:
    view = memoryview(encode(obj))
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None, spin: bool) -> bytes:
    out = bytearray()
    while len(out) < n:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if spin and deadline is not None:
            ready = _spin_ready(fd, deadline)
        else:
            ready = bool(select.select([fd], [], [], wait)[0])
        if not ready:
            raise WireError("timeout", f"no answer within the limit ({len(out)} of {n} bytes)")
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise WireError("eof", "the process closed its end")
        out += chunk
    return bytes(out)


def _spin_ready(fd: int, deadline: float) -> bool:
    """Busy-wait for readability: a sleeping CPU's wake-up would land in a timed wall clock."""
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0)[0]:
            return True
    return False


def recv(fd: int, timeout_s: float | None = None, *, spin: bool = False) -> Any:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    (size,) = struct.unpack(">I", _read_exact(fd, 4, deadline, spin))
    if size > MAX_FRAME:
        raise WireError("protocol", f"frame of {size} bytes")
    return decode(_read_exact(fd, size, deadline, spin))


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether brackets outside strings nest deeper than `limit`, or do not balance, or the
    text has more than MAX_STRINGS strings (no JSON we read has: refused, as the check would
    cost seconds). Escapes go by bulk replace, strings by a linear regular expression; then
    each round deletes the innermost bracket pairs: at most `limit` passes in C, no recursion."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    if text.count(b'"') > 2 * MAX_STRINGS:
        return True
    brackets = _STRING.sub(b"", text).translate(_BRACKETS, _NOT_BRACKET)
    for _ in range(limit):
        if not brackets:
            return False
        inner = brackets.replace(b"()", b"")
        if len(inner) == len(brackets):  # no pair left to delete: unbalanced
            return True
        brackets = inner
    return bool(brackets)


def read_exact(fd: int, n: int, timeout_s: float) -> bytes:
    """Exactly `n` bytes within `timeout_s` (WireError "timeout" or "eof" otherwise)."""
    return _read_exact(fd, n, time.monotonic() + timeout_s, False)


def read_line(fd: int, timeout_s: float, limit: int = 4096) -> bytes:
    """One newline-terminated line (the sandbox's report precedes the framed protocol)."""
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    while not out.endswith(b"\n"):
        if len(out) > limit:
            raise WireError("protocol", "line too long")
        out += _read_exact(fd, 1, deadline, False)
    return bytes(out)


__all__ = [
    "MAX_DEPTH",
    "MAX_FRAME",
    "MAX_LINE",
    "MAX_STRINGS",
    "WireError",
    "decode",
    "encode",
    "json_object",
    "read_exact",
    "read_line",
    "recv",
    "send",
    "too_deep",
]

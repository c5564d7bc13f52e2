"""Framed JSON over pipes between the trusted verify process and its sandboxed children.

Staged beside runner.py; standard library only. A frame is a 4-byte big-endian length and that
many bytes of UTF-8 JSON. The reader is bounded in size, in time and in JSON nesting, because
what a candidate's process sends is hostile input; binary payloads (kernel binaries) travel as
base64 strings inside the JSON.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

MAX_FRAME = 256 << 20
MAX_DEPTH = 64


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
    """A frame's payload (after its length prefix), checked for nesting before it is parsed."""
    if raw.count(b"[") + raw.count(b"{") > 10 * MAX_DEPTH and _depth(raw) > MAX_DEPTH:
        raise WireError("protocol", "nesting too deep")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise WireError("protocol", type(exc).__name__) from None


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


def _depth(raw: bytes) -> int:
    depth = best = 0
    in_str = esc = False
    for b in raw:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:
                esc = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            best = max(best, depth)
        elif b in (0x5D, 0x7D):
            depth -= 1
    return best


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


__all__ = ["MAX_FRAME", "WireError", "decode", "encode", "read_exact", "read_line", "recv", "send"]

"""Crash-safe file writes: atomic replace for documents, fsynced appends for ledgers.

Side of the trust boundary: trusted (the store's own writes). A write that finds no space left
raises DiskFull naming the folder, what is free there and what the write needed (never a bare
OSError), and leaves nothing half-written: a temp file is removed, an append that did not fit
is cut back to where it started.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import DiskFull

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Room a scored run's records need beside its files (ledger line, best pointer, manifest).
RECORD_MARGIN_BYTES = 64 << 10


def free_bytes(path: Path | str) -> int | None:
    """Bytes an unprivileged writer can still use on `path`'s filesystem (its nearest existing
    folder); None when that cannot be told."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full_of(
    exc: BaseException, path: Path | str | None = None, needed_bytes: int | None = None
) -> DiskFull | None:
    """The DiskFull an OSError stands for (ENOSPC, EDQUOT), naming `path` (else the file the
    error names); None for any other error."""
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
        return None
    where = path if path is not None else exc.filename or "?"
    folder = Path(where).parent if path is None and exc.filename else Path(where)
    return DiskFull(folder, needed_bytes=needed_bytes, free_bytes=free_bytes(folder))


@contextmanager
def named_disk_full(path: Path, needed_bytes: int | None = None) -> Iterator[None]:
    """Turn a no-space OSError inside the block into DiskFull naming `path`."""
    try:
        yield
    except OSError as exc:
        full = disk_full_of(exc, path, needed_bytes)
        if full is None:
            raise
        raise full from exc


def require_space(folder: Path, needed_bytes: int) -> None:
    """DiskFull before writing `needed_bytes` (plus RECORD_MARGIN_BYTES) into `folder` when its
    filesystem has less free: a record is written whole or not begun."""
    free = free_bytes(folder)
    need = needed_bytes + RECORD_MARGIN_BYTES
    if free is not None and free < need:
        raise DiskFull(folder, needed_bytes=need, free_bytes=free)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and an atomic rename."""
    with named_disk_full(path.parent, len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def hash_files(files: dict[str, bytes]) -> str:
    """The content hash of named files (relative path -> bytes): a candidate's id, its
    checkpoint's name, what a restore re-checks."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel] + b"\0")
    return h.hexdigest()[:16]


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync, so a crash loses at most the line being written."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    with named_disk_full(path.parent, len(line) + 1):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                # A torn previous line (crash mid-write) must not swallow this record.
                if start > 0 and os.pread(fd, 1, start - 1) != b"\n":
                    line = b"\n" + line
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, start)  # no half a record: the file as it was
                raise
        finally:
            os.close(fd)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield records; lines that do not parse (a torn last line after a crash) are skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                yield rec


__all__ = [
    "NO_SPACE",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "disk_full_of",
    "free_bytes",
    "hash_files",
    "named_disk_full",
    "read_jsonl",
    "require_space",
]

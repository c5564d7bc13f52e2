"""Workspace files are untrusted input: the one way the toolkit reads and writes them.

Side of the trust boundary: this module is the gate. Everything under a workspace root was
written by the agent, so a file there is read only when it is a regular file reached without a
symlink on any component below the root (each component opened with O_NOFOLLOW relative to its
parent's descriptor), with one link (a hard link could name a file anywhere on the filesystem),
under a size limit, as strict UTF-8, and JSON under a nesting-depth and an integer-digit limit.
Writes into the workspace (views, restored files, telemetry) go through the same descriptors,
so a symlinked folder or file never redirects them outside it.

Every refusal is a UsageError naming the file and what to do about it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import DiskFull, HarnesslabError, UsageError
from .storage import free_bytes

STATE = ".harnesslab"  # the workspace's own folder: views, generated sources, telemetry
MAX_FILE_BYTES = 4 << 20  # editable sources, configs, manifests
MAX_JSON_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 40  # a launch parameter or a timeout, never a bignum
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_relative(rel: str, *, what: str = "path") -> PurePosixPath:
    """`rel` as a relative POSIX path with no `..`, no empty or `.` parts, no NUL, no
    backslash: the only form a workspace path may take in a manifest or a task."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        raise UsageError(
            f"{what} {rel!r} is not a relative path.",
            next_step="use a path relative to the workspace root, like 'kernel.py'",
        )
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(p in ("..", ".", "") for p in rel.split("/")):
        raise UsageError(
            f"{what} {rel!r} leaves the workspace (absolute, '..' or empty parts).",
            next_step="use a path relative to the workspace root without '..'",
        )
    return pure


@contextmanager
def _parent_fd(root: Path, rel: PurePosixPath, *, create: bool) -> Iterator[int]:
    """A descriptor of `rel`'s parent folder, every component below `root` opened without
    following a symlink. `create` makes missing folders (0o755, like mkdir -p)."""
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        for part in rel.parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _refusal(root: Path, rel: str, exc: OSError) -> HarnesslabError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull((root / rel).parent, free_bytes=free_bytes(root))
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return UsageError(
            f"{rel} (in {root}) goes through a symlink (or a file where a folder should be): "
            "workspace files must be regular files inside the workspace.",
            next_step=f"replace {rel} (and its folders) with regular files and folders",
        )
    if exc.errno == errno.ENOENT:
        return UsageError(
            f"{rel} is missing in {root}.",
            next_step="restore it with restore_best_checkpoint or `harnesslab init --force`",
        )
    return UsageError(f"{rel} (in {root}) cannot be read: {exc.strerror}.", next_step="fix it")


def _open_regular(root: Path, rel: str, what: str = "") -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file `rel` under `root` (see the module docstring) and
    its stat; UsageError naming the file for anything else (a folder, a FIFO, a link)."""
    pure = check_relative(rel, what=what or "path")
    try:
        with _parent_fd(root, pure, create=False) as parent:
            # O_NONBLOCK: a FIFO planted in place of the file must not hang the server.
            fd = os.open(
                pure.name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=parent,
            )
    except OSError as exc:
        raise _refusal(root, rel, exc) from exc
    try:
        st = os.fstat(fd)
        _check_regular(root, rel, st)  # before any read: a folder opens, then fails to read
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bytes(root: Path, rel: str, *, max_bytes: int = MAX_FILE_BYTES, what: str = "") -> bytes:
    """The bytes of the regular file `rel` under `root` (see the module docstring)."""
    fd, st = _open_regular(root, rel, what)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > max_bytes:
            raise UsageError(
                f"{rel} is {st.st_size} bytes; the limit is {max_bytes}.",
                next_step=f"make {rel} smaller",
            )
        # Read what fstat said (a read(max_bytes) would allocate the whole limit every time),
        # and whatever it grew by since, up to the limit.
        data = fh.read(st.st_size + 1)
        if len(data) > st.st_size:
            data += fh.read(max_bytes + 1 - len(data))
    if len(data) > max_bytes:
        raise UsageError(f"{rel} grew past {max_bytes} bytes.", next_step=f"make {rel} smaller")
    return data


def read_tail(root: Path, rel: str, max_bytes: int) -> bytes:
    """The last `max_bytes` bytes of the regular file `rel` (all of it when smaller), read
    through the same gate as read_bytes: a log read in bounded time however long it grew."""
    fd, st = _open_regular(root, rel)
    with os.fdopen(fd, "rb") as fh:
        fh.seek(max(0, st.st_size - max_bytes))
        return fh.read(max_bytes)


def file_size(root: Path, rel: str) -> int | None:
    """The size of the regular file `rel` reached without symlinks; None when it is missing
    or refused (never raises)."""
    try:
        pure = check_relative(rel)
        with _parent_fd(root, pure, create=False) as parent:
            st = os.stat(pure.name, dir_fd=parent, follow_symlinks=False)
    except (OSError, UsageError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def rename(root: Path, src: str, dst: str) -> None:
    """Rename `src` to `dst`, two names in one folder under `root` (no symlink followed: the
    entries themselves move). A missing `src` is not an error."""
    pure, target = check_relative(src), check_relative(dst)
    if pure.parent != target.parent:
        raise UsageError(f"rename {src} -> {dst}: not in one folder.", next_step="fix the caller")
    try:
        with _parent_fd(root, pure, create=False) as parent:
            os.rename(pure.name, target.name, src_dir_fd=parent, dst_dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _refusal(root, src, exc) from exc


@contextmanager
def locked(root: Path, rel: str) -> Iterator[None]:
    """Hold an exclusive lock (flock) on the lock file `rel` under `root`, created when
    missing, through the same gate as every write."""
    pure = check_relative(rel)
    try:
        with _parent_fd(root, pure, create=True) as parent:
            fd = os.open(
                pure.name,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o644,
                dir_fd=parent,
            )
    except OSError as exc:
        raise _refusal(root, rel, exc) from exc
    try:
        _check_regular(root, rel, os.fstat(fd))
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _check_regular(root: Path, rel: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UsageError(
            f"{rel} (in {root}) is {what}, not a regular file.",
            next_step=f"replace {rel} with a regular file",
        )
    if st.st_nlink > 1:
        raise UsageError(
            f"{rel} (in {root}) has {st.st_nlink} hard links: it may be a file outside the "
            "workspace.",
            next_step=f"replace {rel} with a plain copy (cp, not ln)",
        )


def is_file(root: Path, rel: str) -> bool:
    """Whether `rel` is a regular file reachable without symlinks (never raises)."""
    try:
        pure = check_relative(rel)
        with _parent_fd(root, pure, create=False) as parent:
            st = os.stat(pure.name, dir_fd=parent, follow_symlinks=False)
    except (OSError, UsageError):
        return False
    return stat.S_ISREG(st.st_mode)


def list_dir(root: Path, rel: str) -> list[str]:
    """Names in the folder `rel` under `root`, reached without symlinks; [] when it is missing
    or refused."""
    try:
        pure = check_relative(rel)
        with _parent_fd(root, pure, create=False) as parent:
            fd = os.open(pure.name, _DIR_FLAGS, dir_fd=parent)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)
    except (OSError, UsageError):
        return []


def walk_files(
    root: Path,
    rel: str,
    *,
    skip: frozenset[str] = frozenset(),
    max_files: int = 2000,
    max_bytes: int = 64 << 20,
) -> list[tuple[str, bytes]]:
    """(workspace-relative path, bytes) of every regular file under the folder `rel`, sorted by
    path parts, read through the same gate as read_bytes: a symlink anywhere is refused (a
    UsageError naming it), names in `skip` are left out, counts and sizes are bounded."""
    out: list[tuple[str, bytes]] = []
    total = 0

    def visit(folder: str) -> None:
        nonlocal total
        for name in list_dir(root, folder):
            if name in skip:
                continue
            path = f"{folder}/{name}"
            pure = check_relative(path)
            with _parent_fd(root, pure, create=False) as parent:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                visit(path)
            elif stat.S_ISREG(st.st_mode):
                data = read_bytes(root, path)
                total += len(data)
                out.append((path, data))
                if len(out) > max_files or total > max_bytes:
                    raise UsageError(
                        f"{rel} holds more than {max_files} files or {max_bytes} bytes.",
                        next_step=f"keep {rel} small: sources, tests and a skill",
                    )
            else:
                raise UsageError(
                    f"{path} (in {root}) is a symlink or a special file.",
                    next_step=f"replace {path} with a regular file",
                )

    if not is_dir(root, rel):
        return []
    visit(rel)
    return sorted(out, key=lambda item: PurePosixPath(item[0]).parts)


def is_dir(root: Path, rel: str) -> bool:
    """Whether `rel` is a folder reachable without symlinks (never raises)."""
    try:
        pure = check_relative(rel)
        with _parent_fd(root, pure, create=False) as parent:
            st = os.stat(pure.name, dir_fd=parent, follow_symlinks=False)
    except (OSError, UsageError):
        return False
    return stat.S_ISDIR(st.st_mode)


def read_text(root: Path, rel: str, *, max_bytes: int = MAX_FILE_BYTES, what: str = "") -> str:
    return decode_text(rel, read_bytes(root, rel, max_bytes=max_bytes, what=what))


def decode_text(rel: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{rel}: not UTF-8 text (byte {exc.start}).", next_step=f"save {rel} as UTF-8"
        ) from exc


def json_depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether no array/object nests deeper than `limit` (checked before parsing: the parser
    recurses, and 200000 '[' end in RecursionError)."""
    depth, in_str, escaped = 0, False, False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def parse_json(text: str, *, source: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON: depth and integer-digit limits, no NaN/Infinity. UsageError names `source`."""
    if not json_depth_ok(text, max_depth):
        raise UsageError(
            f"{source}: JSON nested deeper than {max_depth} levels.",
            next_step=f"write {source} as a flat JSON object",
        )

    def big_int(s: str) -> int:
        if len(s.lstrip("-")) > MAX_INT_DIGITS:
            raise ValueError(f"an integer with {len(s)} digits (limit {MAX_INT_DIGITS})")
        return int(s)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_int=big_int, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}).",
            next_step=f'fix {source} (a JSON object such as {{"num_warps": 4}})',
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{source}: {exc}.", next_step=f"fix {source}") from exc


def read_json(
    root: Path, rel: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    data = read_bytes(root, rel, max_bytes=max_bytes)
    return json_of(data, source=rel, max_bytes=max_bytes, max_depth=max_depth)


def json_of(
    data: bytes, *, source: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """`data` (a file's bytes already read: a candidate's snapshot) as strict JSON, within the
    limits read_json applies; UsageError names `source`."""
    if len(data) > max_bytes:
        raise UsageError(
            f"{source} is {len(data)} bytes; the limit is {max_bytes}.",
            next_step=f"make {source} smaller",
        )
    return parse_json(decode_text(source, data), source=source, max_depth=max_depth)


def read_jsonl(root: Path, rel: str, *, max_bytes: int = 64 << 20) -> list[dict[str, Any]]:
    """The JSON-object lines of `rel` (a log such as telemetry); lines that do not parse (a
    torn last line) are skipped; a missing or refused file reads as empty."""
    try:
        text = read_bytes(root, rel, max_bytes=max_bytes).decode("utf-8", errors="replace")
    except UsageError:
        return []
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = parse_json(line, source=rel)
        except UsageError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def write_bytes(
    root: Path, rel: str, data: bytes, *, mode: int = 0o644, fsync: bool = True
) -> None:
    """Atomically replace `rel` under `root` (temp file + rename in the same folder, fsynced
    unless `fsync=False`: a view rebuilt from the store after every change needs no fsync),
    never through a symlink: a symlink in place of the file is replaced, not followed."""
    pure = check_relative(rel)
    try:
        with _parent_fd(root, pure, create=True) as parent:
            tmp = f".{pure.name}.{uuid.uuid4().hex[:8]}.tmp"
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode,
                dir_fd=parent,
            )
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    if fsync:
                        os.fsync(fh.fileno())
                os.replace(tmp, pure.name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except OSError:
                    pass
                raise
    except OSError as exc:
        raise _refusal(root, rel, exc) from exc


def write_text(root: Path, rel: str, text: str) -> None:
    write_bytes(root, rel, text.encode())


def write_json(root: Path, rel: str, obj: Any, *, fsync: bool = True) -> None:
    data = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    write_bytes(root, rel, data.encode(), fsync=fsync)


def append_line(root: Path, rel: str, line: str) -> int:
    """Append one line to `rel` under `root`: no symlink on any component, a regular file with
    one link, created when missing. Not fsynced (telemetry: see tools/state/telemetry.py).
    Returns the file's size after the append."""
    pure = check_relative(rel)
    try:
        with _parent_fd(root, pure, create=True) as parent:
            fd = os.open(
                pure.name,
                os.O_WRONLY
                | os.O_APPEND
                | os.O_CREAT
                | os.O_NOFOLLOW
                | os.O_NONBLOCK
                | os.O_CLOEXEC,
                0o644,
                dir_fd=parent,
            )
    except OSError as exc:
        raise _refusal(root, rel, exc) from exc
    with os.fdopen(fd, "ab") as fh:
        _check_regular(root, rel, os.fstat(fh.fileno()))
        fh.write(line.encode())
        fh.flush()
        return os.fstat(fh.fileno()).st_size


def real_dir(root: Path, rel: str) -> Path:
    """`root/rel`, made a folder when missing, after checking that no component below `root` is
    a symlink (for writers that need a path, like a tree copy): UsageError otherwise."""
    pure = check_relative(rel)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with _parent_fd(root, pure / "x", create=True) as fd:
            os.fstat(fd)
    except OSError as exc:
        raise _refusal(root, rel, exc) from exc
    return root / rel


def inside(root: Path, path: Path) -> str:
    """`path` as a workspace-relative string; UsageError when it is not under `root`."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError as exc:
        raise UsageError(
            f"{path} is outside the workspace {root}.", next_step="use a path inside it"
        ) from exc


__all__ = [
    "MAX_FILE_BYTES",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "STATE",
    "append_line",
    "check_relative",
    "decode_text",
    "file_size",
    "inside",
    "is_dir",
    "is_file",
    "json_depth_ok",
    "json_of",
    "list_dir",
    "locked",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_jsonl",
    "read_tail",
    "read_text",
    "real_dir",
    "rename",
    "walk_files",
    "write_bytes",
    "write_json",
    "write_text",
]

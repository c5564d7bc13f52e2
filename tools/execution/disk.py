"""Free space on an executor's host, and whether a runner's "No space left on device" is the
host's disk or only words.

Side of the trust boundary: trusted (host). A runner's output is written by a process that
imports the candidate, so its words never decide a blame alone: when they speak of a full disk,
the space is measured here (statvfs on this machine, `df` on another host) and only a stage with
less than MIN_STAGE_FREE_BYTES free makes the call an infrastructure fault (DiskFull) instead of
a compile error or a failed run of the candidate.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import DiskFull, ExecutorError
from ..state.storage import free_bytes
from .executor import Executor

NO_SPACE_WORDS = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")
# What a sweep's stage needs free: Triton's cache of its configs and the runners' scratch
# (a compiled config is ~100-500 KiB of cache; 64 MiB holds a 256-config sweep).
MIN_STAGE_FREE_BYTES = 64 << 20


async def host_free_bytes(executor: Executor, path: str) -> int | None:
    """Bytes free at `path` on the executor's host; None when that cannot be told."""
    if executor.on_this_machine:
        return free_bytes(path)
    try:
        res = await executor.run(["df", "-Pk", path], timeout_s=30)
    except ExecutorError:
        return None
    lines = res.stdout.strip().splitlines()
    fields = lines[-1].split() if res.exit_code == 0 and len(lines) >= 2 else []
    return int(fields[3]) * 1024 if len(fields) >= 4 and fields[3].isdigit() else None


def says_no_space(texts: Iterable[str]) -> bool:
    return any(word in text for text in texts for word in NO_SPACE_WORDS)


async def stage_full(executor: Executor, stage: str, texts: Iterable[str]) -> DiskFull | None:
    """DiskFull for the executor's stage when `texts` (a runner's output) speak of a full disk
    and the stage really has less than MIN_STAGE_FREE_BYTES free; None otherwise."""
    if not says_no_space(texts):
        return None
    free = await host_free_bytes(executor, stage)
    if free is None or free >= MIN_STAGE_FREE_BYTES:
        return None
    host = "" if executor.on_this_machine else executor.host
    return DiskFull(stage, needed_bytes=MIN_STAGE_FREE_BYTES, free_bytes=free, host=host)


__all__ = [
    "MIN_STAGE_FREE_BYTES",
    "NO_SPACE_WORDS",
    "host_free_bytes",
    "says_no_space",
    "stage_full",
]

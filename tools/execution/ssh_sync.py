"""The SSH executor's sync_tree: mirror a local folder on the host, only changed files travel.

A sync is two short shell scripts on the host: the state listing (_STATE: the host's manifest
and every file's size and mtime) and, when something differs, the apply (_APPLY: deletions, then
one tar stream whose last member is the new manifest). Both run in one long-lived helper shell
per executor (SyncHelper): a request on its stdin, the reply on its stdout, so a warm call's sync
is one round trip on a channel that is already open, not an SSH exec (a channel open, the exec,
the process-group wrapper's processes: 21-26 ms of a warm run_objective over SSH on an H100
host, issue 30). Every sync still lists the host afresh: a file edited or deleted there travels
again. A helper that is gone (its connection dropped, killed on the host) is dropped and the step
runs as its own command, as before; the next sync starts a new helper.

Side of the trust boundary: trusted (host). The helper runs beside the stage, never inside a
sandbox; nothing a candidate writes reaches its stdin, and its replies are framed by a random
nonce per request that no file on the host can know.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Protocol

import anyio

from ..errors import ExecutorError
from .command_result import CommandResult


class HelperProcess(Protocol):
    """What the helper needs of a long-lived process (ssh.SSHInteractive is one)."""

    def alive(self) -> bool: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def receive_until(self, sep: bytes, max_bytes: int = ...) -> bytes | None: ...

    async def kill(self) -> None: ...


class HelperHost(Protocol):
    """What the helper needs of its executor (ssh.SSHExecutor is one)."""

    host: str

    @property
    def closing(self) -> bool: ...

    def path(self, *parts: str) -> str: ...

    async def start(self, argv: list[str]) -> HelperProcess: ...

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        stdin: bytes | None = None,
    ) -> CommandResult: ...


MANIFEST = ".manifest.json"

# $1: the folder; $2...: top-level folders in it the host writes itself (sync_tree's `skip`:
# sandbox scratch folders, Triton caches, thousands of files after a few sweeps): not listed.
_STATE = r"""{ [ -d "$1" ] || mkdir -p -- "$1"; } && cd -- "$1" || exit 1; shift
[ -f .manifest.json ] && cat .manifest.json; printf '\n@@HL-STAT@@\n'
prune=""; for d in "$@"; do prune="$prune -path ./$d -prune -o"; done
find . $prune -type f ! -path ./.manifest.json -printf '%P\0%s\0%T@\0'"""

# $1: the folder; $2...: files to delete first. The tar comes on stdin.
_APPLY = r"""cd -- "$1" || exit 1; shift
for f in "$@"; do rm -f -- "$f" || exit 1; done
tar -x -p -f - --no-same-owner"""

SCRIPTS = {"state": _STATE, "apply": _APPLY}

# The helper: $1 = a file for each step's stderr. A request is the lines NONCE, OP, N, N
# arguments and SIZE, then SIZE bytes of the step's stdin; the reply is the step's stdout, then
# "\nNONCE STATUS\n", its stderr, "\nNONCE\n". `read` takes a pipe byte by byte and `head -c`
# reads no further than SIZE, so the stream stays in step; an apply that stops early still
# drains its bytes. Each step runs in a subshell (its cd and exit stay there).
_HELPER = (
    "err=$1; trap 'rm -f -- \"$err\"' EXIT\n"
    f"state() (\n{_STATE}\n)\napply() (\n{_APPLY}\n)\n"
    r"""while IFS= read -r nonce && IFS= read -r op && IFS= read -r n; do
  set --
  while [ "$n" -gt 0 ] && IFS= read -r a; do set -- "$@" "$a"; n=$((n - 1)); done
  IFS= read -r size || exit 0
  [ "$op" = apply ] || [ "$size" = 0 ] || head -c "$size" >/dev/null
  case $op in
    apply) head -c "$size" | ( apply "$@"; rc=$?; cat >/dev/null; exit $rc ) 2>"$err" ;;
    state) state "$@" </dev/null 2>"$err" ;;
    *) echo "unknown step $op" >"$err"; (exit 2) ;;
  esac
  rc=$?
  printf '\n%s %s\n' "$nonce" "$rc"
  [ -s "$err" ] && cat -- "$err"
  printf '\n%s\n' "$nonce"
done"""
)
_REPLY_MAX_BYTES = 256 << 20
# A local file's identity for the scan's digest cache: inode, device, size, mtime and ctime (any
# write changes the ctime, which no one sets back). File times tick coarsely (a jiffy): a digest
# is kept only for a file whose ctime is RACY_NS older than the scan, so a write in the same tick
# as a scan's stat is never missed (git's "racy clean" rule).
_Stat = tuple[int, int, int, int, int]
RACY_NS = 2_000_000_000


class SyncHelper:
    """The helper shell of one executor (module docstring). One step at a time."""

    def __init__(self, executor: HelperHost) -> None:
        self._executor = executor
        self._proc: HelperProcess | None = None
        self._lock = anyio.Lock()
        self.digests: dict[Path, dict[Path, tuple[_Stat, str]]] = {}  # _scan's, per local tree

    def channels(self) -> int:
        """Command channels the helper holds now (0 or 1)."""
        return int(self._proc is not None and self._proc.alive())

    async def run(
        self, op: str, args: list[str], *, stdin: bytes = b"", timeout_s: float
    ) -> CommandResult:
        """Run step `op` ("state" or "apply") on the host, in the helper when it can: when it is
        free (a step never waits behind another sync's large apply) and no argument holds a
        newline (a request line per argument); else as a command of its own."""
        if not self._lock.locked() and not any("\n" in a for a in args):
            async with self._lock:
                result = await self._request(op, args, stdin, timeout_s)
            if result is not None:
                return result
        return await self._executor.run(
            ["sh", "-c", SCRIPTS[op], "sh", *args], timeout_s=timeout_s, stdin=stdin or None
        )

    async def _request(
        self, op: str, args: list[str], stdin: bytes, timeout_s: float
    ) -> CommandResult | None:
        """The step's result from the helper; None when there is no helper to ask (it could not
        start, or went away before it replied: the caller runs the step itself)."""
        started = time.perf_counter()
        nonce = uuid.uuid4().hex.encode()
        request = b"\n".join([nonce, op.encode(), b"%d" % len(args),
                              *(a.encode() for a in args), b"%d" % len(stdin)])  # fmt: skip
        try:
            proc = await self._helper()
            if proc is None:
                return None
            with anyio.move_on_after(timeout_s) as scope:
                await proc.send_bytes(request + b"\n" + stdin)
                out = await proc.receive_until(b"\n" + nonce + b" ", _REPLY_MAX_BYTES)
                code = await proc.receive_until(b"\n", 16)
                err = await proc.receive_until(b"\n" + nonce + b"\n", _REPLY_MAX_BYTES)
        except ExecutorError:  # gone before the request reached it, or a garbled reply
            await self.aclose()
            return None
        except BaseException:  # cancelled mid-reply: the stream is out of step
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        argv = ["sh", "-c", SCRIPTS[op], "sh", *args]
        if scope.cancelled_caught:  # killed with its group, as a command past its limit is
            await self.aclose()
            return CommandResult(argv=argv, exit_code=None, stdout="", stderr="",
                                 duration_s=timeout_s, timed_out=True,
                                 host=self._executor.host)  # fmt: skip
        if out is None or err is None or code is None or not code.isdigit():
            await self.aclose()
            return None
        return CommandResult(
            argv=argv,
            exit_code=int(code),
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=time.perf_counter() - started,
            host=self._executor.host,
        )

    async def _helper(self) -> HelperProcess | None:
        if self._proc is not None and not self._proc.alive():
            await self.aclose()
        if self._proc is None and not self._executor.closing:
            err = self._executor.path("run", f"{uuid.uuid4().hex}.sync-err")
            self._proc = await self._executor.start(["sh", "-c", _HELPER, "sh", err])
        return self._proc

    async def aclose(self) -> None:
        """Kill the helper's group (the next step starts a new one)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            await proc.kill()


async def sync_tree(
    helper: SyncHelper,
    local_dir: Path,
    remote_dir: str,
    *,
    skip: Collection[str] = (),
    timeout_s: float = 300.0,
) -> list[str]:
    """SSHExecutor.sync_tree: mirror local_dir's files into remote_dir; only changed files
    travel (one tar stream).

    The host keeps `remote_dir/.manifest.json` (sha256, size, mtime per file sent). A file
    travels when its hash differs from the manifest or the host's copy no longer has the
    recorded size and mtime (edited or deleted there). Files sent earlier and gone locally
    are deleted; files the host created itself (caches, outputs) are left alone, and the
    top-level folders in `skip` are not even listed."""
    host = helper._executor.host
    known = helper.digests.setdefault(local_dir, {})
    local = await anyio.to_thread.run_sync(_scan, local_dir, known)
    local = {rel: v for rel, v in local.items() if rel.split("/", 1)[0] not in skip}
    state = await helper.run("state", [remote_dir, *skip], timeout_s=timeout_s)
    if state.exit_code != 0:
        raise _sync_error(host, remote_dir, state)
    manifest, on_host = _parse_state(state.stdout)
    send = sorted(
        rel
        for rel, (digest, _size, _mtime, _mode) in local.items()
        if (old := manifest.get(rel)) is None
        or old.get("sha256") != digest
        or on_host.get(rel) != (old.get("size"), old.get("mtime"))
    )
    gone = sorted(rel for rel in manifest if rel not in local and rel in on_host)
    if not send and not gone and set(manifest) == set(local):
        return []
    new_manifest = {
        rel: manifest[rel] if rel not in send else {"sha256": d, "size": s, "mtime": m}
        for rel, (d, s, m, _mode) in local.items()
    }
    archive = await anyio.to_thread.run_sync(_tar, local_dir, send, local, new_manifest)
    applied = await helper.run("apply", [remote_dir, *gone], stdin=archive, timeout_s=timeout_s)
    if applied.timed_out or applied.exit_code != 0:
        raise _sync_error(host, remote_dir, applied)
    return send


def _scan(
    root: Path, known: dict[Path, tuple[_Stat, str]] | None = None
) -> dict[str, tuple[str, int, int, int]]:
    """rel path -> (sha256, size, whole-second mtime, mode) for every file under root. `known`
    (path -> (stat, digest), updated to this scan's settled files: RACY_NS) spares re-reading
    a file whose inode, size, mtime and ctime are unchanged: a stage gains files with every
    candidate, and hashing them all cost every call more."""
    import hashlib

    seen: dict[Path, tuple[_Stat, str]] = {}
    settled_ns = time.time_ns() - RACY_NS
    files: dict[str, tuple[str, int, int, int]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path == root / MANIFEST:
            continue
        st = path.stat()
        stat = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = (known or {}).get(path)
        if cached is not None and cached[0] == stat:
            digest = cached[1]
        else:
            sha = hashlib.sha256()
            with path.open("rb") as fh:
                while block := fh.read(1 << 20):
                    sha.update(block)
            digest = sha.hexdigest()
        if st.st_ctime_ns < settled_ns:
            seen[path] = (stat, digest)
        files[path.relative_to(root).as_posix()] = (
            digest,
            st.st_size,
            int(st.st_mtime),
            st.st_mode & 0o777,
        )
    if known is not None:
        known.clear()
        known.update(seen)
    return files


def _tar(root: Path, send: list[str], local: dict, manifest: dict) -> bytes:
    """A tar of the files to send, then the new manifest (last: it lands only if they did)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel in send:
            _digest, size, mtime, mode = local[rel]
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = size, mtime, mode
            with (root / rel).open("rb") as fh:
                tar.addfile(info, fh)
        data = json.dumps({"version": 1, "files": manifest}, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _parse_state(stdout: str) -> tuple[dict[str, dict], dict[str, tuple[int, int]]]:
    head, _, listing = stdout.partition("\n@@HL-STAT@@\n")
    try:
        manifest = json.loads(head)["files"] if head.strip() else {}
        if not isinstance(manifest, dict):
            manifest = {}
    except (ValueError, KeyError, TypeError):
        manifest = {}  # a torn manifest: every file travels again
    fields = listing.split("\0")
    on_host = {}
    for i in range(0, len(fields) - 2, 3):
        on_host[fields[i]] = (int(fields[i + 1]), int(float(fields[i + 2])))
    return manifest, on_host


def _sync_error(host: str, remote_dir: str, result: CommandResult) -> ExecutorError:
    tail = result.stderr_tail()
    if "No space left on device" in result.stderr:
        return ExecutorError(
            f"{host}: disk full while syncing into {remote_dir}.",
            kind="disk_full",
            stderr_tail=tail,
            next_step=f"free space on {host} (df -h {remote_dir}) or move remote_root",
        )
    what = "timed out" if result.timed_out else f"failed (exit {result.exit_code})"
    return ExecutorError(
        f"{host}: sync into {remote_dir} {what}: {tail[-300:]}",
        kind="timeout" if result.timed_out else "remote_env",
        stderr_tail=tail,
        next_step="check that the host has GNU tar and find, and that remote_root is writable",
    )


__all__ = ["MANIFEST", "SyncHelper", "sync_tree"]

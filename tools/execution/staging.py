"""The stage: the one folder (`<state_dir>/stage/`) that carries what the GPU-side runner needs to
every executor. The harness (`harness/`, hash-checked against this package on every call), a
task's reference files (`tasks/<name>/`) and the candidates (`candidates/<scope>/<digest>/`) are
written here, then mirrored to each executor's `stage/` by `Stage.sync` (only changed files
travel; what the host writes itself there is neither sent nor listed).

The launcher, the sweeps' compile pool and command tasks all stage through `Stage`; nothing else
writes the stage.

Side of the trust boundary: trusted. The harness it stages is the installed package's, never
the workspace's; candidates are staged as data, read only by sandboxed runners of their own
workspace (`scope`).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Collection, Iterable
from importlib import resources
from pathlib import Path
from typing import Protocol

import anyio

from ..errors import EnvironmentProblem
from ..gpu import STAGED, TASK, staged_name
from ..state.storage import named_disk_full
from ..task import TaskSpec


class StageTarget(Protocol):
    """What the stage needs of an executor (executor.Executor is one; staging sits below it)."""

    def path(self, *parts: str) -> str: ...

    async def sync_tree(
        self, local_dir: Path, remote_dir: str, *, skip: Collection[str] = ()
    ) -> list[str]: ...


# The harness staged to the GPU host (stage/harness/, flat: each file by its basename): the
# runner, the sandbox every agent-code process runs in, and the guarded verify (gpu/verify/).
RUNNER_FILES = STAGED
HARNESS = "harness"
# Folders of the stage that only the GPU host writes (sandbox scratch, Triton caches): the
# stage's sync neither sends nor lists them.
HOST_WRITTEN = ("scratch", "tcache")


def runner_source(name: str = "runner.py") -> bytes:
    """The installed package's `name` (a path under tools/gpu/, as RUNNER_FILES names it)."""
    return resources.files("harnesslab.tools.gpu").joinpath(*name.split("/")).read_bytes()


def runner_digest(name: str = "runner.py") -> str:
    return hashlib.sha256(runner_source(name)).hexdigest()


def harness_digests() -> dict[str, str]:
    """The staged harness's sha256 by staged name: what the runner checks before it imports."""
    return {staged_name(n): runner_digest(n) for n in RUNNER_FILES}


class Stage:
    """The local stage folder and one sync lock per executor it is mirrored to."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks: dict[int, anyio.Lock] = {}

    def stage_task(self, task: TaskSpec) -> None:
        """The harness (checked against the installed package's hashes) and `task`'s reference
        files, written where they differ. DiskFull when the stage's disk is full."""
        with named_disk_full(self.root):
            self._harness()
            self._task_files(task)

    def _harness(self) -> None:
        (self.root / HARNESS).mkdir(parents=True, exist_ok=True)
        for name in RUNNER_FILES:
            src = runner_source(name)
            target = self.root / HARNESS / staged_name(name)
            if not target.is_file() or target.read_bytes() != src:
                target.write_bytes(src)
            # The pristine runner is what runs: check the staged copy against the package's hash.
            if hashlib.sha256(target.read_bytes()).hexdigest() != runner_digest(name):
                raise EnvironmentProblem(
                    f"staged {name} does not match the installed package.",
                    next_step=f"delete {self.root} and retry",
                )

    def _task_files(self, task: TaskSpec) -> None:
        tdir = self.root / "tasks" / task.name
        tdir.mkdir(parents=True, exist_ok=True)
        for p in task.root.glob("*.py"):
            if p.name != "__init__.py":
                dst = tdir / p.name
                if not dst.is_file() or dst.read_bytes() != p.read_bytes():
                    shutil.copy2(p, dst)
        if task.declare is not None:
            # A declared task's reference: the generic module, reading the checked declaration.
            probe_dims = task.dev_cases[0].shape
            for name, data in (
                ("reference.py", runner_source(TASK[0])),
                ("declaration.json", task.declare.staged_json(probe_dims).encode()),
            ):
                dst = tdir / name
                if not dst.is_file() or dst.read_bytes() != data:
                    dst.write_bytes(data)

    def stage_candidate(self, files: dict[str, bytes], digest: str, scope: str = "") -> str:
        """Stage `files` as candidate `digest` of workspace `scope` (its trusted store's key):
        a sandboxed dev runner reads its own candidate, or its own workspace's, never another
        workspace's (two workspaces may share one state dir). Written whole or not at all.
        Returns the stage-relative path."""
        base = self.root / "candidates" / scope if scope else self.root / "candidates"
        folder = base / digest
        if not folder.is_dir():
            tmp = base / f".{digest}.{uuid.uuid4().hex[:6]}"
            with named_disk_full(self.root, sum(len(b) for b in files.values())):
                try:
                    for rel, data in files.items():
                        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                        (tmp / rel).write_bytes(data)
                except OSError:
                    shutil.rmtree(tmp, ignore_errors=True)  # nothing half-staged stays
                    raise
            try:
                tmp.rename(folder)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # a concurrent call staged it first
        return folder.relative_to(self.root).as_posix()

    async def sync(self, executor: StageTarget) -> None:
        """Mirror the stage to `executor`'s `stage/` (one sync at a time per executor)."""
        lock = self._locks.setdefault(id(executor), anyio.Lock())
        async with lock:
            await executor.sync_tree(self.root, executor.path("stage"), skip=HOST_WRITTEN)

    async def publish(self, task: TaskSpec, executors: Iterable[StageTarget]) -> None:
        """Stage `task` (stage_task) and mirror the stage to every one of `executors`."""
        self.stage_task(task)
        for executor in executors:
            await self.sync(executor)


__all__ = [
    "HARNESS",
    "HOST_WRITTEN",
    "RUNNER_FILES",
    "Stage",
    "harness_digests",
    "runner_digest",
    "runner_source",
]

"""What a sandboxed runner may reach: its policy, its import roots, its staged candidates.

Trusted side (host). The launcher (`Launcher.runner_argv`, `Launcher.sandboxed_argv`) builds every
sandbox it starts through here and `gpu/isolation/sandbox_policy.command()`: the harness, the task's
reference and the runner's own staged candidates readable (the one a fresh run evaluates, or the
workspace a warm worker serves: never another workspace's), the workspace's dev Triton cache and a
private scratch writable, the settings' limits, and the import roots of the interpreter that runs
it, asked of that interpreter once (`ImportRoots`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..gpu.isolation import sandbox_policy as sp
from .executor import Executor

# Triton's cache for the sandboxed runners, one folder per workspace and candidate under it (the
# request's `triton_cache`): the compile pool's workers and the timing worker share it, so a
# sweep's timing run loads what phase 1 compiled. Dev runs only: the guarded verify keeps its
# own per-candidate caches and the trusted side `tcache/_trusted`, both outside this folder.
DEV_TRITON_CACHE = "tcache/dev"
# What a profiler sets for the process it profiles (Nsight Compute/Systems injection).
PROFILER_ENV_PREFIXES = ("NV_", "NVIDIA", "CUDA_INJECTION", "LD_PRELOAD", "NSYS_", "NCU_")
# What a sandboxed runner keeps of the environment (everything else, API keys and agent sockets
# included, stays outside); the launcher sets these for every runner.
RUNNER_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "HARNESSLAB_RUNNER_INTERPRET",
    "HARNESSLAB_WORKER_IDLE_S",
    "PYTHONUNBUFFERED",
    "TRITON_INTERPRET",
)
# Nsight Compute talks to its target through sockets and /dev/shm and finds it by the injection
# variables it sets (NV_NSIGHT_INJECTION_*, NV_TPS_LAUNCH_TOKEN, ...; without them the target
# died with SIGSEGV on an H100): a profiled run keeps Landlock's file rules and the limits but no
# network namespace, no socket filter, and gets those variables
# (benchmarks/ncu_sandbox_matrix.py). It is exec'd in place: ncu's process is the one the
# launcher kills.
PROFILED: dict[str, Any] = {
    "namespaces": False,
    "seccomp": False,
    "fork": False,
    "env_allow_prefixes": list(PROFILER_ENV_PREFIXES),
}


def candidates_of(request: dict[str, Any]) -> tuple[str, str]:
    """(what a fresh runner of `request` may read, what a warm worker serving it may): its
    staged candidate folder, and that folder's workspace ("candidates/<key>")."""
    rel = str(request.get("candidate_dir") or "")
    rel = rel[len("@stage/") :] if rel.startswith("@stage/") else ""
    if not rel.startswith("candidates/"):
        return "candidates", "candidates"
    return rel, os.path.dirname(rel)


def dev_cache_of(candidates: str) -> str:
    """The dev Triton cache a runner reading `candidates` may write: its workspace's."""
    return "/".join([DEV_TRITON_CACHE, *candidates.split("/")[1:2]])


def runner_policy(
    stage: Callable[..., str], task: str, candidates: str, roots: list[str], limits: sp.Limits,
    *, profile: bool,
) -> sp.Policy:  # fmt: skip
    """The sandbox of a runner that imports agent code (`stage(*parts)`: an executor path under
    the stage folder)."""
    dev_cache = stage(*dev_cache_of(candidates).split("/"))
    return sp.Policy(
        read=[stage("harness"), stage("tasks", task), stage(*candidates.split("/"))],
        write=[dev_cache, *(["/dev/shm"] if profile else [])],
        mkdir=[dev_cache],  # made by the sandbox's outer process before it grants it
        scratch_root=stage("scratch"),
        require=False,  # dev runs go on unsandboxed where nothing can be applied; say so
        env_allow=list(RUNNER_ENV),
        limits=limits,
        **sp.python_policy(roots),
        **(PROFILED if profile else {}),
    )


# `python -c ASK_ROOTS <staged sandbox_policy.py>`: that interpreter's import roots, as JSON.
ASK_ROOTS = (
    "import runpy, sys; sys.argv = [sys.argv[1], '--import-roots']; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


class ImportRoots:
    """The import roots of each (executor, interpreter): the runner starts with `-I`, which
    drops PYTHONPATH and the user site, and gets them explicitly (sandbox_policy.BOOT). This
    process's own when the executor runs this interpreter; else that interpreter is asked once,
    in the executor's environment (that is how it was installed)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], list[str]] = {}

    async def of(self, executor: Executor, python: str, policy_py: str) -> list[str]:
        key = (id(executor), python)
        if key not in self._known:
            if executor.on_this_machine and python == sys.executable:
                self._known[key] = sp.import_roots()
            else:
                res = await executor.run([python, "-c", ASK_ROOTS, policy_py], timeout_s=120)
                try:
                    roots = json.loads(res.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError, RecursionError):
                    roots = []
                self._known[key] = [r for r in roots if isinstance(r, str)]
        return self._known[key]


__all__ = [
    "DEV_TRITON_CACHE",
    "PROFILER_ENV_PREFIXES",
    "RUNNER_ENV",
    "ImportRoots",
    "candidates_of",
    "dev_cache_of",
    "runner_policy",
]

"""Guarded verify, trusted parent side: the candidates' processes, their sandbox and their start.

Staged beside guard.py; standard library only (torch is never imported here: prespawn runs
before the runner imports it). Each role (the candidate, and the incumbent when the request has
one) gets a sandboxed process, guard_child.py, started through guard_kid.Kid; on a GPU host the
runner starts them early (prespawn), and guard.Verify.candidate_kid takes them from EARLY or
starts them itself. harden() keeps same-user processes out of this process's memory, before
any child exists. Siblings are imported by the one rule in runner.py's docstring.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import timing
    from ..isolation import sandbox_policy as sp
    from .guard_kid import Kid, stage_root
else:  # the runner that imports this put the staged folder on sys.path
    import sandbox_policy as sp
    import timing
    from guard_kid import Kid, stage_root

HERE = os.path.dirname(os.path.abspath(__file__))
EARLY: dict[str, Kid] = {}  # prespawn's processes, until guard.Verify.candidate_kid takes them


def child_policy(req: dict[str, Any], scratch_root: str, read: list[str], *,
                 env: dict[str, str] | None = None, write: list[str] | None = None,
                 cache: str | None = None, namespaces: bool | list[str] = True) -> sp.Policy:  # fmt: skip
    """A child's sandbox: this folder, `read` and this process's own import roots readable,
    `write` writable, the request's limits."""
    return sp.Policy(
        read=[HERE, *read],
        write=write or [],
        scratch_root=scratch_root,
        require=bool(req.get("sandbox_required", True)),
        env=env or {},
        env_allow=["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"],
        triton_cache=cache or "",
        namespaces=namespaces,
        limits=sp.Limits.from_dict(req.get("sandbox_limits") or {}),
        **sp.python_policy(sp.import_roots()),
    )


def spawn_child(req: dict[str, Any], role: str, cand_dir: str, interpret: bool,
                memfd: int | None) -> Kid:  # fmt: skip
    """A role's sandboxed process (guard_child.py), started; its cfg is sent by guard.Verify.run."""
    scratch_root = os.path.join(stage_root(), "scratch")
    os.makedirs(scratch_root, mode=0o700, exist_ok=True)
    env = {"TRITON_INTERPRET": "1"} if interpret else {}
    cache = None
    write: list[str] = []
    if not interpret:  # per-candidate Triton cache: only this candidate writes it
        cache = os.path.join(stage_root(), "tcache", os.path.basename(cand_dir.rstrip("/")))
        os.makedirs(cache, mode=0o700, exist_ok=True)
        write = [cache]
    policy = child_policy(req, scratch_root, [cand_dir, os.path.dirname(req["reference"])],
                          env=env, write=write, cache=cache)  # fmt: skip
    timeout_s = float(req.get("case_timeout_s", 120))
    kid = Kid(role, "guard_child.py", policy, timeout_s, (memfd,) if memfd else ())
    kid.cand_dir = cand_dir
    return kid


def roles(req: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, folder): the candidate, and the incumbent when the request has one."""
    out = [("candidate", req["candidate_dir"])]
    if req.get("baseline_dir"):
        out.append(("incumbent", req["baseline_dir"]))
    return out


def gpu_present() -> bool:
    """A guess without importing torch (the runner's Env decides): an NVIDIA driver's node."""
    return os.path.exists("/dev/nvidiactl")


def prespawn(req: dict[str, Any]) -> None:
    """On a GPU host, start the roles' sandboxed processes before this runner imports torch:
    their Python start and torch import (guard_child imports it before it reads its cfg) then
    overlap this process's. Nothing of the candidate runs before run() sends "load"; a
    process started for the wrong mode is closed unused (guard.Verify.candidate_kid)."""
    if timing.wants_interpreter(req, gpu_present):  # the runner's rule, without torch
        return
    harden()  # before any child exists
    for role, folder in roles(req):
        EARLY[role] = spawn_child(req, role, folder, False, None)


def harden() -> None:
    """Make this process non-dumpable: same-user processes cannot read its memory through
    /proc/<pid>/mem or open its file descriptors (the sandbox already forbids it to children)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        except (OSError, AttributeError):
            pass


__all__ = ["EARLY", "child_policy", "gpu_present", "harden", "prespawn", "roles", "spawn_child"]

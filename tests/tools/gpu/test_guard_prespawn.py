"""The guarded verify's early start (tools/gpu/verify/guard_spawn.py prespawn): on a GPU host the runner
starts the roles' sandboxed processes before it imports torch, and Verify.candidate_kid takes
them. The rules: nothing starts where no GPU is guessed; a process started for the GPU is used
only by a verify that runs on the GPU, for the folder it was started for; any other is closed
and a fresh one started. Real sandboxed processes (guard_child.py), no GPU needed: the guess is
the only thing the tests replace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harnesslab.tools.gpu.verify import guard, guard_spawn


@pytest.fixture
def req(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setattr(guard_spawn, "stage_root", lambda: str(tmp_path / "stage"))
    monkeypatch.setattr(guard_spawn, "harden", lambda: None)  # the test process stays dumpable
    monkeypatch.delenv("HARNESSLAB_RUNNER_INTERPRET", raising=False)
    for folder in ("cand", "inc", "ref"):
        (tmp_path / folder).mkdir()
    yield {"candidate_dir": str(tmp_path / "cand"), "baseline_dir": str(tmp_path / "inc"),
           "reference": str(tmp_path / "ref" / "reference.py"), "entry": "kernel.py:fn"}  # fmt: skip
    guard.close_all(guard_spawn.EARLY.values())
    guard_spawn.EARLY.clear()


def verify_on(req: dict[str, Any], *, interpret: bool) -> Any:
    """What candidate_kid reads of a Verify: the request, the device the runner found."""
    env = SimpleNamespace(interpret=interpret, device="cpu" if interpret else "cuda")
    return SimpleNamespace(env=env, req=req, ev=SimpleNamespace(ref=None))


def test_without_a_gpu_nothing_starts_early(
    req: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_spawn, "gpu_present", lambda: False)
    guard_spawn.prespawn(req)
    assert guard_spawn.EARLY == {}


def test_on_a_gpu_host_every_role_starts_early_and_a_gpu_verify_takes_it(
    req: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_spawn, "gpu_present", lambda: True)
    guard_spawn.prespawn(req)
    early = dict(guard_spawn.EARLY)
    assert set(early) == {"candidate", "incumbent"}
    assert all(kid.proc.poll() is None for kid in early.values())
    kid = guard.Verify.candidate_kid(
        verify_on(req, interpret=False), "candidate", req["candidate_dir"], None
    )
    try:
        assert kid is early["candidate"] and "candidate" not in guard_spawn.EARLY
        assert kid.cfg["device"] == "cuda" and kid.cfg["candidate_dir"] == req["candidate_dir"]
    finally:
        kid.close()


@pytest.mark.parametrize("why", ["the runner found no GPU", "another folder", "a memfd"])
def test_an_early_process_the_verify_cannot_use_is_closed_and_a_fresh_one_started(
    req: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, why: str
) -> None:
    monkeypatch.setattr(guard_spawn, "gpu_present", lambda: True)
    guard_spawn.prespawn(req)
    early = guard_spawn.EARLY["candidate"]
    folder, memfd = req["candidate_dir"], None
    if why == "another folder":
        folder = str(tmp_path / "inc")
    fd = None
    if why == "a memfd":  # the interpreter's shared arena: only a fresh process gets it
        fd = memfd = os.memfd_create("arena")
    vf = verify_on(req, interpret=why != "another folder" and why != "a memfd")
    try:
        kid = guard.Verify.candidate_kid(vf, "candidate", folder, memfd)
        try:
            assert kid is not early and kid.proc.poll() is None
            assert early.proc.poll() is not None  # the early one was ended, not left running
            assert kid.cand_dir == folder
        finally:
            kid.close()
    finally:
        if fd is not None:
            os.close(fd)

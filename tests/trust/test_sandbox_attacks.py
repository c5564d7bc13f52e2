"""Attacks on the host through the sandbox, run through the toolkit's own paths: the guarded
verify, run_objective (a warm sandboxed runner) and a generated server's custom tool worker.

A candidate that forks without end, allocates 30 GB, fills the disk, ignores the exit frame (so
its sandbox used to be SIGKILLed with its scratch folder left behind), or reads what its sandbox
should hide (its policy in /proc/1/cmdline, /sys, the host's PATH, another workspace's staged
candidate). Each ends in a clean verdict or result, named for what happened (`resource_limit`
with the limit the sandbox's trusted outer process counted), with the launcher still serving and
nothing left on the host. The limits here are small (settings), so no attack costs the machine
much even where it would work.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation.sandbox_policy import Limits
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.meta.custom_host import CustomWorker, WorkerGone
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace
from harnesslab.tools.task.spec import load_task

PROBE = sandbox.probe()
# Each is a guarded verify or a dev run (15-60 s on a loaded 2-core box): the slow tier. The
# same limits and leaks have fast tests at the sandbox's own level
# (tests/tools/integrity/test_sandbox_limits.py).
pytestmark = [
    pytest.mark.skipif(
        PROBE["level"] != "full", reason="no Landlock or namespaces on this machine"
    ),
    pytest.mark.slow,
]
BASELINE = (load_task("rmsnorm_gate").workspace_template / "kernel.py").read_text()
CASE_TIMEOUT_S = 90.0


def attack(body: str, *, at_import: str = "") -> str:
    """The honest baseline whose entry first runs `body` (and, at import, `at_import`)."""
    call = "\n".join("    " + line for line in body.strip().splitlines())
    return (
        f"{BASELINE}\n\n{at_import}\n\n_honest = rmsnorm_gate\n\n\n"
        f"def rmsnorm_gate(x, gate, weight, eps=1e-5):\n{call}\n"
        "    return _honest(x, gate, weight, eps)\n"
    )


def settings_for(tmp_path: Path, **limits: Any) -> Settings:
    return Settings(
        state_dir=tmp_path / "state", case_timeout_s=CASE_TIMEOUT_S, sandbox_memory_mb=1024,
        sandbox_pids=128, sandbox_scratch_mb=64, sandbox_file_mb=16, **limits,
    )  # fmt: skip


def workspace(tmp_path: Path, settings: Settings, source: str, name: str = "ws") -> Workspace:
    ws = init_workspace("rmsnorm_gate", tmp_path / name, settings)
    (ws.root / "kernel.py").write_text(source)
    return ws


def with_launcher(settings: Settings, work: Callable[[Launcher], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(400):
                return await work(launcher)
        finally:
            await launcher.aclose()

    return anyio.run(go)


def codes(verdict) -> set[str]:
    return {r["code"] for r in verdict.reasons}


def needs_cgroup() -> None:
    # Without a cgroup (none here, or root with no delegation) nothing bounds a root sandbox's
    # processes: these attacks would reach the machine that runs the test.
    if PROBE["cgroup"] == "none":
        pytest.skip("this machine lets the sandbox make no cgroup")


FORK_BOMB = """
import os, sys
for _ in range(400):  # bounded here: the pids limit (128) is what must stop it
    try:
        if os.fork() == 0:
            os.execv("/bin/sh", ["sh", "-c", "sleep 600; :", "hl-fork-bomb"])  # small: pids, not memory
    except OSError:
        pass
import time
time.sleep(600)
"""
MEMORY_BOMB = """
held = []
while len(held) < 30 * 16:  # 30 GB in 64 MB pieces, each written
    held.append(bytearray(64 << 20))
"""


def marked(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(int(pid))
        except OSError:
            pass
    return out


def test_a_fork_bomb_in_a_guarded_verify_ends_in_a_clean_verdict_and_the_server_serves(
    tmp_path: Path,
) -> None:
    needs_cgroup()
    settings = settings_for(tmp_path)
    bomb = workspace(tmp_path, settings, attack(FORK_BOMB))
    honest = workspace(tmp_path, settings, BASELINE, "honest")

    async def work(launcher: Launcher) -> tuple[Any, float, Any]:
        started = time.monotonic()
        v = await guarded_verify(bomb, launcher, settings, enforce_scan=False)
        took = time.monotonic() - started
        return v, took, await run_objective(honest, launcher, cases=["1024x1024_fp16"])

    verdict, took, after = with_launcher(settings, work)
    assert verdict.verdict == "rejected" and "resource_limit" in codes(verdict), verdict.reasons
    assert any("pids" in r["detail"] for r in verdict.reasons), verdict.reasons
    assert took < CASE_TIMEOUT_S, took  # the limit ended it, not the case's timeout
    assert after.status == "passed", after.reason  # the same launcher still serves
    assert marked("hl-fork-bomb") == []


def test_a_30_gb_allocation_in_a_guarded_verify_ends_at_the_memory_limit(tmp_path: Path) -> None:
    needs_cgroup()
    settings = settings_for(tmp_path)
    ws = workspace(tmp_path, settings, attack(MEMORY_BOMB))
    started = time.monotonic()
    verdict = with_launcher(
        settings, lambda la: guarded_verify(ws, la, settings, enforce_scan=False)
    )
    assert verdict.verdict == "rejected" and "resource_limit" in codes(verdict), verdict.reasons
    assert any("memory" in r["detail"] for r in verdict.reasons), verdict.reasons
    assert time.monotonic() - started < CASE_TIMEOUT_S


@pytest.mark.parametrize(("bomb", "limit"), [(FORK_BOMB, "pids"), (MEMORY_BOMB, "memory")],
                         ids=["fork_bomb", "memory_bomb"])  # fmt: skip
def test_a_bomb_in_a_dev_run_is_named_and_the_worker_replaced(
    tmp_path: Path, bomb: str, limit: str
) -> None:
    needs_cgroup()
    settings = settings_for(tmp_path)
    bombed = workspace(tmp_path, settings, attack(bomb))
    honest = workspace(tmp_path, settings, BASELINE, "honest")

    async def work(launcher: Launcher) -> tuple[Any, Any]:
        first = await run_objective(bombed, launcher, cases=["1024x1024_fp16"])
        return first, await run_objective(honest, launcher, cases=["1024x1024_fp16"])

    first, after = with_launcher(settings, work)
    assert first.status != "passed" and f"resource_limit: {limit}" in first.reason, first.reason
    assert after.status == "passed", after.reason


def test_a_disk_fill_stays_in_its_bounded_scratch(tmp_path: Path) -> None:
    """Harmless: the kernel writes 20 MB files into its TMPDIR until 300 MB, and gives itself
    away (an error naming what it wrote) if any file or the total got past the limits (16 MB a
    file, 64 MB of scratch, which lives in memory and is gone with the run)."""
    fill = """
import os
d, wrote, big = os.environ["TMPDIR"], 0, []
for i in range(15):
    try:
        with open(f"{d}/fill{i}", "wb") as fh:
            for _ in range(20):
                fh.write(b"x" * (1 << 20))
                wrote += 1 << 20
        big.append(i)
    except OSError:
        pass
if big or wrote > 64 << 20:
    raise RuntimeError(f"wrote {wrote >> 20} MB, whole files {big}")
"""
    settings = settings_for(tmp_path)
    ws = workspace(tmp_path, settings, attack(fill))
    res = with_launcher(settings, lambda la: run_objective(ws, la, cases=["1024x1024_fp16"]))
    assert res.status == "passed", res.reason
    scratch = settings.state_dir / "stage" / "scratch"
    assert sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file()) == 0


def test_a_candidate_that_ignores_the_exit_frame_leaves_no_scratch_behind(tmp_path: Path) -> None:
    """It rebinds os._exit through torch and blocks at exit: its sandbox had to be killed, and a
    killed sandbox used to leave its scratch folder (33 MiB a verify) under the state dir."""
    stubborn = "import atexit, time\ntorch.os._exit = lambda code: None\natexit.register(time.sleep, 600)\n"
    settings = settings_for(tmp_path)
    # Wrong at once (x * 0): the verify stops after its first case and closes the process.
    ws = workspace(tmp_path, settings, attack("x = x * 0", at_import=stubborn))
    verdict = with_launcher(
        settings, lambda la: guarded_verify(ws, la, settings, enforce_scan=False)
    )
    assert verdict.verdict == "rejected", verdict.reasons
    scratch = settings.state_dir / "stage" / "scratch"
    assert [p.name for p in scratch.iterdir()] == []


def test_a_dev_run_sees_no_policy_no_sys_no_host_path_and_no_other_workspace(
    tmp_path: Path,
) -> None:
    """The kernel looks for what its sandbox should hide and raises with what it found: the
    policy on a command line (its grants: the staged candidates folder, the scratch root), /sys
    (no GPU here), the host's PATH, and another workspace's staged candidate (two workspaces
    share the state dir)."""
    spy = """
import glob, os
found = []
for p in glob.glob("/proc/[0-9]*/cmdline"):
    text = open(p, "rb").read().decode(errors="replace")
    if "scratch_root" in text or "candidates" in text:
        found.append("policy in " + p)
for p in ("/sys/class", "/sys/kernel"):
    try:
        os.listdir(p)
        found.append("read " + p)
    except OSError:
        pass
if "HL_HOST_MARKER" in os.environ.get("PATH", ""):
    found.append("host PATH")
for other in OTHER:
    try:
        open(other).read()
        found.append("read " + other)
    except OSError:
        pass
if found:
    raise RuntimeError("; ".join(found))
"""
    settings = settings_for(tmp_path)
    other = workspace(tmp_path, settings, BASELINE + "\n# the other workspace's\n", "other")
    stage, digest = settings.state_dir / "stage" / "candidates", other.candidate_hash()
    paths = [stage / other.store.root.name / digest / "kernel.py", stage / digest / "kernel.py"]
    ws = workspace(tmp_path, settings, attack(spy, at_import=f"OTHER = {list(map(str, paths))!r}"))
    marker = tmp_path / "HL_HOST_MARKER"
    marker.mkdir()
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{marker}:{old_path}"  # what the server's caller had on PATH

    async def work(launcher: Launcher) -> Any:
        await run_objective(other, launcher, cases=["1024x1024_fp16"])  # staged, in its folder
        return await run_objective(ws, launcher, cases=["1024x1024_fp16"])

    try:
        res = with_launcher(settings, work)
    finally:
        os.environ["PATH"] = old_path
    assert any(p.is_file() for p in paths)  # staged where the spy looked
    assert res.status == "passed", res.reason


def test_a_custom_tool_that_allocates_30_gb_ends_at_the_memory_limit(tmp_path: Path) -> None:
    """A generated server's custom tool runs in its sandboxed worker with the same limits; the
    worker that hit one is named for it and replaced at the next call."""
    needs_cgroup()
    bundle, ws = tmp_path / "bundle", tmp_path / "ws"
    bundle.mkdir()
    ws.mkdir()
    (bundle / "tools.py").write_text(
        "async def bomb() -> dict:\n"
        + "".join("    " + line + "\n" for line in MEMORY_BOMB.strip().splitlines())
        + "    return {}\n\n\nasync def fine() -> dict:\n    return {'ok': True}\n"
    )
    worker = CustomWorker(
        bundle=bundle, workspace=ws, python=sys.executable, limits=Limits(memory_mb=512)
    )
    tools = [{"file": "tools.py", "function": "bomb"}, {"file": "tools.py", "function": "fine"}]
    worker.describe(tools)
    assert worker.sandbox["limits"]["by"]["memory"].startswith("cgroup")

    async def calls() -> tuple[str, Any]:
        try:
            with anyio.fail_after(120):
                try:
                    await worker.call("tools.py", "bomb", {})
                    gone = ""
                except WorkerGone as exc:
                    gone = exc.message
                return gone, await worker.call("tools.py", "fine", {})
        finally:
            await worker.aclose()

    gone, after = anyio.run(calls)
    assert "resource_limit: memory" in gone
    assert after == {"ok": True}

"""Helpers shared by test modules (not a conftest: imported explicitly)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace


def make_workspace(tmp_path: Path, task: str = "rmsnorm_gate") -> Workspace:
    return init_workspace(task, tmp_path / "ws", make_settings(tmp_path))


def make_settings(tmp_path: Path, **overrides) -> Settings:
    return Settings(state_dir=tmp_path / "state", **overrides)


def make_launcher(tmp_path: Path, **overrides) -> Launcher:
    return Launcher(make_settings(tmp_path, **overrides))


def verify_step(tmp_path: Path, kernel: str) -> tuple[Workspace, Any]:
    """A decode_step workspace with `kernel` as its kernel.py, and its guarded step verify's
    Verdict (tools/integrity/step_verify.py)."""
    import anyio

    from harnesslab.tools.integrity.step_verify import guarded_step_verify

    ws = make_workspace(tmp_path, "decode_step")
    (ws.root / "kernel.py").write_text(kernel)

    async def go() -> Any:
        launcher = make_launcher(tmp_path)
        try:
            with anyio.fail_after(240):
                return await guarded_step_verify(ws, launcher, make_settings(tmp_path))
        finally:
            await launcher.aclose()

    return ws, anyio.run(go)


def flock_free(path: Path, mode: int) -> bool:
    """Could another open of the lock file at `path` take `mode` (fcntl.LOCK_SH/LOCK_EX) now?"""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# Appended to a candidate's source: at import it tries to write the file `outside` names (a path
# outside its sandbox); the trust tests check the file was never written.
ESCAPE_AT_IMPORT = """

def _escape():
    try:
        with open({outside!r}, "w") as fh:
            fh.write("escaped")
    except OSError:
        pass


_escape()
"""

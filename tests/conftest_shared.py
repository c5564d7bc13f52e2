"""Helpers shared by test modules (not a conftest: imported explicitly)."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace
from harnesslab.tools.task.spec import load_task, tasks_root

# rmsnorm_gate's hidden row range, and the smaller one small_rmsnorm draws from. Its shapes are
# no part of a dev case's name or rows ("192x3000" is in "8192x3000", '"rows": 409' in
# '"rows": 4096'), so the tests that look for hidden shapes in the workspace cannot meet one.
RMSNORM_ROWS = "ranges = { rows = { min = 128, max = 16384 } }"
SMALL_ROWS = "ranges = { rows = { min = 200, max = 383 } }"


def make_workspace(tmp_path: Path, task: str = "rmsnorm_gate") -> Workspace:
    return init_workspace(task, tmp_path / "ws", make_settings(tmp_path))


def make_settings(tmp_path: Path, **overrides) -> Settings:
    return Settings(state_dir=tmp_path / "state", **overrides)


def make_launcher(tmp_path: Path, **overrides) -> Launcher:
    return Launcher(make_settings(tmp_path, **overrides))


def small_rmsnorm(dest: Path, count: int = 2) -> Path:
    """rmsnorm_gate copied to the task folder `dest` as `rmsnorm_small`, whose hidden domain draws
    `count` cases (the task's: 6) of 200-383 rows (the task's: up to 16384). On the Triton
    interpreter a guarded verify's kernel time grows with both; the dims, dtypes, edge inputs,
    tolerances and checks stay the task's, and so does every defense a verify exercises."""
    shutil.copytree(
        tasks_root() / "rmsnorm_gate", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    toml = dest / "task.toml"
    text = toml.read_text()
    assert RMSNORM_ROWS in text and "count = 6" in text, "rmsnorm_gate's [final] changed"
    text = text.replace('name = "rmsnorm_gate"', 'name = "rmsnorm_small"')
    toml.write_text(text.replace(RMSNORM_ROWS, SMALL_ROWS).replace("count = 6", f"count = {count}"))
    final = load_task(dest).final
    assert final is not None and final.count == count
    return dest


def verify_step(tmp_path: Path, kernel: str, ws: Workspace | None = None) -> tuple[Workspace, Any]:
    """A decode_step workspace (`ws`, else a new one) with `kernel` as its kernel.py, and its
    guarded step verify's Verdict (tools/integrity/step_verify.py)."""
    import anyio

    from harnesslab.tools.integrity.step_verify import guarded_step_verify

    ws = ws or make_workspace(tmp_path, "decode_step")
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

"""One run of a new task's baseline against its reference (what `harnesslab task new` and
`import-kernelbench` print): a throwaway workspace and trusted store in a temporary folder, the
dev cases through the ordinary run_objective path (the interpreter without a GPU)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..execution.launcher import build_launcher
from ..settings import Settings
from ..state.workspace import init_workspace
from .objective import run_objective
from .results import EvalResult


async def check_baseline(task_dir: Path, settings: Settings) -> EvalResult:
    """The baseline of the task folder `task_dir` on its dev cases, once, in a scratch store."""
    with tempfile.TemporaryDirectory(prefix="hl-check-") as tmp:
        scratch = settings.model_copy(update={"state_dir": Path(tmp) / "state"})
        ws = init_workspace(task_dir, Path(tmp) / "ws", scratch)
        launcher = build_launcher(scratch)
        try:
            return await run_objective(ws, launcher, warmup=0, repeats=1, save=False)
        finally:
            await launcher.aclose()


__all__ = ["check_baseline"]

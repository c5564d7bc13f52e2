"""Runs of new tasks' baselines against their references (what `harnesslab task new` and
`import-kernelbench` report): a throwaway workspace per task and one trusted store in a temporary
folder, the dev cases through the ordinary run_objective path (the interpreter without a GPU)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import HarnesslabError
from ..evaluation import EvalResult, run_objective
from ..execution import build_launcher
from ..settings import Settings
from ..state import init_workspace


async def check_baselines(task_dirs: list[Path], settings: Settings) -> list[EvalResult | str]:
    """Each task folder's baseline on its dev cases, once, in a scratch store: the result, or
    why the task could not even be evaluated."""
    out: list[EvalResult | str] = []
    with tempfile.TemporaryDirectory(prefix="hl-check-") as tmp:
        scratch = settings.model_copy(update={"state_dir": Path(tmp) / "state"})
        launcher = build_launcher(scratch)
        try:
            for i, task_dir in enumerate(task_dirs):
                try:
                    ws = init_workspace(task_dir, Path(tmp) / f"ws{i}", scratch)
                    out.append(await run_objective(ws, launcher, warmup=0, repeats=1, save=False))
                except HarnesslabError as exc:
                    out.append(exc.message)
        finally:
            await launcher.aclose()
    return out


async def check_baseline(task_dir: Path, settings: Settings) -> EvalResult | str:
    """The baseline of one task folder (check_baselines)."""
    return (await check_baselines([task_dir], settings))[0]


__all__ = ["check_baseline", "check_baselines"]

"""The decode_step guarded verify with and without its replay (issue 32), on one workspace (the
same hidden traces) at task.toml's GPU sizes: for each candidate (the eager baseline, the shipped
Triton solution) and each step.replay setting, the verdict, what it certifies, the score (the sum
of the timed pass's p50 over the three hidden traces), the p50 per trace, the runner's wall and
phases, and with the replay the steps recorded and distinct programs per trace. Each verify is
timed alone (nothing saved, so no incumbent).

    python benchmarks/step_verify_gpu.py [--modes gpu,never] [--candidates eager,triton]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.step_verify import guarded_step_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task import load_task


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="gpu,never")
    ap.add_argument("--candidates", default="eager,triton")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hl-step-verify-"))
    settings = Settings(state_dir=root / "state")
    ws = init_workspace("decode_step", root / "ws", settings)
    sources = {"eager": (ws.root / "kernel.py").read_text(),
               **{k: p.read_text() for k, p in load_task("decode_step").solutions().items()}}  # fmt: skip

    async def go() -> None:
        launcher = Launcher(settings)
        try:
            for name in args.candidates.split(","):
                for mode in args.modes.split(","):
                    (ws.root / "kernel.py").write_text(sources[name] + f"\n# {mode}\n")
                    ws.task.step.replay = mode  # type: ignore[union-attr]
                    t0 = time.perf_counter()
                    v = await guarded_step_verify(ws, launcher, settings, save=False)
                    wall = time.perf_counter() - t0
                    phases = v.evidence.get("runner_phases_s") or {}
                    print(f"{name} replay={mode}: {v.verdict} certifies {v.certifies} score "
                          f"{v.score_us and round(v.score_us, 1)} us; p50 per trace "
                          f"{[c.median_us and round(c.median_us, 1) for c in v.result.cases]}; "
                          f"wall {wall:.1f} s (runner {v.evidence.get('runner_wall_s') or 0:.1f})")  # fmt: skip
                    print("  phases", {k: round(t, 1) for k, t in phases.items()})
                    if v.evidence.get("replay"):
                        print("  replay", v.evidence["replay"])
                    if v.reasons:
                        print("  reasons", v.reasons[:2])
        finally:
            await launcher.aclose()

    anyio.run(go)
    return 0


if __name__ == "__main__":
    sys.exit(main())

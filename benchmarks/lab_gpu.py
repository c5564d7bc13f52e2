"""Kernel lab on a GPU host: every kernel task's strategies over its matrix, ncu on the best
strategy per task, results.json; prints a short table last. Needs only torch and triton (no
harnesslab install): the work is in tools/gpu/lab.py, loaded by path (it loads tools/gpu/runner.py,
the one timing implementation, the same way).

    python benchmarks/lab_gpu.py --out DIR [--tasks a,b] [--quick] [--tune] [--budget-s 330]

Then, on any machine with harnesslab: `harnesslab lab --from-results DIR/results.json --out
docs/lab/DATE` writes report.md, results.csv and the plots.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_hl_lab_gpu", ROOT / "tools" / "gpu" / "lab.py")
lab_gpu = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["_hl_lab_gpu"] = lab_gpu
_spec.loader.exec_module(lab_gpu)  # type: ignore[union-attr]

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--tasks-root" not in argv and "--ncu-target" not in argv:
        # lab.py's default (beside its own folder) fits the staged layout (tools/, tasks/);
        # in the repository it sits in tools/gpu/, and the tasks are at the root.
        argv += ["--tasks-root", str(ROOT / "tasks")]
    sys.exit(lab_gpu.main(argv))

"""Kernel lab on a GPU host: every kernel task's strategies over its matrix, ncu on the best
strategy per task, results.json; prints a short table last. Needs only torch and triton (no
harnesslab install): the work is in tools/gpu/kernel_lab/lab.py, loaded by path from a flat copy
of the lab's files (tools/gpu LAB, as `harnesslab lab` stages them: it loads runner.py, the one
timing implementation, from beside itself).

    python benchmarks/lab_gpu.py --out DIR [--tasks a,b] [--quick] [--tune] [--budget-s 330]

Then, on any machine with harnesslab: `harnesslab lab --from-results DIR/results.json --out
docs/lab/DATE` writes report.md, results.csv and the plots.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tools/gpu/__init__.py needs only pathlib: its LAB list and copy_flat make the staged folder.
_gpu_spec = importlib.util.spec_from_file_location(
    "_hl_gpu", ROOT / "tools" / "gpu" / "__init__.py"
)
_gpu = importlib.util.module_from_spec(_gpu_spec)  # type: ignore[arg-type]
_gpu_spec.loader.exec_module(_gpu)  # type: ignore[union-attr]
FLAT = _gpu.copy_flat(Path(tempfile.mkdtemp(prefix="hl_lab_gpu_")), _gpu.LAB)
_spec = importlib.util.spec_from_file_location("_hl_lab_gpu", FLAT / "lab.py")
lab_gpu = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["_hl_lab_gpu"] = lab_gpu
_spec.loader.exec_module(lab_gpu)  # type: ignore[union-attr]

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--tasks-root" not in argv and "--ncu-target" not in argv:
        # lab.py's default (beside its own folder) fits the staged layout (tools/, tasks/);
        # here it runs from a temporary copy, and the tasks are at the repository's root.
        argv += ["--tasks-root", str(ROOT / "tasks")]
    sys.exit(lab_gpu.main(argv))

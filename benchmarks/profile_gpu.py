"""profile_kernel on a GPU through the tool's own path (tools/evaluation/profiling.py: the
task kind's profiler, ncu under the sandbox for a kernel task), on fresh workspaces of
rmsnorm_gate's Triton and CUDA C++ templates: the case, the main kernel, its time and the
bottleneck line. Local executor; needs ncu on PATH.

    python benchmarks/profile_gpu.py [--case 4096x4096_fp16] [--languages triton,cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

from harnesslab.tools.evaluation.profiling import profile_kernel
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace


async def one(language: str, case: str, tmp: Path) -> int:
    settings = Settings(state_dir=tmp / f"state_{language}")
    ws = init_workspace("rmsnorm_gate", tmp / f"ws_{language}", settings, language=language)
    launcher = Launcher(settings)
    t0 = time.perf_counter()
    try:
        rep = await profile_kernel(ws, launcher, case=case)
    except Exception as exc:  # the tool's own error text is what a user would see
        print(f"{language}: FAILED in {time.perf_counter() - t0:.1f} s: {exc}", flush=True)
        return 1
    finally:
        await launcher.aclose()
    m = rep.main
    print(f"{language}: {rep.case} in {time.perf_counter() - t0:.1f} s, profiler {rep.profiler}, "
          f"main kernel {m.kernel!r} {m.duration_us} us, others {len(rep.others)}; "
          f"{rep.bottleneck}", flush=True)  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="4096x4096_fp16")
    ap.add_argument("--languages", default="triton,cuda")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hl-profile-"))
    failed = 0
    for language in args.languages.split(","):
        failed += anyio.run(one, language, args.case, tmp)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

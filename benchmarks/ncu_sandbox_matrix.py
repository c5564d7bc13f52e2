"""Nsight Compute on a sandboxed target: which part of the sandbox's policy the profiled
process does not survive (profile_kernel's target exited with SIGSEGV on an H100).

    python benchmarks/ncu_sandbox_matrix.py [--json OUT.json]

Each variant runs `ncu ... python tools/gpu/isolation/sandbox.py --policy P -- python -c <one CUDA
op>` (the last one without the sandbox) and prints its exit code, the tails of its output and
whether ncu measured a kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = ROOT / "tools" / "gpu" / "isolation" / "sandbox.py"
TARGET = (
    "import os, torch; print('ENV', sorted(k for k in os.environ if k.startswith(('NV', 'CUDA', "
    "'LD_', 'NSIGHT', 'NCU', 'INJECTION')))); x = torch.ones(1 << 20, device='cuda'); "
    "print('SUM', (x * 2).sum().item())"
)
RUNNER_ENV = ["CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"]


def variants(scratch: str) -> dict[str, dict | None]:
    base = {
        "read": [],
        "scratch_root": scratch,
        "namespaces": False,
        "seccomp": False,
        "fork": False,
        "write": ["/dev/shm"],
        "env_allow": RUNNER_ENV,
    }
    return {
        "as_launcher": base,
        "env_passed": {**base, "env_allow_prefixes": [""]},
        "env_passed_tmp_writable": {
            **base,
            "env_allow_prefixes": [""],
            "write": ["/dev/shm", "/tmp"],
        },
        "no_landlock_env_passed": {**base, "env_allow_prefixes": [""], "landlock": False},
        "forked_reaper_env_passed": {**base, "env_allow_prefixes": [""], "fork": True},
        "unsandboxed": None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    scratch = tempfile.mkdtemp(prefix="ncu-sbx-")
    rows = {}
    for name, policy in variants(scratch).items():
        log = os.path.join(scratch, f"{name}.csv")
        target = [sys.executable, "-c", TARGET]
        if policy is not None:
            target = [sys.executable, str(SANDBOX), "--policy", json.dumps(policy), "--", *target]
        argv = [ncu, "--target-processes", "all", "--metrics", "gpu__time_duration.sum"]
        argv += ["--csv", "--log-file", log, *target]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=90)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
        except OSError as exc:  # no ncu here
            rc, out, err = "not_started", "", str(exc)
        text = Path(log).read_text() if os.path.exists(log) else ""
        rows[name] = {
            "rc": rc,
            "sum_printed": "SUM" in out,
            "kernels_profiled": text.count("gpu__time_duration.sum"),
            "stdout_tail": out[-700:],
            "stderr_tail": err[-600:],
            "ncu_log_tail": text[-300:],
        }
        print(json.dumps({name: rows[name]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

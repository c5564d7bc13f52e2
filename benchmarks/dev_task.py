"""What the runner's timing benchmarks share (agreement_gpu.py, interleave_gpu.py,
timing_phases_gpu.py): a GPU Env or the reason there is none, and a task's dev request and cases
as tools/gpu/runner.py's Evaluator takes them. `runner` is passed in: each script imports it from
the staged layout it measures (timing_phases_gpu.py's --gpu-dir)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cuda_env(runner: Any) -> Any:
    """The runner's Env on the GPU, or None (said on stderr) where there is none."""
    env = runner.Env(interpret=False)
    if env.interpret:
        print("no CUDA GPU here: this benchmark needs one", file=sys.stderr)
        return None
    return env


def dev_request(task: str, entry: str, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(task.toml, an eval request of `entry` with a cap of `repeats` samples a case)."""
    toml = tomllib.loads((ROOT / "tasks" / task / "task.toml").read_text())
    req = {"reference": str(ROOT / "tasks" / task / "reference.py"),
           "tolerances": toml["tolerances"], "seed": 1234, "warmup": 10, "repeats": repeats,
           "case_timeout_s": 600, "entry": entry, "config_file": "kernel_config.json"}  # fmt: skip
    return toml, req


def dev_cases(toml: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": c["name"], "dtype": c["dtype"], "shape": c["shape"]} for c in toml["dev_cases"]
    ]

"""rmsnorm_gate variant 4: variant 2's kernel with half the warps (two 16-byte vectors per
thread and tensor).

fast.py sizes a program so each thread holds one 16-byte vector (8 fp16/bf16 elements) of each
tensor: num_warps = block / 256, 4 at 1024, 8 at 2048, 16 from 4096. Here each thread holds two:
num_warps = block / 512, 2 at 1024, 4 at 2048, 8 at 4096, 16 at 8192 (FLA's autotune space
reaches 2 warps too). The kernel is variant 2's (all loads before the reduction, unmasked
power-of-two rows), loaded from beside this file: only the launch parameters differ.

Prediction: two independent loads in flight per thread and tensor, and smaller programs (more of
them resident per SM, a shorter block-wide reduction) help the launch-bound shapes and the
narrow rows (1024, 1536, 2048); 3000 in a 4096 block is unchanged (8 warps, as fast.py's
half-full rule already gives), and so is 8192 (16 warps in both).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
import triton

_spec = importlib.util.spec_from_file_location(
    "_rmsnorm_gate_v2_early_loads", Path(__file__).with_name("v2_early_loads.py")
)
_v2 = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(_v2)  # type: ignore[union-attr]


def launch_params(dim: int) -> dict[str, int]:
    """Two 16-byte vectors per thread and tensor: num_warps = block / 512, in [2, 16]."""
    block = triton.next_power_of_2(dim)
    return {"block": block, "num_warps": max(2, min(16, block // 512)), "num_stages": 1}


def rmsnorm_gate(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    params = launch_params(x.shape[-1]) | (config or {})
    return _v2.rmsnorm_gate(x, gate, weight, eps, config=params)

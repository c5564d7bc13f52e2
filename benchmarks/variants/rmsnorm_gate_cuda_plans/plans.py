"""The shipped CUDA rmsnorm_gate solution with other launch plans (issue 31), timed beside it by
`benchmarks/cuda_gpu.py --extra`. The solution module is loaded afresh per variant; only its
`plan` or `WARP_ROWS` changes:
- `rmsnorm_gate_t256` / `rmsnorm_gate_t1024`: blocks of at most 256 / 1024 threads for rows that
  take the one-row-per-block variant with 16-byte packs;
- `rmsnorm_gate_rows2` / `rmsnorm_gate_rows8`: 2 / 8 rows (warps) a block for small rows;
- `rmsnorm_gate_blockonly`: small rows too get a block each (no warp-per-row variant).
The solution took two of these after the seventh session's runs (BENCHMARKS.md): 1024 threads
(it had 512: 4096x8192 bf16 read 0.90x Triton) and a block per row from 1024 elements (it had a
warp: 1024x1024 fp16 read 0.77x Triton).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

SOL = Path(__file__).resolve().parents[3] / "tasks/rmsnorm_gate/solutions/cuda_rmsnorm_gate.py"


def _variant(name: str, max_threads: int = 0, warp_rows: int = 0, block_only: bool = False) -> Any:
    spec = importlib.util.spec_from_file_location(f"_cuda_rmsnorm_gate_{name}", SOL)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    shipped = mod.plan
    if warp_rows:
        mod.WARP_ROWS = warp_rows

    def plan(dim: int, vec: int) -> tuple[str, int, tuple[int, int, int]]:
        npack = dim // vec
        if vec != 8 or (npack <= 128 and not block_only) or not (max_threads or block_only):
            return shipped(dim, vec)
        cap = max_threads or 1024
        chunks = 1
        while chunks < 8 and npack > chunks * cap:
            chunks *= 2
        if npack > chunks * cap:
            return shipped(dim, vec)
        threads = -(-npack // chunks)
        return "block", chunks, (-(-threads // 32) * 32, 1, 1)

    mod.plan = plan
    return mod.rmsnorm_gate


rmsnorm_gate_t256 = _variant("t256", max_threads=256)
rmsnorm_gate_t1024 = _variant("t1024", max_threads=1024)
rmsnorm_gate_rows2 = _variant("rows2", warp_rows=2)
rmsnorm_gate_rows8 = _variant("rows8", warp_rows=8)
rmsnorm_gate_blockonly = _variant("blockonly", block_only=True)

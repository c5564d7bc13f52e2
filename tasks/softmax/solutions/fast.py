"""Fast reference solution for softmax: each row read once and written once, fp32 math.

The minimal traffic is one read and one write per element, the same as a copy. What gets there
(the pattern of the well-known fused softmax kernels, e.g. Triton's tutorial and quack):
- The whole row in registers (dim <= MAX_FUSED = 32768): load, max, exp, sum, scale, store, with
  no second read. The baseline's two passes read the row twice (3 transfers instead of 2).
- A tile of several rows per program when rows are narrow (ROWS * BLOCK ~ 4096 elements), so a
  program still moves enough bytes to hide latency; 16 elements per thread (8 warps up to 4096
  elements, 16 from 8192).
- One program per tile for rows up to 16384, a persistent grid without software pipelining for
  rows of 32768. Measured on an H100 (`lab_gpu.py --tune`, 2026-11-21, % of the 3.03 TB/s copy):
  a persistent grid whose row loop is pipelined (num_stages=2, the fused-softmax tutorial's
  shape) lost everywhere below 32768: 4096x4096 fp16 23.9 us (93%) vs 21.6 us (102%) with one
  program per tile; 16384x1024 bf16 22.1 us (100%); 4096x16384 bf16 89.9 us (99%). At 32768 a
  row fills a program's registers (one program per SM fits): persistent, 4 programs per SM, no
  pipelining 97.9 us (91%) vs 103.6 us (86%) pipelined and >= 103 us with one program per row.
- Alignment the compiler can see: dim is passed as dim_units * DIM_ALIGN (DIM_ALIGN constexpr,
  the power of two dividing dim, up to 16), so rows of 3000 still get 16-byte accesses.
- Rows wider than MAX_FUSED take a looped online kernel (running max and sum, then a second
  read that mostly hits L2: a row of 64K fp16 is 128 KiB per program).

Same contract as the workspace's kernel.py. `config` (keyword-only, optional) overrides
num_warps / rows / stages / programs_per_sm / persistent for sweeps.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

MAX_FUSED = 32768
TILE_ELEMENTS = 4096  # rows per program = max(1, TILE_ELEMENTS // BLOCK)
_SM_COUNT: dict[int, int] = {}
# Variants `lab_gpu.py --tune` times (each overrides launch_params for every width).
TUNE_CASES = ["4096x4096_fp16", "16384x1024_bf16", "4096x16384_bf16", "2048x32768_fp16"]
TUNE_SPACE = [
    {"persistent": False},
    {"persistent": True, "stages": 1},
    {"persistent": True, "stages": 2},
    {"persistent": True, "stages": 1, "programs_per_sm": 2},
    {"num_warps": 8},
    {"num_warps": 32},
    {"rows": 1},
]


@triton.jit
def _softmax_fused(
    x_ptr,
    out_ptr,
    n_rows,
    dim_units,
    DIM_ALIGN: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    STAGES: tl.constexpr,
):
    dim = dim_units * DIM_ALIGN  # divisibility by DIM_ALIGN is now visible to the compiler
    cols = tl.arange(0, BLOCK)
    col_mask = cols < dim
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=STAGES):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < n_rows) & col_mask[None, :]
        offs = rows[:, None].to(tl.int64) * dim + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = x - tl.max(x, axis=1)[:, None]
        e = tl.exp(x)
        y = e * (1.0 / tl.sum(e, axis=1))[:, None]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_looped(x_ptr, out_ptr, dim_units, DIM_ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    dim = dim_units * DIM_ALIGN
    row_start = tl.program_id(0).to(tl.int64) * dim
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row_start + cols, mask=cols < dim, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # Lanes still at -inf (padding, masked logits) add 0, not exp(-inf + inf) = NaN.
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        s = s * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    inv = 1.0 / tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(out_ptr + row_start + cols, (tl.exp(x - row_max) * inv).to(out_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip


def dim_align(dim: int) -> int:
    """Largest power of two dividing dim, capped at 16 elements."""
    return min(dim & -dim, 16)


def launch_params(dim: int) -> dict[str, Any]:
    """Tile and launch parameters for rows of `dim` (see the module docstring)."""
    block = triton.next_power_of_2(dim)
    if block > MAX_FUSED:
        return {"looped": True, "block": 4096, "num_warps": 8}
    rows = max(1, TILE_ELEMENTS // block)
    num_warps = max(4, min(16, block * rows // 512))
    return {
        "looped": False,
        "block": block,
        "rows": rows,
        "num_warps": num_warps,
        "stages": 1,
        "persistent": block >= MAX_FUSED,
        "programs_per_sm": max(1, min(8, 64 // num_warps)),
    }


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the Triton CPU interpreter: a few programs so the row loop is exercised
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def softmax(x: torch.Tensor, *, config: dict[str, Any] | None = None) -> torch.Tensor:
    assert x.is_contiguous()
    dim = x.shape[-1]
    n_rows = x.numel() // dim
    out = torch.empty_like(x)
    params = launch_params(dim) | (config or {})
    align = dim_align(dim)
    if params["looped"]:
        _softmax_looped[(n_rows,)](
            x, out, dim // align, DIM_ALIGN=align, BLOCK=params["block"],
            num_warps=params["num_warps"],
        )  # fmt: skip
        return out
    n_tiles = triton.cdiv(n_rows, params["rows"])
    grid = n_tiles
    if params["persistent"]:
        grid = min(n_tiles, _sm_count(x.device) * params["programs_per_sm"])
    _softmax_fused[(grid,)](
        x,
        out,
        n_rows,
        dim // align,
        DIM_ALIGN=align,
        BLOCK=params["block"],
        ROWS=params["rows"],
        STAGES=params["stages"],
        num_warps=params["num_warps"],
    )
    return out

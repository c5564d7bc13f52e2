"""CUDA C++ reference solution for rmsnorm_gate (cuda_rmsnorm_gate.cu, launched through
harnesslab_cuda): the row in registers, 16-byte loads where dim and the pointers allow, one warp
per row for rows under 1024 fp16/bf16 elements, one block per row from 1024 on.

Same contract as the workspace's kernel.py. benchmarks/cuda_gpu.py times it beside the Triton
solution on a GPU host (BENCHMARKS.md; NVRTC compiles it anywhere, running needs a GPU).
`plan` decides everything per shape; the .cu's knobs (cache hints, load order, launch bounds,
persistent rows) are fields of `Plan`, set per shape class where a GPU run measured them better,
and benchmarks/variants/rmsnorm_gate_cuda_plans/plans.py times other plans of this module.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from harnesslab_cuda import aligned, load

CTYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
WARP_ROWS = 4  # rows per block of the warp-per-row variant (4 warps)
# HINTS bits of cuda_rmsnorm_gate.cu (the 16-byte path only).
LOAD_NA, LOAD_EF, STORE_CS, W_EARLY, LOADS_FIRST, BF16_WORDS, GATE_LATE = 1, 2, 4, 8, 16, 32, 64
L2_256 = 128
SMS = 132  # an H100 SXM's SMs: the persistent grid's size where no GPU can be asked
_KERNELS: dict[tuple, object] = {}


class Plan(NamedTuple):
    """One launch: the kernel (`variant` "block", "warp" or "persist"), packs per thread
    (`chunks`; 0: the row does not fit registers and is read twice), the block, and the .cu's
    template knobs: `hints` (bits above), `max_threads` and `min_blocks` (__launch_bounds__;
    0: no minimum, the compiler's choice), and for "persist" the blocks per SM of its grid."""

    variant: str
    chunks: int
    block: tuple[int, int, int]
    hints: int = 0
    max_threads: int = 1024
    min_blocks: int = 0
    per_sm: int = 0


SMALL_ELEMENTS = 1 << 22  # rows * dim up to this: the whole batch in one wave, latency bound


def plan(dim: int, vec: int, rows: int = 0) -> Plan:
    """The launch for rows of `dim` elements moved `vec` at a time (`rows`: the batch, 0 when
    unknown), with the cache hints of its shape class on the 16-byte path. On an H100
    (BENCHMARKS.md, tenth session, benchmarks/rmsnorm_cuda_variants_gpu.py, five repeats a cell):
    - up to SMALL_ELEMENTS, x and gate loaded without L1 allocation and L2 evict-first, the
      output stored streaming (LOAD_NA | LOAD_EF | STORE_CS): 1.04-1.08x the plan without them on
      all eight small shapes (1024x1024 fp16 3.74 -> 3.48 us);
    - above it, bf16 read from the packed words (BF16_WORDS: fp16's register count; in fp16 the
      same machine code): 4096x8192 bf16 65.5 -> 64.4 us; the streaming hints there lost
      0.5-1.6% on 4096x8192 and 8192x3000 and won 2-4% on 4096x4096: not taken;
    - and the weight loaded with x and gate (W_EARLY: no L2 round trip between the reduction and
      the stores, 31-32 registers at 1024 threads): 1.009-1.019x the plan without it on all six
      large shapes, the only plan ahead of FLA and torch.compile on each (eleventh session:
      4096x8192 fp16 63.7 us against FLA's 64.3, bf16 63.6 against 64.5); the 256-byte L2
      prefetch (L2_256) lost 1.1-2.1% there."""
    base = _launch(dim, vec)
    if vec != 8:
        return base
    small = 0 < rows * dim <= SMALL_ELEMENTS
    return base._replace(hints=LOAD_NA | LOAD_EF | STORE_CS if small else BF16_WORDS | W_EARLY)


def _launch(dim: int, vec: int) -> Plan:
    """The kernel, packs per thread and block for rows of `dim` elements."""
    npack = dim // vec
    # A warp per row below 128 packs (1024 elements): at 1024x1024 fp16 a 128-thread block per
    # row took 3.73 us against 4.91 us for four warp-rows a block (H100, BENCHMARKS.md, seventh
    # session); narrower rows were not measured.
    if vec == 8 and npack < 128:
        chunks = 1
        while chunks * 32 < npack:
            chunks *= 2
        return Plan("warp", chunks, (32, WARP_ROWS, 1))
    # Up to 1024 threads a block, one pack each up to 8192 elements: with 512 threads and two
    # packs each, 4096x8192 bf16 ran at 48% warps active (92% in fp16) and took 72.7 us against
    # 65.5 us with 1024 on an H100 (BENCHMARKS.md, seventh session): that kernel takes 50
    # registers in bf16 (32 in fp16), two 512-thread blocks an SM instead of four.
    max_threads = 1024
    chunks = 1
    while chunks < 8 and npack > chunks * max_threads:
        chunks *= 2
    if npack > chunks * max_threads:
        return Plan("block", 0, (1024, 1, 1))
    threads = -(-npack // chunks)
    return Plan("block", chunks, (-(-threads // 32) * 32, 1, 1))


def kernel(
    dtype: torch.dtype,
    vec: int,
    variant: str,
    chunks: int,
    hints: int = 0,
    max_threads: int = 1024,
    min_blocks: int = 0,
):
    key = (dtype, vec, variant, chunks, hints, max_threads, min_blocks)
    if key not in _KERNELS:
        args = f"{CTYPES[dtype]}, {vec}, {chunks}"
        if (hints, max_threads, min_blocks) != (0, 1024, 0):
            args += f", {hints}, {max_threads}, {min_blocks}"
        _KERNELS[key] = load("cuda_rmsnorm_gate.cu", f"rmsnorm_gate_{variant}<{args}>")
    return _KERNELS[key]


def grid_of(p: Plan, rows: int, device: torch.device) -> int:
    if p.variant == "persist":
        sms = SMS
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
        return min(rows, sms * max(1, p.per_sm))
    return -(-rows // p.block[1])


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    assert x.shape == gate.shape and x.is_contiguous() and gate.is_contiguous()
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows == 0:
        return out
    vec = 8 if dim % 8 == 0 and aligned(x, gate, weight, out) else 1
    p = plan(dim, vec, rows)
    k = kernel(x.dtype, vec, p.variant, p.chunks, p.hints, p.max_threads, p.min_blocks)
    k[grid_of(p, rows, x.device), p.block](x, gate, weight, out, rows, dim, eps)
    return out

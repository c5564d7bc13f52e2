"""The shipped CUDA rmsnorm_gate solution with other launch plans (issues 30 and 31). The
solution module is loaded afresh per variant and only its `plan` changes, so every variant is the
shipped .cu with other template arguments (cuda_rmsnorm_gate.py's `Plan`): adopting one is an
edit of `plan`. `VARIANTS` names each with the shape classes it is meant for (`small`: the
whole batch resident in one wave, launch and latency bound; `large`: bandwidth bound);
benchmarks/rmsnorm_cuda_variants_gpu.py times them there beside FLA, Liger and torch.compile.

Measured before (BENCHMARKS.md, seventh session), kept for `benchmarks/cuda_gpu.py --extra`:
`rmsnorm_gate_t256` / `rmsnorm_gate_t1024` (block caps), `rmsnorm_gate_rows2` /
`rmsnorm_gate_rows8` (warp-rows a block), `rmsnorm_gate_blockonly` (no warp-per-row variant).
The solution took 1024 threads and a block per row from 1024 elements after those runs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

SOL = Path(__file__).resolve().parents[3] / "tasks/rmsnorm_gate/solutions/cuda_rmsnorm_gate.py"
SMALL_ELEMENTS = 1 << 22  # rows * dim up to this: the "small" class (every lab/HG small case)


def shape_class(rows: int, dim: int) -> str:
    return "small" if rows * dim <= SMALL_ELEMENTS else "large"


def load_solution(name: str) -> Any:
    """A private copy of the solution module (its own kernel cache, its own `plan`)."""
    spec = importlib.util.spec_from_file_location(f"_cuda_rmsnorm_gate_{name}", SOL)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


# A rule takes the solution module, the shipped Plan of the shape, dim, vec and rows, and returns
# its own Plan, or None where it has nothing to say (the shipped plan then applies).
Rule = Callable[[Any, Any, int, int, int], Any]


def _bits(m: Any, bits: str) -> int:
    return sum(getattr(m, b) for b in bits.split("|") if b)


def _hints(bits: str) -> Rule:
    """The shipped plan with cache-hint / load-order bits added on the 16-byte path."""

    def rule(m: Any, base: Any, dim: int, vec: int, rows: int) -> Any:
        return base._replace(hints=base.hints | _bits(m, bits)) if vec == 8 else None

    return rule


def _without(bits: str) -> Rule:
    """The shipped plan with `bits` taken out on the 16-byte path (a plan before a pick)."""

    def rule(m: Any, base: Any, dim: int, vec: int, rows: int) -> Any:
        return base._replace(hints=base.hints & ~_bits(m, bits)) if vec == 8 else None

    return rule


def _threads(cap: int, min_blocks: int, bits: str = "LOADS_FIRST", over: int = 0) -> Rule:
    """Blocks of at most `cap` threads (more packs each) for rows of more than `over` packs,
    with __launch_bounds__(cap, min_blocks): registers capped at 65536 / (cap * min_blocks)."""

    def rule(m: Any, base: Any, dim: int, vec: int, rows: int) -> Any:
        npack = dim // vec
        if vec != 8 or npack <= over or npack > 8 * cap:
            return None
        chunks = 1
        while npack > chunks * cap:
            chunks *= 2
        threads = -(-npack // chunks)
        return m.Plan(
            "block", chunks, (-(-threads // 32) * 32, 1, 1), _bits(m, bits), cap, min_blocks
        )

    return rule


def _warp(rows_per_block: int, bits: str = "") -> Rule:
    """A warp per row for rows of up to 256 packs (8 packs a lane: 16 spill), `rows_per_block`
    warps a block, launch bounds of that block (the registers the packs need)."""

    def rule(m: Any, base: Any, dim: int, vec: int, rows: int) -> Any:
        npack = dim // vec
        if vec != 8 or npack > 256:
            return None
        chunks = 1
        while chunks * 32 < npack:
            chunks *= 2
        threads = 32 * rows_per_block
        return m.Plan("warp", chunks, (32, rows_per_block, 1), _bits(m, bits), threads, 0)

    return rule


def _persist(bits: str = "") -> Rule:
    """Persistent blocks (one pack a thread, up to 1024 packs): 1024 threads an SM, the weight
    in registers, the next row loaded before this row's reduction. Registers up to 64 (it takes
    56). Its risk is the tail: 4096 rows on 132 blocks are 31.03 rows each, so 4 blocks run a
    32nd row alone (~1/31 of the time at 4096x8192)."""

    def rule(m: Any, base: Any, dim: int, vec: int, rows: int) -> Any:
        npack = dim // vec
        if vec != 8 or npack > 1024 or npack < 128:
            return None
        threads = -(-npack // 32) * 32
        per_sm = max(1, 1024 // threads)
        return m.Plan("persist", 1, (threads, 1, 1), _bits(m, bits), 1024 // per_sm, per_sm, per_sm)

    return rule


class Variant(NamedTuple):
    classes: tuple[str, ...]
    rule: Rule
    why: str


STREAM = "LOAD_NA|LOAD_EF|STORE_CS"
W = "BF16_WORDS"  # bf16 cut from the packed words: fp16's register count (see the .cu)
VARIANTS: dict[str, Variant] = {
    "ldef": Variant(("large",), _hints("LOAD_NA|LOAD_EF"),
                    "x, gate: ld.global.nc.L1::no_allocate + an L2 evict_first policy"),
    "stream": Variant(("small", "large"), _hints(STREAM), "ldef + out: st.global.cs"),
    "words": Variant(("small", "large"), _hints(W),
                     "bf16 from the packed words (fp16: the shipped code, a noise floor)"),
    "t512": Variant(("large",), _threads(512, 4, f"LOADS_FIRST|{W}", over=512),
                    "512 threads x 2 packs, loads first, launch bounds (512, 4): 32 registers"),
    "g256": Variant(("large",), _threads(256, 0, f"LOADS_FIRST|GATE_LATE|{W}", over=256),
                    "256 threads x 4 packs of x, gate late: 32 registers (bf16 at 4 packs: 40;"
                    " bounds (256, 8) spill)"),
    "persist": Variant(("large",), _persist(W), "persistent rows, weight in registers, prefetch"),
    "wlate": Variant(("large",), _without("W_EARLY"),
                     "the large class's plan of the tenth session: the weight after the"
                     " reduction (W_EARLY, shipped in the eleventh, beat it on all six shapes)"),
    "l2pf": Variant(("large",), _hints(f"L2_256|{W}"),
                    "x, gate: ld.global.nc.L2::256B (256-byte DRAM fetches into L2)"),
    "wearly": Variant(("small",), _hints(f"W_EARLY|{W}"), "weight loaded before the reduction"),
    "t128": Variant(("small",), _threads(128, 0, W, over=128), "128-thread blocks, more packs"),
    "t128w": Variant(("small",), _threads(128, 0, f"LOADS_FIRST|W_EARLY|{W}", over=128),
                     "t128 + loads first + weight early"),
    "warp": Variant(("small",), _warp(4, f"W_EARLY|{W}"),
                    "a warp per row up to 2048 elements, 4 a block, weight early"),
}  # fmt: skip


def variant_module(name: str) -> Any:
    """The solution module whose `plan` follows VARIANTS[name] (the shipped plan elsewhere)."""
    mod = load_solution(name)
    shipped, rule = mod.plan, VARIANTS[name].rule

    def plan(dim: int, vec: int, rows: int = 0) -> Any:
        base = shipped(dim, vec, rows)
        return rule(mod, base, dim, vec, rows) or base

    mod.plan = plan
    return mod


# -- measured before (seventh session): block caps and warp-rows, through the same mechanism --


def _legacy(name: str, max_threads: int = 0, warp_rows: int = 0, block_only: bool = False):
    mod = load_solution(name)
    shipped = mod.plan
    if warp_rows:
        mod.WARP_ROWS = warp_rows

    def plan(dim: int, vec: int, rows: int = 0) -> Any:
        npack = dim // vec
        if vec != 8 or (npack <= 128 and not block_only) or not (max_threads or block_only):
            return shipped(dim, vec, rows)
        cap = max_threads or 1024
        chunks = 1
        while chunks < 8 and npack > chunks * cap:
            chunks *= 2
        if npack > chunks * cap:
            return shipped(dim, vec, rows)
        threads = -(-npack // chunks)
        return mod.Plan("block", chunks, (-(-threads // 32) * 32, 1, 1))

    mod.plan = plan
    return mod.rmsnorm_gate


rmsnorm_gate_t256 = _legacy("t256", max_threads=256)
rmsnorm_gate_t1024 = _legacy("t1024", max_threads=1024)
rmsnorm_gate_rows2 = _legacy("rows2", warp_rows=2)
rmsnorm_gate_rows8 = _legacy("rows8", warp_rows=8)
rmsnorm_gate_blockonly = _legacy("blockonly", block_only=True)

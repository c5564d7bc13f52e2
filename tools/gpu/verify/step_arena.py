"""The candidate's State in a step task's guarded verify, in memory the trusted parent
(step_guard.py) allocates and the candidate's sandboxed process (step_child.py) maps: named
tensors (the weights, rotary tables, KV cache, lengths, this step's tokens, a slot for the
logits) at aligned offsets of one buffer, sized for the largest trace, mapped once.

Staged beside step_guard.py (standard library, torch, and on a GPU cudadrv.py through devmem.py).
Trusted code, run on both sides: the parent's views decide, the child's are its State.
- On the CPU (the Triton interpreter): HostArena, a memfd sealed against resizing
  (guard_kid.sealed_memfd), in host memory.
- On a GPU: DeviceArena, device memory shared by descriptor (devmem.DeviceBuffer). The parent
  writes the prompts, poisons the stale slots and reads the logits and the cache in the very
  memory the candidate's step reads and writes: no copy between host and device around a step,
  and nothing the child must do for the poison to reach what its step reads (before, the
  child's own code copied the host arena's cache to its device before each step: a step
  module could patch that copy and never see the poison).
Both hand out the same views (`views`: uint8 slices viewed as each tensor's dtype and shape).
"""

from __future__ import annotations

import math
import mmap
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .devmem import DeviceBuffer
    from .guard_kid import sealed_memfd
else:  # imported from the staged folder on sys.path
    from devmem import DeviceBuffer
    from guard_kid import sealed_memfd

ALIGN = 256


def layout(config) -> tuple[dict[str, dict[str, Any]], int]:
    """name -> {offset, shape, dtype} for one trace's config (reference.py's State, weights
    first), and the bytes it needs."""
    import torch

    c = config
    dt = str(c.torch_dtype).removeprefix("torch.")
    hd, ffn, n = c.head_dim, c.ffn_dim, c.layers
    shapes: dict[str, tuple[list[int], str]] = {
        "w.embed": ([c.vocab, c.hidden], dt),
        "w.attn_norm": ([n, c.hidden], dt),
        "w.wqkv": ([n, c.qkv_dim, c.hidden], dt),
        "w.wo": ([n, c.hidden, c.heads * hd], dt),
        "w.mlp_norm": ([n, c.hidden], dt),
        "w.w_gate_up": ([n, 2 * ffn, c.hidden], dt),
        "w.w_down": ([n, c.hidden, ffn], dt),
        "w.final_norm": ([c.hidden], dt),
        "w.lm_head": ([c.vocab, c.hidden], dt),
        "rope_cos": ([c.max_seq, hd // 2], "float32"),
        "rope_sin": ([c.max_seq, hd // 2], "float32"),
        "kv_cache": ([n, 2, c.batch, c.kv_heads, c.max_seq, hd], dt),
        "lengths": ([c.batch], "int32"),
        "tokens": ([c.batch], "int64"),
        "logits": ([c.batch, c.vocab], dt),
    }
    out, off = {}, 0
    for name, (shape, dtype) in shapes.items():
        out[name] = {"offset": off, "shape": shape, "dtype": dtype}
        off += (math.prod(shape) * getattr(torch, dtype).itemsize + ALIGN - 1) // ALIGN * ALIGN
    return out, off


def views(torch, u8, spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The named tensors of a layout over the uint8 tensor `u8` (its offsets are ALIGN-aligned,
    so each slice views as its dtype)."""
    out = {}
    for name, s in spec.items():
        dtype = getattr(torch, s["dtype"])
        start = int(s["offset"])
        nbytes = math.prod(s["shape"]) * dtype.itemsize
        out[name] = u8[start : start + nbytes].view(dtype).view(*[int(x) for x in s["shape"]])
    return out


class HostArena:
    """The CPU's: a sealed memfd, mapped here (`fd`: its descriptor, the child's to inherit)."""

    def __init__(self, torch, fd: int, size: int) -> None:
        self.torch, self.fd, self.size = torch, fd, size
        self.map = mmap.mmap(fd, size)
        self.u8 = torch.frombuffer(self.map, dtype=torch.uint8)

    @classmethod
    def create(cls, torch, size: int, scratch_root: str) -> HostArena:
        return cls(torch, sealed_memfd(size, scratch_root), size)

    @classmethod
    def mapped(cls, torch, fd: int, size: int) -> HostArena:
        """The child's mapping of the parent's memfd (the descriptor it inherited)."""
        return cls(torch, fd, size)

    def views(self, spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return views(self.torch, self.u8, spec)

    def close(self) -> None:
        del self.u8
        try:
            self.map.close()
        except BufferError:  # views still alive: the process ends soon, the fd goes below
            pass
        os.close(self.fd)


class DeviceArena:
    """A GPU's: device memory this process allocated (`fd`: the child's to inherit) or mapped
    from the parent's descriptor; `size` is the allocation's (the driver's granularity)."""

    def __init__(self, torch, buf: DeviceBuffer) -> None:
        self.torch, self.buf = torch, buf
        self.fd, self.size = buf.fd, buf.nbytes

    @classmethod
    def create(cls, torch, size: int, scratch_root: str) -> DeviceArena:
        return cls(torch, DeviceBuffer.allocate(torch, size))

    @classmethod
    def mapped(cls, torch, fd: int, size: int) -> DeviceArena:
        arena = cls(torch, DeviceBuffer.mapped(torch, fd, size))
        os.close(fd)  # mapped: the memory stays until the mapping goes
        return arena

    def views(self, spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return views(self.torch, self.buf.u8, spec)

    def close(self) -> None:
        self.buf.free()


ARENAS: dict[str, type[HostArena] | type[DeviceArena]] = {"cpu": HostArena, "cuda": DeviceArena}


__all__ = ["ALIGN", "ARENAS", "DeviceArena", "HostArena", "layout", "views"]

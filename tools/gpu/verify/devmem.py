"""Device memory that the trusted parent of a guarded verify allocates and a sandboxed process
maps: allocate, hand over the descriptor, map, view as a torch tensor. One mechanism for the
kernel verify's arenas (guard_gpu.Arena: a replayer's calls) and the step verify's
(step_arena.DeviceArena: a step candidate's State).

Staged beside guard.py (standard library, torch and cudadrv.py). The memory comes from
cuMemCreate with a POSIX file descriptor (cudadrv.Driver.alloc_shareable): legacy IPC handles
did not open on an H100 VM (driver 580), the descriptor works across PID namespaces. It travels
on a socket (SCM_RIGHTS: guard_gpu.Arena.share) or by inheritance (the step child's pass_fds);
the receiver maps it (import_shareable) in its own context. Trusted code, used on both sides:
whatever the receiver does with its mapping (unmap, release) frees nothing of the parent's, whose
allocation lives until the parent frees it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from ..cudadrv import Driver
else:  # imported from the staged folder on sys.path
    from cudadrv import Driver

_DRV: list[Driver] = []


def driver() -> Driver:
    """This process's driver binding, on the device's primary context (the one torch uses)."""
    if not _DRV:
        d = Driver()
        d.init_primary(0)
        _DRV.append(d)
    return _DRV[0]


class CudaArray:
    """Raw device memory as a torch tensor (the CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2,
        }  # fmt: skip


class DeviceBuffer:
    """`nbytes` of shareable device memory (the driver's granularity, rounded up) as the uint8
    tensor `u8`; `fd` its descriptor where this process allocated it (-1 where it mapped
    another's, whose descriptor stays the caller's)."""

    def __init__(self, torch, ptr: int, nbytes: int, handle: Any, fd: int) -> None:
        self.torch, self.ptr, self.nbytes, self.handle, self.fd = torch, ptr, nbytes, handle, fd
        self.u8 = torch.as_tensor(CudaArray(ptr, nbytes), device="cuda")

    @classmethod
    def allocate(cls, torch, nbytes: int) -> DeviceBuffer:
        ptr, size, handle, fd = driver().alloc_shareable(nbytes)
        return cls(torch, ptr, size, handle, fd)

    @classmethod
    def mapped(cls, torch, fd: int, nbytes: int) -> DeviceBuffer:
        """The buffer another process allocated and shared as `fd` (`nbytes`: its size)."""
        ptr, handle = driver().import_shareable(fd, nbytes)
        return cls(torch, ptr, nbytes, handle, -1)

    def free(self) -> None:
        """After the device has finished with it (a synchronize first)."""
        self.torch.cuda.synchronize()
        del self.u8
        if self.fd >= 0:
            os.close(self.fd)
        driver().free_shareable(self.ptr, self.nbytes, self.handle)


__all__ = ["CudaArray", "DeviceBuffer", "driver"]

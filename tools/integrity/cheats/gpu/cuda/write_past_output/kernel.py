"""GPU exploit, CUDA C++: writes past the output. Block 0 also writes 256 bytes after the end of
out (where another buffer of the call, or of the verifier, might live). The replay gives each
role its own arena in its own context with random gaps, and every output and input of the call
is checked: the write lands in a gap (harmless: the output is right), or in a buffer of its own
call, which then fails its own check, or past the mapped memory of the candidate's own
recording process, whose device then faults: the process dies (`candidate_crashed`, as on an
H200: torch.AcceleratorError).

static: pass
gpu: harmless|wrong_output|inputs_modified|candidate_crashed
twin: honest_rows
"""

import torch
from harnesslab_cuda import load

NAMES = ["rmsnorm_gate_row<__half>", "rmsnorm_gate_row<__nv_bfloat16>"]
KERNELS = dict(zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES), strict=True))


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows:
        KERNELS[x.dtype][rows, 256](x, gate, weight, out, dim, eps)
    return out

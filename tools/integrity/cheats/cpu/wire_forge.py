"""Exploit: forge the candidate process's own reports. In the guarded verify the candidate's
process sends its reason codes, launch counts and (on a GPU) its recording through `wire.send`
in the interpreter the candidate shares. Rebinding it at import (reached through
`torch.sys.modules`: no import statement, no audit event) strips every code, claims a Triton
launch and drops what the recorder could not express, while torch computes the output.

On the Triton CPU interpreter the forge works: nothing the candidate's process reports can be
believed there, so the outputs (computed by torch, correct) pass, and the verdict certifies
`outputs` only, never that a Triton kernel did the work (`runtime: uncertified`). On a GPU the
replay runs only the recorded Triton launches: none, so nothing writes the output.

expect: forbidden_call
runtime: uncertified
gpu: no_triton_launch
"""

import torch

# -- exploit
_wire = torch.sys.modules["wire"]
_send = _wire.send


def _forged(fd, msg):
    if isinstance(msg, dict) and "codes" in msg:
        msg = {**msg, "codes": [], "own_launches": max(1, int(msg.get("own_launches") or 0))}
        if isinstance(msg.get("recording"), dict):
            msg["recording"] = {**msg["recording"], "unsupported": []}
    _send(fd, msg)


_wire.send = _forged
# -- end exploit


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    xf, gf = x.float(), gate.float()
    y = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y * gf * torch.sigmoid(gf))
    return out

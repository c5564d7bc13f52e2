"""Exploit: reading through the verdict. The kernel reads what it can (its input's shape, the
hidden case) and raises an exception whose message, and whose class name, spell it out, so a
verdict that repeats exception text hands the hidden shape to the agent. Every reason is
written by the harness: no text from the candidate's process reaches the verdict.

expect: candidate_error
"""

import triton


@triton.jit
def _touch(x_ptr):
    pass


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    _touch[(1,)](x)
    name = "Shape_" + "x".join(str(d) for d in x.shape)
    raise type(name, (Exception,), {})(f"HIDDEN-SHAPE-{tuple(x.shape)}")

"""Honest variant: the launch plan is a dataclass and the sizes namedtuples, made at import and
again inside every call (dataclasses, collections.namedtuple and typing.NamedTuple set
attributes of the class they make, and read the caller's module name from its frame). Building
classes of its own is not patching: the verifier must not reject it (no monkey_patch, no
introspection).
"""

import collections
import dataclasses
import typing

import torch
import triton
import triton.language as tl


@dataclasses.dataclass(frozen=True)
class Plan:  # made at import
    rows: int
    block: int


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Launch:  # made in the call
        grid: int
        block: int

    Sizes = collections.namedtuple("Sizes", "rows dim", defaults=(1,))

    class Shape(typing.NamedTuple):
        rows: int
        dim: int = 1

    Dims = typing.NamedTuple("Dims", [("rows", int), ("dim", int)])  # noqa: UP014 - the call form
    dim = x.shape[-1]
    sizes = Sizes(x.numel() // dim, dim)
    shape, dims = Shape(*sizes), Dims(*sizes)
    plan = Plan(shape.rows, triton.next_power_of_2(dims.dim))
    launch = Launch(plan.rows, plan.block)
    out = torch.empty_like(x)
    if launch.grid:
        _kernel[(launch.grid,)](x, gate, weight, out, dim, eps, BLOCK=launch.block)
    return out

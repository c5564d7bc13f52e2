"""A case: one input's named sizes and dtype (a task's dev case, a drawn hidden case, a step
task's dev trace as the row its result answers). Its own module so that the task kinds
(kinds.py), which spec.py validates a task through, can hand out cases too.

Side of the trust boundary: trusted (task.toml is the operator's; a case's sizes are checked
here before any tensor is allocated).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

DTYPES = ("float16", "bfloat16", "float32")
# A size of a case (rows, dim, m, n, k): positive, and an int32 index (what Triton kernels
# index with), checked where task.toml is parsed, before any tensor is allocated.
MAX_DIM = 2**31 - 1


class Case(BaseModel):
    """One input shape + dtype. `shape` holds the task's named sizes (rows/dim, m/n/k, ...)."""

    name: str
    dtype: str
    shape: dict[str, Annotated[int, Field(ge=1, le=MAX_DIM)]]

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"dtype {v!r} is not one of {', '.join(DTYPES)}")
        return v

    def label(self) -> str:
        return self.name


__all__ = ["DTYPES", "MAX_DIM", "Case"]

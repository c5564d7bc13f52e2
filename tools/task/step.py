"""A step task's `[step]` table: the model's sizes (on a GPU and in the Triton interpreter) and
the dev traces of decode steps run_objective times (tools/gpu/step_trace.py builds and runs them).

    [step]
    model = { hidden = 2048, heads = 32, kv_heads = 8, layers = 16, max_seq = 2048, batch = 8,
              vocab = 32000 }
    interpreter = { hidden = 64, heads = 4, kv_heads = 2, layers = 2, max_seq = 64, batch = 4,
                    vocab = 256 }
    [[step.traces]]
    name = "fixed"
    dtype = "float16"
    kind = "fixed"                     # every sequence: a prompt of `length`, then `steps` steps
    length = 1000
    steps = 128
    interpreter = { length = 20, steps = 6 }   # what differs in the interpreter's sizes

A dynamic trace takes `buckets` (ascending sequence-length bounds, the last at most max_seq),
`steps_per_segment` and `segments_per_bucket`. Every trace is checked against both sizes here,
so a task.toml that the runner could not turn into a trace is refused where it is parsed.

Side of the trust boundary: trusted (task.toml is the operator's, never the agent's).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StepModel(BaseModel):
    """The decoder's sizes (the reference's Config without its dtype): head_dim = hidden/heads."""

    model_config = ConfigDict(extra="forbid")

    # The operator's sizes, never the agent's: positive, the rest is the GPU's memory to judge.
    hidden: int = Field(ge=2)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    layers: int = Field(ge=1)
    max_seq: int = Field(ge=2, description="room for a prompt and a step")
    batch: int = Field(ge=1)
    vocab: int = Field(ge=1)

    @model_validator(mode="after")
    def _split(self) -> StepModel:
        if (
            self.hidden % self.heads
            or self.heads % self.kv_heads
            or (self.hidden // self.heads) % 2
        ):
            raise ValueError(
                f"hidden {self.hidden} must split into {self.heads} heads of an even head_dim, "
                f"and heads into {self.kv_heads} kv_heads"
            )
        return self


TRACE_KEYS = ("length", "steps", "buckets", "steps_per_segment", "segments_per_bucket")


class StepTrace(BaseModel):
    """One dev trace: a name the agent may pass to run_objective, its dtype, and how
    tools/gpu/step_trace.py builds it (fixed_trace or dynamic_trace) at each size."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    dtype: str
    kind: Literal["fixed", "dynamic"]
    seed: int = 0
    length: int | None = Field(default=None, ge=0)
    steps: int | None = Field(default=None, ge=1)
    buckets: list[int] = Field(default_factory=list)
    steps_per_segment: int | None = Field(default=None, ge=1)
    segments_per_bucket: int | None = Field(default=None, ge=1)
    interpreter: dict[str, Any] = Field(
        default_factory=dict, description="what differs at the interpreter's sizes"
    )

    def params(self, interpret: bool) -> dict[str, Any]:
        """The trace's parameters at one size (the interpreter's overrides applied)."""
        out = self.model_dump(include={"name", "dtype", "kind", "seed", *TRACE_KEYS})
        return {**out, **self.interpreter} if interpret else out

    def problems(self, model: StepModel, interpret: bool) -> list[str]:
        """What keeps this trace from being built at `model`'s sizes."""
        p = self.params(interpret)
        where = f"step.traces {self.name!r}{' (interpreter)' if interpret else ''}"
        if self.kind == "fixed":
            if p["length"] is None or p["steps"] is None:
                return [f"{where}: a fixed trace needs length and steps"]
            if p["length"] + p["steps"] > model.max_seq:
                return [f"{where}: length + steps is past max_seq {model.max_seq}"]
        elif not p["buckets"] or p["steps_per_segment"] is None or p["segments_per_bucket"] is None:
            return [
                f"{where}: a dynamic trace needs buckets, steps_per_segment and segments_per_bucket"
            ]
        buckets = p["buckets"] or [model.max_seq]
        if sorted(set(buckets)) != buckets or buckets[-1] > model.max_seq or buckets[0] < 1:
            return [f"{where}: buckets {buckets} must ascend up to max_seq {model.max_seq}"]
        if self.kind == "dynamic":
            steps = p["steps_per_segment"]
            widths = [hi - lo for lo, hi in zip([0, *buckets], buckets, strict=False)]
            if min(widths) < steps:
                return [f"{where}: every bucket of {buckets} must be at least {steps} steps wide"]
        return []


class StepSpec(BaseModel):
    """task.toml `[step]`: the sizes and the dev traces (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    model: StepModel
    interpreter: StepModel = Field(description="the sizes the Triton interpreter (CPU) runs")
    traces: list[StepTrace] = Field(min_length=1)
    replay: Literal["gpu", "always", "never"] = Field(
        "gpu",
        description="the guarded verify's timed pass replays each recorded step in a process "
        "of the harness's (gpu/verify/step_replay.py): on a GPU only (the interpreter's Triton "
        "kernels cannot be recorded), always (steps made of torch operators alone), or never",
    )

    @model_validator(mode="after")
    def _traces(self) -> StepSpec:
        names = [t.name for t in self.traces]
        if len(set(names)) != len(names):
            raise ValueError(f"step.traces: names must differ ({', '.join(names)})")
        for trace in self.traces:
            unknown = set(trace.interpreter) - set(TRACE_KEYS)
            if unknown:
                raise ValueError(
                    f"step.traces {trace.name!r}: interpreter may set {', '.join(TRACE_KEYS)}, "
                    f"not {', '.join(sorted(unknown))}"
                )
            problems = trace.problems(self.model, False) + trace.problems(self.interpreter, True)
            if problems:
                raise ValueError(problems[0])
        return self

    def trace(self, name: str) -> StepTrace:
        for t in self.traces:
            if t.name == name:
                return t
        raise KeyError(name)

    def hidden(self, seed: bytes | str | int) -> list[dict[str, Any]]:
        """The guarded verify's hidden traces, drawn from a secret seed (same seed, same
        traces): one per dev trace, of its kind, dtype and buckets, named `final<i>_<dtype>`,
        with a seed of its own (tokens, prompts, lengths) and, for a fixed trace, a prompt
        length drawn at each size. The runner gets them on stdin; they are never written where
        the agent can read them."""
        rng = random.Random(hashlib.sha256(str(seed).encode()).hexdigest())
        out = []
        for i, trace in enumerate(self.traces):
            drawn = trace.model_copy(deep=True)
            drawn.name, drawn.seed = f"final{i}_{trace.dtype}", rng.randrange(1 << 31)
            if trace.kind == "fixed":
                for model, interpret in ((self.model, False), (self.interpreter, True)):
                    length = rng.randint(0, model.max_seq - trace.params(interpret)["steps"])
                    if interpret:
                        drawn.interpreter = {**drawn.interpreter, "length": length}
                    else:
                        drawn.length = length
            out.append(drawn.model_dump())
        return out

    def request(self, names: list[str] | None = None) -> dict[str, Any]:
        """What the runner's step mode reads: both sizes (it knows whether it interprets) and
        each trace with its interpreter overrides, all of them or `names`."""
        traces = [self.trace(n) for n in names] if names else self.traces
        return {
            "model": self.model.model_dump(),
            "interpreter": self.interpreter.model_dump(),
            "traces": [t.model_dump() for t in traces],
        }


__all__ = ["StepModel", "StepSpec", "StepTrace"]

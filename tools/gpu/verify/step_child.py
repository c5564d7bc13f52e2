"""The candidate's process in the guarded verify of a step task: the only process that imports
the agent's step.

Runs sandboxed (started by step_guard.py through guard_kid.Kid, with nothing secret in its
environment or arguments); standard library, torch and triton only. Nothing it says is evidence:
the parent owns the state in a shared memory arena (a memfd it made and passed at start) and
checks everything that matters there.
- "trace": the State the candidate's step gets, built over the arena. On the CPU its tensors
  ARE views of the arena: the parent writes prompts, poisons stale slots and reads the cache in
  place. On a GPU the weights and rotary tables are copied to the device once per trace, and
  the cache and lengths are copied from the arena before each step and back after it.
- "step": this step's tokens from the arena, `step(state, tokens)` called, the logits copied
  into the parent's slot when they are a plain tensor of the slot's shape and dtype. The parent
  compares them (and the cache after each pass) with the reference it computed itself.
- The timed pass (step_timed.py): the State stays resident on its device between steps.
  "push" copies the arena's cache and lengths to the device (a segment's prompts and poison),
  "pull" copies them back (after a whole-device synchronize), both untimed; "timed_step" is
  "step" without the cache's copies: the tokens to the device, the step, the logits into the
  slot, the lengths advanced (the harness's part of a step, on this process's own handle), the
  device synchronised, the reply. The parent's clock runs from its request to that reply. On
  a GPU the process then waits for the next request awake (a busy wait of at most 10 ms), as
  the parent waits for the reply. On the CPU the State's tensors are the arena's views, so push
  and pull copy nothing there.
Replies carry facts (copied or not, an exception's type name), never text the candidate wrote.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import select
import sys
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its siblings

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import wire
    from .guard_child import child_main, exception_kind, serve_ops
else:
    import wire
    from guard_child import child_main, exception_kind, serve_ops


def _load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class StepChild:
    def __init__(self, cfg: dict[str, Any], out: int) -> None:
        import torch

        self.torch, self.cfg, self.out = torch, cfg, out
        self.cuda = cfg.get("device") == "cuda"
        if not self.cuda:  # tiny tensors: one thread (step_trace.run_trace says why)
            torch.set_num_threads(1)
        self.arena: mmap.mmap | None = None
        self.fn: Any = None
        self.ref: Any = None
        self.state: Any = None
        self.views: dict[str, Any] = {}
        self.device_cache: Any = None  # the GPU path's own handle (the candidate may rebind)
        self.device_lengths: Any = None
        self.fd_in = 0

    def reply(self, **fields: Any) -> None:
        wire.send(self.out, fields)

    def view(self, spec: dict[str, Any]) -> Any:
        torch = self.torch
        numel = 1
        for s in spec["shape"]:
            numel *= int(s)
        assert self.arena is not None
        t = torch.frombuffer(self.arena, dtype=getattr(torch, spec["dtype"]), count=numel,
                             offset=int(spec["offset"]))  # fmt: skip
        return t.view(*[int(s) for s in spec["shape"]])

    # -- requests --------------------------------------------------------------------------------
    def load(self, msg: dict[str, Any]) -> None:
        error = ""
        try:
            self.ref = _load(self.cfg["reference"], "_hl_step_reference")
            file_name, func = self.cfg["entry"].split(":", 1)
            path = os.path.join(self.cfg["candidate_dir"], file_name)
            self.fn = getattr(_load(path, "_hl_candidate"), func, None)
            if not callable(self.fn):
                error = "no_entry"
        except BaseException as exc:  # the candidate's import failing is a result, not a crash
            error = exception_kind(exc)
        self.reply(ok=not error, error=error)

    def map_arena(self, msg: dict[str, Any]) -> None:
        self.arena = mmap.mmap(int(self.cfg["memfd"]), int(msg["size"]))
        self.reply(ok=True)

    def trace(self, msg: dict[str, Any]) -> None:
        """A fresh State for one trace (its scratch, the candidate's graphs, start empty)."""
        torch, ref = self.torch, self.ref
        self.views = {name: self.view(spec) for name, spec in msg["layout"].items()}
        dev = "cuda" if self.cuda else "cpu"

        def mine(name: str) -> Any:
            return self.views[name].to(dev, copy=True) if self.cuda else self.views[name]

        config = ref.Config(**msg["config"])
        weights = {k[len("w.") :]: mine(k) for k in self.views if k.startswith("w.")}
        self.state = ref.State(
            config=config, weights=weights, kv_cache=mine("kv_cache"), lengths=mine("lengths"),
            host_lengths=[0] * config.batch, rope_cos=mine("rope_cos"), rope_sin=mine("rope_sin"),
        )  # fmt: skip
        self.device_cache, self.device_lengths = self.state.kv_cache, self.state.lengths
        if self.cuda:
            torch.cuda.synchronize()
        self.reply(ok=True)

    def run_step(self, msg: dict[str, Any]) -> tuple[str, bool]:
        """`step(state, tokens)` on this step's tokens (the arena's), its logits copied into the
        parent's slot when they are a plain tensor of the slot's shape and dtype: (the
        exception's type name or "", whether they were copied)."""
        torch, state, views = self.torch, self.state, self.views
        state.host_lengths = [int(n) for n in msg["host_lengths"]]
        tokens = views["tokens"].to("cuda" if self.cuda else "cpu", copy=True)
        try:
            out = self.fn(state, tokens)
            slot = views["logits"]
            if type(out) is torch.Tensor and out.shape == slot.shape and out.dtype == slot.dtype:
                slot.copy_(out)
                return "", True
            return "", False
        except BaseException as exc:
            return exception_kind(exc), False

    def step(self, msg: dict[str, Any]) -> None:
        if self.cuda:  # the parent's prompts and poison, then back after the step
            self.push_state()
        error, copied = self.run_step(msg)
        if self.cuda and not error:
            error = self.synchronize()
        if self.cuda:
            self.pull_state()
        self.reply(error=error, copied=copied)

    def timed_step(self, msg: dict[str, Any]) -> None:
        error, copied = self.run_step(msg)
        if not error:
            self.device_lengths += 1  # reference.advance's device half, on the harness's handle
            if self.cuda:
                error = self.synchronize()
        self.reply(error=error, copied=copied)
        if self.cuda and msg.get("more"):  # the segment's next request comes at once: wait for
            self.spin_for_request()  # it awake, so a step's time has no wake-up in it

    def spin_for_request(self, limit_s: float = 1.0) -> None:
        """Busy-wait (at most `limit_s`) until the parent's next request is readable."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not select.select([self.fd_in], [], [], 0)[0]:
            pass

    def synchronize(self) -> str:
        try:
            self.torch.cuda.synchronize()
        except BaseException as exc:  # the candidate's kernel faulted
            return exception_kind(exc)
        return ""

    def push_state(self) -> None:
        self.device_cache.copy_(self.views["kv_cache"])
        self.device_lengths.copy_(self.views["lengths"])

    def pull_state(self) -> None:
        self.views["kv_cache"].copy_(self.device_cache)
        self.views["lengths"].copy_(self.device_lengths)

    def push(self, msg: dict[str, Any]) -> None:
        if self.cuda:
            self.push_state()
        self.reply(error=self.synchronize() if self.cuda else "")

    def pull(self, msg: dict[str, Any]) -> None:
        error = self.synchronize() if self.cuda else ""
        if self.cuda and not error:
            self.pull_state()  # into host memory: the copy has finished when it returns
        self.reply(error=error)

    def serve(self, fd_in: int) -> None:
        self.fd_in = fd_in
        serve_ops(fd_in, {"load": self.load, "arena": self.map_arena, "trace": self.trace,
                          "step": self.step, "push": self.push, "pull": self.pull,
                          "timed_step": self.timed_step})  # fmt: skip


def main() -> int:
    return child_main(StepChild)


if __name__ == "__main__":
    sys.exit(main())

"""The candidate's process in the guarded verify of a step task: the only process that imports
the agent's step.

Runs sandboxed (started by step_guard.py through guard_kid.Kid, with nothing secret in its
environment or arguments); standard library, torch and triton (and cudadrv.py on a GPU). Nothing
it says is evidence: the parent owns the State in a shared arena (step_arena.py: a memfd on the
CPU, device memory on a GPU; its descriptor passed at start) and checks everything that matters
there.
- "arena": the parent's arena mapped (step_arena.ARENAS: host memory on the CPU, the parent's
  device memory on a GPU).
- "trace": the State the candidate's step gets: its tensors ARE the arena's views, on every
  device. The parent writes prompts, poisons stale slots and reads the logits and the cache in
  place; nothing is copied between the processes, and nothing of this process stands between
  the parent's poison and what the step reads.
- "step": `step(state, tokens)` on this step's tokens (a copy of the arena's), the logits copied
  into the parent's slot when they are a plain tensor of the slot's shape and dtype, the device
  synchronised (a fault is the step's error). The parent compares them (and the cache after
  each pass) with the reference it computed itself.
- The timed pass (step_timed.py): "timed_step" is "step" with the lengths advanced after it
  (the harness's part of a step, on this process's own handle on the arena's lengths), the
  device synchronised, the reply. On a GPU the process then waits for the next request awake (a
  busy wait of at most 10 ms), as the parent waits for the reply.
Replies carry facts (copied or not, an exception's type name), never text the candidate wrote.
"""

from __future__ import annotations

import importlib.util
import os
import select
import sys
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its siblings

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import wire
    from .guard_child import child_main, exception_kind, serve_ops
    from .step_arena import ARENAS
    from .step_record import StepRecorder
else:
    import wire
    from guard_child import child_main, exception_kind, serve_ops
    from step_arena import ARENAS
    from step_record import StepRecorder


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
        self.arena: Any = None
        self.fn: Any = None
        self.ref: Any = None
        self.state: Any = None
        self.views: dict[str, Any] = {}
        self.fd_in = 0
        self.recording: dict[str, Any] | None = None
        # The step verify's replay (step_replay.py) needs recordings: the recorder is built
        # before the candidate's module is imported (on a GPU it sees Triton load each kernel).
        self.recorder = StepRecorder(torch, "cuda" if self.cuda else "cpu") if cfg.get(
            "record") else None  # fmt: skip

    def reply(self, **fields: Any) -> None:
        wire.send(self.out, fields)

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
        arena = ARENAS["cuda" if self.cuda else "cpu"]
        self.arena = arena.mapped(self.torch, int(self.cfg["memfd"]), int(msg["size"]))
        self.reply(ok=True)

    def trace(self, msg: dict[str, Any]) -> None:
        """A fresh State for one trace (its scratch, the candidate's graphs, start empty)."""
        ref = self.ref
        views = self.views = self.arena.views(msg["layout"])
        config = ref.Config(**msg["config"])
        self.state = ref.State(
            config=config, weights={k[len("w.") :]: t for k, t in views.items() if k[:2] == "w."},
            kv_cache=views["kv_cache"], lengths=views["lengths"], host_lengths=[0] * config.batch,
            rope_cos=views["rope_cos"], rope_sin=views["rope_sin"],
        )  # fmt: skip
        self.reply(ok=True)

    def run_step(self, msg: dict[str, Any]) -> tuple[str, bool]:
        """`step(state, tokens)` on this step's tokens (the arena's), its logits copied into the
        parent's slot when they are a plain tensor of the slot's shape and dtype: (the
        exception's type name or "", whether they were copied). With msg["record"] the step
        runs under the recorder (self.recording: what it recorded)."""
        torch, state, views = self.torch, self.state, self.views
        state.host_lengths = [int(n) for n in msg["host_lengths"]]
        tokens = views["tokens"].clone()
        try:
            if msg.get("record") and self.recorder is not None:
                self.recording = None
                out, self.recording = self.recorder.record(self.fn, state, tokens,
                                                           views["logits"])  # fmt: skip
            else:
                out = self.fn(state, tokens)
            slot = views["logits"]
            if type(out) is torch.Tensor and out.shape == slot.shape and out.dtype == slot.dtype:
                slot.copy_(out)
                return "", True
            return "", False
        except BaseException as exc:
            return exception_kind(exc), False

    def step(self, msg: dict[str, Any]) -> None:
        self.recording = None
        error, copied = self.run_step(msg)
        if self.cuda and not error:
            error = self.synchronize()
        if msg.get("record"):  # the recording travels with the reply (step_schema checks it)
            self.reply(error=error, copied=copied, recording=self.recording)
        else:
            self.reply(error=error, copied=copied)

    def timed_step(self, msg: dict[str, Any]) -> None:
        error, copied = self.run_step(msg)
        if not error:
            self.views["lengths"] += 1  # reference.advance's device half, on the harness's handle
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

    def serve(self, fd_in: int) -> None:
        self.fd_in = fd_in
        serve_ops(fd_in, {"load": self.load, "arena": self.map_arena, "trace": self.trace,
                          "step": self.step, "timed_step": self.timed_step})  # fmt: skip


def main() -> int:
    return child_main(StepChild)


if __name__ == "__main__":
    sys.exit(main())

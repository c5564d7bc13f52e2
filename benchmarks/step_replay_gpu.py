"""The step verify's record and replay on a GPU, in one process and without the sandbox (issue 32):
for the decode_step eager baseline and the shipped Triton solution at task.toml's GPU sizes,
record one step (step_record.StepRecorder), check the recording (step_schema.validate), replay it
as step_replay.StepReplay does (its program captured as a CUDA graph) on other tokens, and
compare the replay's logits with the reference's. Prints per candidate: operator calls and
launches recorded, what the recorder could not record, the seconds to record, check and capture,
the replay's max error, and the median (p10-p90) of 200 graph replays against the candidate's
own step (its graphs, when it has them) timed the same way (CUDA events around each call).

    python benchmarks/step_replay_gpu.py [--length 1000] [--reps 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harnesslab.tools.gpu import copy_flat
from harnesslab.tools.task import load_task

STAGE = Path(tempfile.mkdtemp(prefix="hl-step-replay-"))
copy_flat(STAGE)
sys.path.insert(0, str(STAGE))

import step_arena  # noqa: E402
import step_record  # noqa: E402
import step_replay  # noqa: E402
import step_schema  # noqa: E402


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def timed(fn, reps: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"{statistics.median(xs):.1f} us (p10-p90 {q[0]:.1f}-{q[-1]:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    task = load_task("decode_step")
    recorder = step_record.StepRecorder(torch, "cuda")  # before any kernel compiles
    ref = load(task.root / "reference.py", "_ref")
    sizes = task.step.model.model_dump()  # type: ignore[union-attr]
    config = ref.Config(**sizes, dtype="float16")
    truth = ref.new_state(config, seed=1, device="cuda")
    layout, size = step_arena.layout(config)
    u8 = torch.zeros(size + step_arena.ALIGN, dtype=torch.uint8, device="cuda")
    views = step_arena.views(torch, u8, layout)
    for name, w in truth.weights.items():
        views[f"w.{name}"].copy_(w)
    views["rope_cos"].copy_(truth.rope_cos)
    views["rope_sin"].copy_(truth.rope_sin)
    state = ref.State(
        config=config, weights={k[2:]: t for k, t in views.items() if k[:2] == "w."},
        kv_cache=views["kv_cache"], lengths=views["lengths"], host_lengths=[0] * config.batch,
        rope_cos=views["rope_cos"], rope_sin=views["rope_sin"],
    )  # fmt: skip
    for b in range(config.batch):
        for s in (state, truth):
            ref.prefill(s, b, args.length + 7 * b, 100 + b)
    gen = torch.Generator(device="cuda").manual_seed(5)
    cands = {"eager": task.workspace_template / "kernel.py", **task.solutions()}
    devnull = os.open(os.devnull, os.O_WRONLY)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; length {args.length}")
    for name, path in cands.items():
        step = load(path, f"_cand_{name}").step
        toks = torch.randint(0, config.vocab, (config.batch,), device="cuda", generator=gen)
        views["tokens"].copy_(toks)
        step(state, views["tokens"].clone())  # warm: compile, the solution's graph captured
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _, rec = recorder.record(step, state, views["tokens"].clone(), views["logits"])
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        wire = json.loads(json.dumps(rec))
        kernels: dict = {}
        try:
            prog = step_schema.validate(wire, "cuda", kernels)
        except step_schema.Bad as exc:
            print(f"{name}: refused: {exc.code}: {exc} (unsupported {rec['unsupported']})")
            continue
        t2 = time.perf_counter()
        rep = step_replay.StepReplay({"device": "cuda"}, devnull)
        rep.views = views
        rep.program({"key": 0, "program": prog, "kernels": [kernels[k] for k in prog["uses"]]})
        rep.prepare({"keys": [0]})
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        ops = [o for o in prog["ops"] if o["op"] == "aten"]
        print(f"{name}: {len(ops)} operator calls, {len(prog['ops']) - len(ops)} launches, "
              f"{len(prog['uses'])} kernels, unsupported {rec['unsupported']}; record "
              f"{t1 - t0:.3f} s, check {t2 - t1:.3f} s, load+capture {t3 - t2:.3f} s; "
              f"{len(json.dumps(rec)) / 1e3:.0f} kB")  # fmt: skip
        other = torch.randint(0, config.vocab, (config.batch,), device="cuda", generator=gen)
        views["tokens"].copy_(other)
        views["logits"].fill_(float("nan"))
        err, copied = rep.run_step({"program": 0})
        torch.cuda.synchronize()
        want = ref.reference_step(truth, other)
        got = views["logits"].float()
        print(
            f"{name}: replay error {err!r} copied {copied}; max |replay - reference| "
            f"{(got - want.float()).abs().max().item():.4g}; NaN {bool(got.isnan().any())}"
        )
        graph = rep.graphs[0][0]
        mine = timed(graph.replay, args.reps)
        own = timed(lambda step=step: step(state, views["tokens"].clone()), args.reps)
        print(
            f"{name}: replayed graph {spread(mine)}; its own step {spread(own)}; ratio "
            f"{statistics.median(mine) / statistics.median(own):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

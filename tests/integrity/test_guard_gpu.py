"""guard_gpu's checked timing samples, driven on the CPU with scripted children.

On a GPU the children replay CUDA graphs; here a scripted child computes the reference (or
replays a stale result) into the slots when asked to collect, so the parent's side runs as it
does on a GPU: pool refills in a random order, the fused compare kernel on every call (under the
Triton interpreter), the bad-call count, the reuse check and the wall clock bookkeeping. Runs
in a subprocess: TRITON_INTERPRET=1 must be set before triton is first imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
REFERENCE = Path(__file__).resolve().parents[2] / "tasks" / "rmsnorm_gate" / "reference.py"

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, random, sys, types
    import torch
    sys.path.insert(0, sys.argv[1])
    import guard, guard_gpu

    spec = importlib.util.spec_from_file_location("reference", sys.argv[2])
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    guard_gpu.SAMPLES = 3
    tol = {"atol": 4e-3, "rtol": 4e-3}

    def inputs(seed):
        args, kwargs = ref.make_inputs({"rows": 4, "dim": 256}, torch.float16, "cpu",
                                       torch.Generator().manual_seed(seed))
        pristine = [a.clone() for a in args]
        return list(args), kwargs, pristine, ref.reference(*pristine)

    class Child:
        def __init__(self, mode, sets):
            self.role, self.mode, self.sets, self.stale = "candidate", mode, sets, {}

        def ask(self, op, *a, spin=False):
            if op == "slots":
                self.slots = a[0]
            elif op == "capture":
                self.calls, self.n = a
                return {"method": "cuda_graph"}, 0.0
            elif op == "replay":
                return {"us": 0.0 if a else 50.0 * self.calls}, 10.0 if a else 60.0 * self.calls
            elif op == "collect":
                for k in range(self.calls):
                    x, g, w = self.sets[k % self.n][0]
                    if self.mode == "stale" and k in self.stale:
                        y = self.stale[k]
                    else:
                        y = ref.reference(x, g, w).to(torch.float16)
                    self.stale[k] = y
                    self.slots[k].copy_(y if self.mode != "shared" else self.slots[0])
                distinct = 1 if self.mode == "shared" else self.calls
                return {"copied": self.calls, "distinct": distinct}, 0.0
            return {}, 0.0

    out = {}
    for mode in ("honest", "stale", "shared"):
        sets = [inputs(s) for s in range(2)]
        env = types.SimpleNamespace(device="cpu", sync=lambda: None)
        run = types.SimpleNamespace(torch=torch, kids=[Child(mode, sets)], env=env,
                                    rng=random.Random(0))
        spec_ = ((4, 256), torch.float16)
        rec = guard_gpu.time_samples(run, sets, inputs(7), spec_, tol, 500.0, guard.load_codes)
        out[mode] = rec["candidate"]
    print(json.dumps(out))
    """
)


def run_script() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(TOOLS), str(REFERENCE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_timed_samples_check_every_call_and_catch_stale_and_shared_outputs() -> None:
    out = run_script()
    honest, stale, shared = out["honest"], out["stale"], out["shared"]
    assert honest["bad_calls"] == 0 and honest["codes"] == []
    assert honest["checked_calls"] == 4 * honest["calls_per_sample"]  # warm-up + 3 samples
    assert len(honest["samples_us"]) == 3 and honest["samples_us"][0] == 50.0
    assert honest["parent_wall_us"][0] == 60.0 * honest["calls_per_sample"] - 10.0
    # a result replayed from the previous sample is wrong once the buffers are refilled
    assert stale["bad_calls"] > 0
    assert any(code == "output_reused" for code, _ in shared["codes"])

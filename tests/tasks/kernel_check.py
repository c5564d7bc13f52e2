"""Shared by the kernel-task tests: run a task's kernels on the Triton CPU interpreter in one
subprocess (TRITON_INTERPRET=1 must be set before triton is first imported, and another test may
already have imported it here) over given shapes, every reference probe and, at the smallest shape,
every size edge and value family of the generic suite (tools/gpu/numerics.py, as the guarded
verify draws them), and report per kernel/dtype/input the worst
|out - ref| / (atol + rtol * |ref|): <= 1 passes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from harnesslab.tools.task.spec import TaskSpec

_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, math, sys
    import torch
    from harnesslab.tools.gpu import numerics

    job = json.loads(sys.argv[1])

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    ref = load(job["reference"], "reference")
    results = {}
    for label, path in job["kernels"].items():
        call = getattr(load(path, label), job["function"])
        for dtype_name, tol in job["tolerances"].items():
            dtype = getattr(torch, dtype_name)
            inputs = {}
            for shape in job["shapes"]:
                gen = torch.Generator().manual_seed(0)
                inputs["x".join(map(str, shape.values()))] = ref.make_inputs(shape, dtype, "cpu", gen)
            for name, probe in ref.PROBES.items():
                inputs["probe:" + name] = probe(dtype, "cpu", torch.Generator().manual_seed(1))
            suite = numerics.Suite(torch, ref, "cpu", job["numerics"], interpret=True,
                                   scale=ref.interpreter_shape)
            gen = torch.Generator().manual_seed(2)
            smallest = min(job["shapes"], key=lambda s: math.prod(s.values()))
            for e in suite.edges(smallest, dtype, gen, tol):
                if e.applicable:
                    inputs["suite:" + e.name] = (e.args, e.kwargs)
            for name, (args, kwargs) in inputs.items():
                out = call(*args, **kwargs)
                expected = ref.reference(*args, **kwargs)
                err = (out.float() - expected).abs() / (tol["atol"] + tol["rtol"] * expected.abs())
                results[f"{label}/{dtype_name}/{name}"] = {
                    "err": err.max().item() if err.numel() else 0.0,
                    "finite": bool(out.isfinite().all()),
                    "spec_ok": (tuple(out.shape), out.dtype) == ref.output_spec(*args, **kwargs),
                }
    print(json.dumps(results))
    """
)


def load_reference(spec: TaskSpec) -> Any:
    module_spec = importlib.util.spec_from_file_location(
        f"{spec.name}_reference", spec.reference_path
    )
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def interpret(
    spec: TaskSpec, kernels: dict[str, Path], shapes: list[dict[str, int]]
) -> dict[str, Any]:
    """{"label/dtype/input": {"err", "finite", "spec_ok"}} for every kernel, dtype and input."""
    job = {
        "reference": str(spec.reference_path),
        "function": spec.entry_function,
        "kernels": {k: str(v) for k, v in kernels.items()},
        "tolerances": {d: spec.tolerances[d].model_dump() for d in spec.dtypes},
        "shapes": shapes,
        "numerics": spec.numerics_request(),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(job)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def failures(results: dict[str, Any], prefix: str, *, probes: bool) -> list[str]:
    """Entries under `prefix` (e.g. "baseline/") that fail: the probes and the generic suite's
    edges, or the plain shapes only."""
    chosen = {
        k: v
        for k, v in results.items()
        if k.startswith(prefix) and ("/probe:" in k or "/suite:" in k) == probes
    }
    assert chosen, f"no results under {prefix!r}"
    return [f"{k}: {v}" for k, v in chosen.items() if not (v["finite"] and v["err"] <= 1.0)]


def passes(spec: TaskSpec, ref: Any, probe: str, dtype: torch.dtype, fn: Any) -> bool:
    """Whether `fn` (plain torch, no Triton) passes one probe at the task's tolerance."""
    args, kwargs = ref.PROBES[probe](dtype, "cpu", torch.Generator().manual_seed(1))
    tol = spec.tolerances[str(dtype).removeprefix("torch.")]
    out, expected = fn(*args, **kwargs).float(), ref.reference(*args, **kwargs)
    ok = (out - expected).abs() <= tol.atol + tol.rtol * expected.abs()
    return bool(out.isfinite().all() and ok.all())

"""rmsnorm_gate task content: reference.py's interface, the baseline and the reference solutions.

Kernels run under the Triton CPU interpreter in one subprocess (TRITON_INTERPRET=1 must be set
before triton is first imported, and another test may already have imported it here). The
subprocess reports, per kernel/dtype/case, the worst |out - ref| / (atol + rtol * |ref|): a case
passes when that is <= 1 and the output has no NaN/Inf.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tools.task.spec import load_task

SPEC = load_task("rmsnorm_gate")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
IRREGULAR_SHAPES = [
    {"rows": 3, "dim": 1000},
    {"rows": 3, "dim": 3000},
    {"rows": 3, "dim": 5120},  # fast.py covers it with a 4096 head and a 1024 tail block
    {"rows": 3, "dim": 8192},
]
ODD_ROWS = {"rows": 7, "dim": 1024}  # not divisible by rows_per_program=4


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _load(SPEC.reference_path, "rmsnorm_gate_reference")

# Runs in the subprocess. argv[1]: JSON {"reference": path, "kernels": {label: path},
# "tolerances": {...}, "shapes": [...], "odd_rows": {...}}; prints one JSON object.
_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch

    job = json.loads(sys.argv[1])

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    ref = load(job["reference"], "reference")
    results = {}
    for label, path in job["kernels"].items():
        call = load(path, label).rmsnorm_gate
        for dtype_name, tol in job["tolerances"].items():
            dtype = getattr(torch, dtype_name)
            cases = {f"{s['rows']}x{s['dim']}": s for s in job["shapes"]}
            cases["odd_rows"] = job["odd_rows"]
            inputs = {}
            for name, shape in cases.items():
                gen = torch.Generator().manual_seed(0)
                inputs[name] = ref.make_inputs(shape, dtype, "cpu", gen)
            for name, probe in ref.PROBES.items():
                inputs["probe:" + name] = probe(dtype, "cpu", torch.Generator().manual_seed(1))
            for name, (args, kwargs) in inputs.items():
                out = call(*args, **kwargs)
                expected = ref.reference(*args, **kwargs)
                err = (out.float() - expected).abs() / (tol["atol"] + tol["rtol"] * expected.abs())
                results[f"{label}/{dtype_name}/{name}"] = {
                    "err": err.max().item(),
                    "finite": bool(out.isfinite().all()),
                    "spec_ok": (tuple(out.shape), out.dtype) == ref.output_spec(*args, **kwargs),
                }
    print(json.dumps(results))
    """
)


def _interpret(job: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The baseline reads kernel_config.json next to itself: a copy with rows_per_program=4.
    rows4 = tmp_path_factory.mktemp("rows4")
    shutil.copy(SPEC.workspace_template / "kernel.py", rows4 / "kernel.py")
    config = {"num_warps": 4, "num_stages": 1, "rows_per_program": 4}
    (rows4 / "kernel_config.json").write_text(json.dumps(config))
    kernels = {
        "baseline": str(SPEC.workspace_template / "kernel.py"),
        "baseline_rows4": str(rows4 / "kernel.py"),
    }
    kernels.update({name: str(path) for name, path in SPEC.solutions().items()})
    return _interpret(
        {
            "reference": str(SPEC.reference_path),
            "kernels": kernels,
            "tolerances": {d: SPEC.tolerances[d].model_dump() for d in SPEC.dtypes},
            "shapes": IRREGULAR_SHAPES,
            "odd_rows": ODD_ROWS,
        }
    )


def _failures(results: dict[str, Any], select: Callable[[str], bool]) -> list[str]:
    chosen = {k: v for k, v in results.items() if select(k)}
    assert chosen, "no results selected"
    return [f"{k}: {v}" for k, v in chosen.items() if not (v["finite"] and v["err"] <= 1.0)]


def test_baseline_matches_reference_on_irregular_dims(results: dict[str, Any]) -> None:
    assert _failures(results, lambda k: k.startswith("baseline/") and "probe:" not in k) == []


def test_solutions_match_reference_on_irregular_dims(results: dict[str, Any]) -> None:
    names = tuple(f"{name}/" for name in SPEC.solutions())
    assert names, "tasks/rmsnorm_gate/solutions/ has no solution"
    assert _failures(results, lambda k: k.startswith(names) and "probe:" not in k) == []


def test_rows_per_program_4_is_right_when_it_does_not_divide_the_rows(
    results: dict[str, Any],
) -> None:
    # 7 rows (odd_rows) and 3 rows (irregular dims), four per program.
    assert _failures(results, lambda k: "_rows4/" in k and "probe:" not in k) == []


def test_baseline_and_solutions_pass_every_probe_without_nan(results: dict[str, Any]) -> None:
    probes = [k for k in results if "/probe:" in k]
    assert {k.split("probe:")[1] for k in probes} == set(REF.PROBES)
    assert _failures(results, lambda k: "/probe:" in k) == []


def test_outputs_have_the_declared_shape_and_dtype(results: dict[str, Any]) -> None:
    assert [k for k, v in results.items() if not v["spec_ok"]] == []


# Known-wrong implementations (plain torch): each must be rejected by the named probe, so a probe
# that stops catching its bug fails here.


def _rmsnorm_gate_torch(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    square_dtype: torch.dtype = torch.float32,
    eps_used: float | None = None,
    divisor: int | None = None,
    silu: str = "stable",
) -> torch.Tensor:
    eps = eps if eps_used is None else eps_used
    squares = (x.to(square_dtype) * x.to(square_dtype)).float()
    mean = squares.sum(-1, keepdim=True) / (divisor or x.shape[-1])
    g = gate.float()
    gated = g * torch.exp(g) / (1 + torch.exp(g)) if silu == "exp" else torch.nn.functional.silu(g)
    y = x.float() / torch.sqrt(mean + eps) * weight.float() * gated
    return y.to(x.dtype)


BAD_KERNELS: dict[str, tuple[str, dict[str, Any]]] = {
    "squares_in_fp16_overflow": ("large_magnitude", {"square_dtype": torch.float16}),
    "squares_in_fp16_underflow": ("tiny_magnitude", {"square_dtype": torch.float16}),
    "hard_coded_eps": ("tiny_magnitude", {"eps_used": 1e-5}),
    "no_eps": ("zero_rows", {"eps_used": 0.0}),
    "exp_silu": ("silu_saturation", {"silu": "exp"}),
    "mean_over_padded_block": ("odd_dim_1001", {"divisor": 1024}),
}


def _passes(probe: str, dtype: torch.dtype, fn: Callable[..., torch.Tensor]) -> bool:
    args, kwargs = REF.PROBES[probe](dtype, "cpu", torch.Generator().manual_seed(1))
    tol = SPEC.tolerances[str(dtype).removeprefix("torch.")]
    out, expected = fn(*args, **kwargs).float(), REF.reference(*args, **kwargs)
    ok = (out - expected).abs() <= tol.atol + tol.rtol * expected.abs()
    return bool(out.isfinite().all() and ok.all())


@pytest.mark.parametrize("bug", sorted(BAD_KERNELS))
def test_probe_rejects_a_kernel_with_its_bug_in_fp16(bug: str) -> None:
    probe, flaw = BAD_KERNELS[bug]
    assert _passes(probe, torch.float16, _rmsnorm_gate_torch)  # the torch model itself is right
    assert not _passes(probe, torch.float16, functools.partial(_rmsnorm_gate_torch, **flaw))


def test_every_probe_has_a_note_and_finite_reference_output() -> None:
    assert set(REF.PROBES) == set(REF.PROBE_NOTES)
    for name, probe in REF.PROBES.items():
        for dtype in DTYPES.values():
            args, kwargs = probe(dtype, "cpu", torch.Generator().manual_seed(1))
            assert all(t.dtype == dtype and t.is_contiguous() for t in args), name
            assert REF.reference(*args, **kwargs).isfinite().all(), name


def test_make_inputs_is_reproducible_from_the_seed_and_matches_the_shape() -> None:
    shape = {"rows": 5, "dim": 3000}
    first, _ = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    again, kwargs = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    other, _ = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(8))
    assert kwargs == {}
    assert [t.shape for t in first] == [(5, 3000), (5, 3000), (3000,)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    assert REF.reference(*first).dtype == torch.float32
    assert REF.output_spec(*first) == ((5, 3000), torch.bfloat16)


def test_sizes_and_interpreter_shapes_follow_the_dev_cases() -> None:
    assert REF.bytes_moved({"rows": 4096, "dim": 4096}, 2) == 3 * 4096 * 4096 * 2 + 4096 * 2
    assert REF.flops({"rows": 2, "dim": 8}) > 0
    for case in SPEC.dev_cases:
        small = REF.interpreter_shape(case.shape)
        assert small["dim"] == case.shape["dim"] and 2 <= small["rows"] <= 8

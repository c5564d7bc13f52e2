"""The lab's decode row (issue 32): a step task's strategies over its traces (tools/gpu/kernel_lab/lab_step.py),
its rows in the report and the claims ledger (no bandwidth, no TFLOP/s, no ncu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harnesslab.tools.lab.claims import claims_ledger
from harnesslab.tools.lab.matrix import kernel_task_names
from harnesslab.tools.lab.report import build_report

from .test_lab import LAB_GPU, REPO


def _row(strategy: str, case: str, p50: float, **extra: Any) -> dict[str, Any]:
    """A step row as lab_step.py writes it (no bytes, FLOPs or bandwidth)."""
    row = {
        "task": "decode_step", "strategy": strategy, "case": case, "dtype": "float16",
        "shape": {"hidden": 1024, "layers": 8}, "passed": True, "status": "passed", "reason": "",
        "median_us": p50, "p95_us": p50 * 1.2, "p99_us": p50 * 1.3, "host_us": p50 * 0.5,
        "launch_overhead_us": 1.0, "device_p50_us": p50 - 1.0, "tokens_per_s": 8e6 / p50,
        "timing_method": "step_trace", "gbps": None, "pct_of_copy_bw": None, "tflops": None,
        "repeat_medians_us": [p50, p50 * 1.01, p50 * 0.99], "repeat_spread": 0.02,
    }  # fmt: skip
    return {**row, **extra}


def step_results(meaningful: bool = True) -> dict[str, Any]:
    rows = [_row("torch_eager", c, 1000.0) for c in ("fixed_fp16:2048", "fixed_fp16:all")]
    rows += [_row("torch_compile", c, 400.0) for c in ("fixed_fp16:2048", "fixed_fp16:all")]
    rows += [_row("sol:triton", c, 150.0) for c in ("fixed_fp16:2048", "fixed_fp16:all")]
    targets = [
        {"kind": "ratio", "vs": "torch_compile", "min": 2.0, "cases": ["fixed_fp16:all"]},
        {"kind": "ratio", "vs": "torch_eager", "min": 8.0, "cases": ["fixed_fp16:all"]},
    ]
    task = {"metric": "latency", "strategies": ["torch_eager", "torch_compile", "sol:triton"],
            "strategy_errors": {}, "cases": ["fixed_fp16:2048", "fixed_fp16:all"],
            "claim_cases": ["fixed_fp16:all"], "targets": targets, "peers": {},
            "best_strategy": "sol:triton"}  # fmt: skip
    info = {"device": "NVIDIA H100", "meaningful": meaningful, "date": "2026-11-26"}
    return {"schema": "harnesslab.lab/1", "info": info, "tasks": {"decode_step": task},
            "rows": rows, "ncu": {}, "tuning": []}  # fmt: skip


def test_step_claims_are_caveated_without_ncu_and_rejected_below_the_target() -> None:
    by = {c.target: c for c in claims_ledger(step_results())}
    compile_claim = by[">= 2x the speed of torch_compile"]
    assert compile_claim.status == "caveated"  # met (2.67x), but no profile of a step
    assert "does not profile a step task" in compile_claim.reason
    assert compile_claim.value == pytest.approx(400.0 / 150.0)
    eager_claim = by[">= 8x the speed of torch_eager"]
    assert eager_claim.status == "rejected" and "measured 6.67x" in eager_claim.reason


def test_step_report_shows_p50_and_p95_per_trace_bucket(tmp_path: Path) -> None:
    summary = build_report(step_results(), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| fixed_fp16:all | 1000.0 us (1200 us p95) | 400.0 us (480 us p95) |" in report
    assert "150.0 us (180 us p95) | 6.67x |" in report  # best speedup over eager
    assert summary.claims == {"supported": 0, "caveated": 1, "rejected": 1, "pending": 0}
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert {"p95_us", "p99_us", "tokens_per_s"} <= set(header)


def test_the_lab_takes_the_step_task() -> None:
    assert "decode_step" in kernel_task_names([])
    assert kernel_task_names(["decode_step"]) == ["decode_step"]


@pytest.mark.slow
def test_the_lab_runs_the_decode_row_end_to_end_on_the_interpreter(tmp_path: Path) -> None:
    """`harnesslab lab` over decode_step's first trace on the CPU: eager and the Triton solution
    run (every step checked), torch.compile's row says why it did not, the report renders."""
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    out = tmp_path / "lab"
    proc = subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", "lab", "--tasks", "decode_step",
         "--max-cases", "1", "--interpret", "always", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    rows = {(r["strategy"], r["case"]): r for r in results["rows"]}
    task = results["tasks"]["decode_step"]
    assert task["cases"] == ["fixed_fp16:64", "fixed_fp16:all"]  # one bucket: the interpreter's
    for strategy in ("torch_eager", "sol:triton"):
        for case in task["cases"]:
            row = rows[(strategy, case)]
            assert row["passed"] and row["median_us"] > 0 and row["p95_us"] >= row["median_us"]
    for case in task["cases"]:
        row = rows[("torch_compile", case)]
        assert row["status"] == "skipped" and "reduce-overhead" in row["reason"]
        assert "CUDA graphs need a GPU" in row["reason"]
    assert task["best_strategy"] == "sol:triton"
    report = (out / "report.md").read_text()
    assert "NOT MEANINGFUL" in report and "## decode_step" in report
    assert "| **pending** |" in report and "interpreter run" in report


def _tiny_task() -> dict[str, Any]:
    """decode_step's task table at the interpreter's sizes as the "GPU" model, one short trace."""
    task = LAB_GPU.read_task(REPO / "tasks" / "decode_step")
    step = task["step"]
    fixed = {**step["traces"][0], **step["traces"][0]["interpreter"]}
    task["step"] = {**step, "model": step["interpreter"], "traces": [fixed]}
    task["lab"]["targets"] = [{"kind": "ratio", "vs": "torch_eager", "min": 1.0,
                               "cases": ["fixed_fp16:all"]}]  # fmt: skip
    return task


@pytest.mark.slow
def test_claim_rows_are_repeated_and_a_repeat_that_fails_fails_the_row(monkeypatch) -> None:
    """Timed like a GPU run (not the interpreter): the solution and the comparator are measured
    `repeats` times on the claim trace; a solution right the first time and wrong after fails."""
    import torch

    from harnesslab.tools.gpu import runner
    from harnesslab.tools.gpu.kernel_lab import lab_step

    eager = runner.load_module(REPO / "tasks" / "decode_step" / "workspace" / "kernel.py",
                               "_test_lab_step_eager").step  # fmt: skip
    calls = {"n": 0}

    def flaky(state, tokens):  # one run_trace on the CPU: 2 passes of 6 steps
        calls["n"] += 1
        out = eager(state, tokens)
        return out + 1.0 if calls["n"] > 12 else out

    monkeypatch.setattr(
        lab_step,
        "strategies",
        lambda *a: ({"torch_eager": eager, "sol:flaky": flaky}, {"torch_compile": "skipped: test"}),
    )
    env = SimpleNamespace(torch=torch, interpret=False, device="cpu")
    args = SimpleNamespace(no_compile=True, quick=False, max_cases=0, repeats=3)
    done = lab_step.run_task(runner, env, _tiny_task(), args, deadline=float("inf"))
    rows = {(r["strategy"], r["case"]): r for r in done["rows"]}
    eager_row = rows[("torch_eager", "fixed_fp16:all")]
    assert eager_row["passed"] and len(eager_row["repeat_medians_us"]) == 3
    assert eager_row["repeat_spread"] is not None
    flaky_row = rows[("sol:flaky", "fixed_fp16:all")]
    assert not flaky_row["passed"] and flaky_row["reason"].startswith("a repeat: logits")
    assert rows[("torch_compile", "fixed_fp16:all")]["status"] == "skipped"

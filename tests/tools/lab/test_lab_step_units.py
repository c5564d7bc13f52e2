"""The lab's decode row (tools/gpu/kernel_lab/lab_step.py) rule by rule, in process and fast:
run_trace is a stand-in that answers scripted outcomes (step_trace.run_trace's shape), so each
rule of run_task shows alone: which strategies and traces run, the rows of a strategy that ran,
failed or never ran, the repeats of the claim rows on a GPU and a repeat that fails its rows, the
order and the summary. strategies() loads a task folder written here; torch.compile and the
static-address marks are stand-ins too (no compile on this machine). The real traces run in
test_lab_step.py's slow tests."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import failures, runner, step_trace
from harnesslab.tools.gpu.kernel_lab import lab, lab_step

REPO = Path(__file__).resolve().parents[3]
TASK = lab.read_task(REPO / "tasks" / "decode_step")
REF = runner.load_module(REPO / "tasks" / "decode_step" / "reference.py", "_lab_step_units_ref")


class _State:
    def __init__(self) -> None:
        self.kv_cache, self.lengths = torch.zeros(2), torch.zeros(1)
        self.rope_cos, self.rope_sin = torch.zeros(3), torch.zeros(3)
        self.weights = {"embed": torch.zeros(4), "lm_head": torch.zeros(4)}


def test_compiled_marks_each_states_tensors_once_by_identity(monkeypatch):
    modes, marks = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, mode: modes.append(mode) or fn)
    monkeypatch.setattr(torch._dynamo, "mark_static_address", lambda t: marks.append(id(t)))
    step = lab_step.compiled(lambda state, tokens: ("ran", tokens))
    assert modes == ["reduce-overhead"]  # CUDA graphs through cudagraph trees
    one, two = _State(), _State()
    assert step(one, 7) == ("ran", 7)
    every = [one.kv_cache, one.lengths, one.rope_cos, one.rope_sin, *one.weights.values()]
    assert marks == [id(t) for t in every]
    step(two, 1)
    step(one, 2)  # marked already: not again
    assert len(marks) == 12
    (marked,) = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, list)]
    del two
    gc.collect()
    step(one, 3)
    three = _State()
    step(three, 4)
    assert len(marks) == 18 and len(marked) == 2  # a freed state's reference is dropped


def test_claim_cases_are_the_targets_cases_once_each_in_order():
    task = {"lab": {"targets": [{"cases": ["a:all", "b:16"]}, {"vs": "x"},
                                {"cases": ["b:16", "c:all", "a:all"]}]}}  # fmt: skip
    assert lab_step.claim_cases(task) == ["a:all", "b:16", "c:all"]
    assert lab_step.claim_cases({}) == []


def _task_folder(tmp_path: Path, eager: str = "def step(state, tokens):\n    return 'eager'\n"):
    (tmp_path / "workspace").mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "workspace" / "kernel.py").write_text(eager)
    for name in ("b_fast", "a_fast", "_shared"):
        source = f"def step(s, t):\n    return {name!r}\n"
        (tmp_path / "solutions" / f"{name}.py").write_text(source)
    (tmp_path / "solutions" / "broken.py").write_text(f"raise ImportError({'no ' * 200!r})\n")
    return {"name": "tiny", "root": str(tmp_path), "entry": "kernel.py:step"}


def test_strategies_are_eager_then_compile_then_each_solution_and_say_why_not(tmp_path):
    task = _task_folder(tmp_path)
    fns, errors = lab_step.strategies(runner, task, interpret=True, no_compile=False)
    assert list(fns) == ["torch_eager", "sol:a_fast", "sol:b_fast"]  # "_" files are helpers
    assert [fns[n](None, None) for n in fns] == ["eager", "a_fast", "b_fast"]
    assert list(errors) == ["torch_compile", "sol:broken"]
    assert errors["torch_compile"] == ('skipped: torch.compile(mode="reduce-overhead") not run: '
                                       "CUDA graphs need a GPU (Triton interpreter run)")  # fmt: skip
    assert errors["sol:broken"].startswith("import failed: ImportError: no no")
    assert len(errors["sol:broken"]) == 300  # cut
    _, errors = lab_step.strategies(runner, task, interpret=False, no_compile=True)
    assert errors["torch_compile"].endswith("not run: --no-compile")


def test_without_an_eager_step_there_is_nothing_to_compile(tmp_path):
    task = _task_folder(tmp_path, eager="raise RuntimeError('no eager')\n")
    fns, errors = lab_step.strategies(runner, task, interpret=False, no_compile=False)
    assert "torch_eager" not in fns and "torch_compile" not in fns
    assert errors["torch_eager"] == "import failed: RuntimeError: no eager"
    assert errors["torch_compile"] == "skipped: the eager step did not import"


@pytest.mark.parametrize("knobs", [("recompile_limit", "cache_size_limit"), ("cache_size_limit",),
                                   ("recompile_limit",)])  # fmt: skip
def test_on_a_gpu_the_eager_step_is_compiled_with_room_for_every_bucket(
    tmp_path, monkeypatch, knobs
):
    """Whichever of the recompile limit's names this torch has (the old one alone, the new one
    alone, both) is raised."""
    task = _task_folder(tmp_path)
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(torch._dynamo, "config", SimpleNamespace(**dict.fromkeys(knobs, 8)))
    monkeypatch.setattr(lab_step, "compiled", lambda eager: ("compiled", eager))
    fns, errors = lab_step.strategies(runner, task, interpret=False, no_compile=False)
    assert list(fns) == ["torch_eager", "torch_compile", "sol:a_fast", "sol:b_fast"]
    assert fns["torch_compile"] == ("compiled", fns["torch_eager"]) and resets == [1]
    assert vars(torch._dynamo.config) == dict.fromkeys(knobs, 256)
    assert list(errors) == ["sol:broken"]


# -- run_task with a stand-in run_trace --------------------------------------------------------


def _bucket(bucket, p50: float) -> dict[str, Any]:
    return {"bucket": bucket, "p50_us": p50, "p95_us": p50 * 2, "p99_us": p50 * 3,
            "host_p50_us": 5.0, "launch_overhead_us": 1.5, "device_p50_us": p50 - 1,
            "tokens_per_s": 1e6 / max(p50, 1.0), "steps": 6, "failed_steps": 0}  # fmt: skip


def _out(p50: float = 10.0, correct: bool = True, buckets=(64,)) -> dict[str, Any]:
    bad = [] if correct else [{"what": "logits", "step": 2, "pass": "check", "reason": "off"},
                              {"what": "cache", "step": None, "pass": "check", "reason": "x"}]  # fmt: skip
    return {"correct": correct, "failures": bad,
            "buckets": [_bucket(b, p50 + i) for i, b in enumerate(buckets)],
            "total": _bucket("all", p50 + 100)}  # fmt: skip


class _Script:
    """run_trace's stand-in: per strategy, the outcomes of its calls in order (an Exception is
    raised); every call's trace name and keywords noted."""

    def __init__(self, **outcomes: list[Any]) -> None:
        self.outcomes, self.calls = outcomes, []

    def __call__(self, torch_, ref, step, config, trace, **kwargs):
        self.calls.append((step.name, trace["name"], kwargs))
        got = self.outcomes[step.name].pop(0)
        if isinstance(got, Exception):
            raise got
        return got


def _step(name: str):
    return SimpleNamespace(name=name)


def _run(monkeypatch, script, fns=("torch_eager", "sol:fast"), errors=None, *, interpret=False,
         traces=("fixed_fp16",), targets=None, deadline=float("inf"), **args):  # fmt: skip
    monkeypatch.setattr(step_trace, "run_trace", script)
    monkeypatch.setattr(lab_step, "strategies",
                        lambda *a: ({n: _step(n) for n in fns}, dict(errors or {})))  # fmt: skip
    step = {**TASK["step"], "traces": [t for t in TASK["step"]["traces"] if t["name"] in traces]}
    lab_ = {"targets": targets if targets is not None else TASK["lab"]["targets"]}
    task = {**TASK, "step": step, "lab": lab_}
    env = SimpleNamespace(torch=torch, interpret=interpret, device="dev")
    opts = SimpleNamespace(**{"no_compile": False, "quick": False, "max_cases": 0, "repeats": 3,
                              **args})  # fmt: skip
    return lab_step.run_task(runner, env, task, opts, deadline)


class _Stdout(io.StringIO):
    """stdout that notes how much was written when each flush came."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[int] = []

    def flush(self) -> None:
        self.flushed.append(len(self.getvalue()))


def test_a_strategy_that_ran_gives_a_row_per_bucket_and_its_whole_trace(monkeypatch):
    script = _Script(torch_eager=[_out(10.0, buckets=(16, 64))])
    stdout = _Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    done = _run(monkeypatch, script, fns=("torch_eager",), interpret=True)
    first, _, whole = done["rows"]
    assert first == {
        "task": "decode_step", "strategy": "torch_eager", "case": "fixed_fp16:16",
        "dtype": "float16", "shape": TASK["step"]["interpreter"], "passed": True,
        "status": "passed", "reason": "", "median_us": 10.0, "p95_us": 20.0, "p99_us": 30.0,
        "host_us": 5.0, "launch_overhead_us": 1.5, "device_p50_us": 9.0,
        "tokens_per_s": 1e5, "steps": 6, "failed_steps": 0, "timing_method": "step_trace",
        "gbps": None, "pct_of_copy_bw": None, "flops": None, "tflops": None, "bytes": None,
        "repeat_medians_us": [10.0], "repeat_spread": 0.0,
    }  # fmt: skip
    assert whole["case"] == "fixed_fp16:all" and whole["median_us"] == 110.0
    ((_, trace, kwargs),) = script.calls
    assert trace == "fixed_20x6"  # the interpreter's sizes of the first trace
    assert kwargs == {"device": "dev", "tolerance": TASK["tolerances"]["float16"]}
    lines = stdout.getvalue().splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == [
        {k: r[k] for k in ("task", "strategy", "case", "status", "median_us", "p95_us")}
        for r in done["rows"]
    ]  # fmt: skip
    ends = [sum(len(x) for x in lines[: i + 1]) for i in range(len(lines))]
    assert stdout.flushed == ends  # each progress line reaches the host as it is printed


def test_a_wrong_strategy_fails_its_rows_with_the_first_failure(monkeypatch):
    done = _run(monkeypatch, _Script(torch_eager=[_out(correct=False)]), fns=("torch_eager",))
    for row in done["rows"]:
        assert not row["passed"] and row["status"] == "failed"
        assert row["reason"] == "logits at step 2 of the check pass: off"


def test_on_a_gpu_claim_rows_of_solutions_and_comparators_are_measured_repeats_times(monkeypatch):
    script = _Script(torch_eager=[_out(10.0), _out(12.0), _out(11.0)], torch_compile=[_out(8.0)],
                     **{"sol:fast": [_out(4.0), _out(5.0), _out(6.0)]})  # fmt: skip
    targets = [{"vs": "torch_eager", "cases": ["fixed_fp16:all"]}]
    done = _run(monkeypatch, script, fns=("torch_eager", "torch_compile", "sol:fast"),
                targets=targets, repeats=3)  # fmt: skip
    rows = {(r["strategy"], r["case"]): r for r in done["rows"]}
    assert rows["torch_eager", "fixed_fp16:all"]["repeat_medians_us"] == [110.0, 112.0, 111.0]
    assert rows["torch_eager", "fixed_fp16:all"]["repeat_spread"] == pytest.approx(2 / 111)
    assert rows["sol:fast", "fixed_fp16:64"]["repeat_medians_us"] == [4.0, 5.0, 6.0]
    ran = [c[0] for c in script.calls]
    assert [ran.count(n) for n in ("torch_eager", "torch_compile", "sol:fast")] == [3, 1, 3]
    assert all(r["passed"] for r in done["rows"])


@pytest.mark.parametrize("why", ["interpreter", "not a claim trace", "wrong", "not compared"])
def test_a_row_is_measured_once_off_a_gpu_off_the_claims_when_wrong_or_not_compared(
    monkeypatch, why
):
    outs = {"torch_eager": [_out(10.0, correct=why != "wrong")], "sol:fast": [_out(4.0)]}
    targets = [{"vs": "torch_eager" if why != "not compared" else "",
                "cases": ["fixed_fp16:all" if why != "not a claim trace" else "other:all"]}]  # fmt: skip
    script = _Script(**outs)
    done = _run(monkeypatch, script, fns=("torch_eager",), targets=targets,
                interpret=why == "interpreter")  # fmt: skip
    assert len(script.calls) == 1
    assert all(len(r["repeat_medians_us"]) == 1 for r in done["rows"])


def test_a_repeat_that_fails_or_raises_fails_every_row_of_that_strategy(monkeypatch):
    script = _Script(**{"sol:a": [_out(4.0), _out(5.0), _out(6.0, correct=False)],
                        "sol:b": [_out(4.0), RuntimeError("hung"), _out(6.0)]})  # fmt: skip
    done = _run(monkeypatch, script, fns=("sol:a", "sol:b"), targets=[
        {"cases": ["fixed_fp16:all"]}])  # fmt: skip
    for row in done["rows"]:
        assert not row["passed"] and row["status"] == "failed"
        if row["strategy"] == "sol:a":
            assert row["reason"] == "a repeat: logits at step 2 of the check pass: off"
            assert len(row["repeat_medians_us"]) == 3  # the failing repeat still timed
        else:
            assert row["reason"] == "a repeat: RuntimeError: hung"
            assert len(row["repeat_medians_us"]) == 2  # the one that raised has no time


def test_a_repeat_median_of_zero_or_of_another_bucket_is_not_a_median(monkeypatch):
    first, second = _out(0.0, buckets=(16, 64)), _out(7.0, buckets=(16, 64))
    first["total"]["p50_us"] = second["buckets"][1]["p50_us"] = 0.0
    script = _Script(**{"sol:a": [first, second, _out(9.0, buckets=(16,))]})
    done = _run(monkeypatch, script, fns=("sol:a",), targets=[{"cases": ["fixed_fp16:all"]}])
    rows = {r["case"]: r for r in done["rows"]}
    assert rows["fixed_fp16:16"]["repeat_medians_us"] == [7.0, 9.0]
    assert rows["fixed_fp16:64"]["repeat_medians_us"] == [1.0]  # the second's 0, the third's none
    assert rows["fixed_fp16:all"]["repeat_medians_us"] == [107.0, 109.0]


def test_a_strategy_that_never_ran_gets_a_row_per_case_saying_why(monkeypatch):
    script = _Script(torch_eager=[_out(10.0)], **{"sol:x": [RuntimeError("boom")]})
    errors = {"torch_compile": "skipped: --no-compile", "sol:gone": "import failed: E: e"}
    done = _run(monkeypatch, script, fns=("torch_eager", "sol:x"), errors=errors)
    assert done["summary"]["strategies"] == ["torch_eager", "sol:x", "torch_compile", "sol:gone"]
    rows = {(r["strategy"], r["case"]): r for r in done["rows"]}
    for case in ("fixed_fp16:64", "fixed_fp16:all"):
        assert rows["torch_compile", case] == {
            "task": "decode_step", "strategy": "torch_compile", "case": case,
            "dtype": "float16", "shape": TASK["step"]["model"], "passed": False,
            "status": "skipped", "reason": "skipped: --no-compile", "median_us": None,
            "timing_method": "step_trace", "repeat_medians_us": [], "repeat_spread": None,
        }  # fmt: skip
        assert rows["sol:gone", case]["status"] == "error"
        assert rows["sol:x", case]["status"] == "error"
        assert rows["sol:x", case]["reason"] == "error: RuntimeError: boom"
    order = [(r["case"], r["strategy"]) for r in done["rows"]]
    names = done["summary"]["strategies"]
    assert order == [(c, s) for c in ("fixed_fp16:64", "fixed_fp16:all") for s in names]


def test_when_no_strategy_runs_each_says_why_on_the_whole_trace(monkeypatch):
    done = _run(monkeypatch, _Script(), fns=("torch_eager",), deadline=0.0)
    assert [(r["case"], r["status"], r["reason"]) for r in done["rows"]] == [
        ("fixed_fp16:all", "skipped", "skipped: time budget")]  # fmt: skip


def test_quick_runs_the_claim_traces_else_the_first_and_max_cases_cuts_them(monkeypatch):
    def traces(**kwargs):
        outs = {"torch_eager": [_out() for _ in range(3)]}
        done = _run(monkeypatch, _Script(**outs), fns=("torch_eager",),
                    traces=("fixed_fp16", "dynamic_fp16", "dynamic_bf16"), interpret=True,
                    **kwargs)  # fmt: skip
        return list(dict.fromkeys(c.split(":")[0] for c in done["summary"]["cases"]))

    every = ["fixed_fp16", "dynamic_fp16", "dynamic_bf16"]
    assert traces() == every
    assert traces(quick=True, targets=[{"cases": ["dynamic_bf16:all"]}]) == ["dynamic_bf16"]
    assert traces(quick=True, targets=[]) == ["fixed_fp16"]
    assert traces(max_cases=2) == every[:2]


def test_the_summary_keeps_the_claims_and_targets_on_the_cases_that_ran(monkeypatch):
    targets = [{"kind": "ratio", "vs": "torch_eager", "min": 2.0,
                "cases": ["fixed_fp16:all", "dynamic_fp16:all"]}]  # fmt: skip
    done = _run(monkeypatch, _Script(**{"sol:a": [_out()]}), fns=("sol:a",), targets=targets,
                interpret=True)  # fmt: skip
    assert done["summary"] == {
        "metric": "latency", "strategies": ["sol:a"], "strategy_errors": {},
        "cases": ["fixed_fp16:64", "fixed_fp16:all"], "claim_cases": ["fixed_fp16:all"],
        "targets": [{**targets[0], "cases": ["fixed_fp16:all"]}], "peers": {},
    }  # fmt: skip


def test_one_run_trace_has_the_trace_timeout_and_an_error_is_its_outcome(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def deadline(seconds):
        seen.append(seconds)
        yield

    monkeypatch.setattr(failures, "deadline", deadline)
    monkeypatch.setattr(step_trace, "run_trace", _Script(s=[ValueError("bad step"), _out()]))
    args = (torch, REF, _step("s"), None, {"name": "t"}, "cpu", {"atol": 1.0})
    assert lab_step._run(*args) == {"error": "ValueError: bad step"}
    assert lab_step._run(*args)["correct"] is True
    assert seen == [lab_step.TRACE_TIMEOUT_S] * 2 == [300.0] * 2

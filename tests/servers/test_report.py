"""The CLI's human-readable output (servers/report.py, the run/demo tables): what it shows on
the CPU interpreter and on a GPU, at 80 columns, and how it words a comparison."""

from __future__ import annotations

from rich.console import Console

from harnesslab.servers.report import INTERPRETER_NOTE, fit_table, print_eval, versus
from harnesslab.servers.run_cmd import iterations_table, result_table
from harnesslab.tools.evaluation.results import CaseResult, EnvInfo, EvalResult

LONG_REASON = (
    "import failed: SyntaxError at kernel.py:32: '(' was never closed (kernel.py, line 32) "
    "and this sentence keeps going well past eighty characters so that a cut would show"
)


def render(renderable_or_fn, width: int = 80) -> str:
    out = Console(record=True, width=width)
    if callable(renderable_or_fn):
        renderable_or_fn(out)
    else:
        out.print(renderable_or_fn)
    return out.export_text()


def case(name: str, **kw) -> CaseResult:
    base = {"name": name, "dtype": "float16", "passed": True, "status": "passed"}
    return CaseResult.model_validate({**base, **kw})


def interpreted_result() -> EvalResult:
    timed = {"median_us": 9775.4, "p10_us": 9154.4, "p90_us": 11339.1, "launch_overhead_us": 0.0,
             "gbps": 0.0015, "pct_of_copy_bw": 810.66, "max_abs_err": 0.0032}  # fmt: skip
    return EvalResult(
        status="failed",
        score_us=None,
        meaningful=False,
        cases=[
            case("4096x393216_float32", shape={"rows": 2, "dim": 1024}, **timed),
            case("1024x1024_fp16", passed=False, status="error", reason=LONG_REASON),
        ],
        candidate="103bb15781cc439e",
        best_score_us=401574.1,
        delta_vs_best_pct=62.3,
        env=EnvInfo(device="cpu (Triton interpreter)", meaningful=False),
    )


def test_versus_says_how_many_times_slower_or_faster_never_a_signed_percentage():
    assert versus(650.0, 401.2) == "1.62x slower than the best"
    assert versus(401.2, 650.0, ref_name="the baseline") == "1.62x faster than the baseline"
    assert versus(100.0, 100.2).startswith("the same as the best")
    assert versus(150.0, 100.0, higher_is_better=True) == "1.50x better than the best"
    assert versus(100.0, 150.0, higher_is_better=True, ref_name="") == "1.50x worse"
    assert versus(-1.0, 2.0, timing=False) == "3 better than the best"  # no ratio of signs
    assert versus(None, 1.0) == ""


def test_on_the_interpreter_eval_names_the_shape_that_ran_and_leaves_gpu_columns_out():
    text = render(lambda out: print_eval(interpreted_result(), "eval (dev cases)", out))
    header = next(ln for ln in text.splitlines() if ln.lstrip().startswith("case"))
    assert "ran as" in header and "2x1024" in text  # 64x64, not the full-size name alone
    for gpu_only in ("GB/s", "% copy", "launch us", "p10-p90"):
        assert gpu_only not in header
    assert "810" not in text and "0%" not in text  # no bandwidth figure from a CPU
    assert text.count(INTERPRETER_NOTE) == 1
    assert "best so far" not in text and "%" not in text  # no comparison of meaningless times


def test_at_80_columns_nothing_is_wider_and_a_reason_is_never_cut():
    text = render(lambda out: print_eval(interpreted_result(), "eval (dev cases)", out))
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 80
    flat = " ".join(ln.strip() for ln in text.splitlines())
    assert "so that a cut would show" in flat  # the whole reason, under the table
    assert "(kernel.py, line 32)" in flat


def test_on_a_gpu_eval_shows_bandwidth_and_compares_with_the_best_in_words():
    result = interpreted_result().model_copy(
        update={"meaningful": True, "score_us": 650.0, "best_score_us": 401.2, "status": "passed"}
    )
    result.cases = [result.cases[0]]
    text = render(lambda out: print_eval(result, "eval", out), width=120)
    assert "GB/s" in text and "% copy" in text and "ran as" not in text
    assert "1.62x slower than the best so far (401.2 us)" in text
    assert INTERPRETER_NOTE not in text


def test_a_column_empty_in_every_row_is_left_out():
    text = render(fit_table("t", ["a", "empty", "b"], [["1", "-", "x"], ["2", "", "y"]]))
    assert "empty" not in text and "a" in text and "b" in text


def run_summary(meaningful: bool) -> dict:
    score = {"verdict": "passed", "score_us": 377.8, "case_set": "final-1",
             "speedup_vs_incumbent": 0.87 if meaningful else None}  # fmt: skip
    return {
        "run_id": "r", "status": "completed", "stop_reason": "2 iterations done",
        "meaningful": meaningful, "baseline": {**score, "score_us": 529.6},
        "best": {**score, "iteration": 1, "candidate": "0ad22434"}, "final": score,
        "workspace": "/tmp/harnesslab-demo-x/ws", "wall_s": 238,
        "iterations": [
            {"iteration": i, "attempt": {"status": "ok", "duration_s": 40}, "score": score,
             "new_best": i == 1, "build": {"status": "ok"},
             "servers": [{"name": "rmsnorm-gate-tuned", "status": "registered"}]}
            for i in (1, 2)
        ],
    }  # fmt: skip


def test_the_demo_tables_compare_nothing_on_the_interpreter_and_fit_80_columns():
    text = render(iterations_table(run_summary(False))) + render(result_table(run_summary(False)))
    assert "vs baseline" not in text and "ABBA" not in text  # no empty columns either
    assert "faster" not in text and "slower" not in text and "%" not in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 80


def test_on_a_gpu_the_run_tables_word_both_comparisons_alike():
    text = render(iterations_table(run_summary(True)), width=100)
    assert "1.40x faster" in text  # 529.6 -> 377.8 against the baseline
    assert "1.15x slower" in text  # ABBA: the incumbent took 0.87x this candidate's time
    result = render(result_table(run_summary(True)), width=100)
    assert "1.40x faster than the baseline" in " ".join(result.split())


def compare_report(meaningful: bool | None):
    from harnesslab.tools.loop.compare import Arm, CompareReport, Trial, difference, summarize_arm

    trials = [Trial(arm=arm, index=i, workspace="w", score=s, valid=True)
              for arm, scores in (("plain", [100.0, 104.0, 98.0]), ("harnessed", [80.0, 83.0, 79.0]))
              for i, s in enumerate(scores, 1)]  # fmt: skip
    a = summarize_arm(Arm(name="plain"), trials[:3], [], higher=False)
    b = summarize_arm(Arm(name="harnessed"), trials[3:], ["srv"], higher=False)
    return CompareReport(
        task="rmsnorm_gate", case_set="final-1", score_key="score_us", unit="us",
        higher_is_better=False, meaningful=meaningful, config={}, arms=[a, b],
        difference=difference(a, b, trials, higher=False, seed=0), trials=trials,
        files={"markdown": "cmp/report.md"},
    )  # fmt: skip


def test_compare_on_the_interpreter_shows_validity_but_claims_no_winner_at_80_columns():
    from harnesslab.servers.compare_cmd import print_compare

    text = render(lambda out: _with_console(out, print_compare, compare_report(False)))
    header = next(ln for ln in text.splitlines() if ln.lstrip().startswith("arm"))
    assert "3 of 3" in text and "median" not in header and " is better (" not in text
    assert "not compared" in text and "-20" not in text and "cmp/report.md" in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 80
    on_gpu = render(lambda out: _with_console(out, print_compare, compare_report(True)))
    assert "median" in on_gpu and "harnessed is better" in on_gpu


def _with_console(out, fn, *args):
    import harnesslab.servers.compare_cmd as cmd

    real = cmd.console
    cmd.console = lambda: out
    try:
        fn(*args)
    finally:
        cmd.console = real

"""The kernel lab: claims classification, the report pipeline from a synthetic results.json, the
GPU script's helpers (claim cases, ncu attribution through a stand-in ncu), and `harnesslab lab`
end to end on the Triton interpreter."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools import gpu
from harnesslab.tools.errors import UsageError
from harnesslab.tools.lab.claims import claims_ledger
from harnesslab.tools.lab.matrix import LabOptions, lab_argv, load_results, stage_lab
from harnesslab.tools.lab.report import build_report, languages_section, perf_top

REPO = Path(__file__).resolve().parents[3]


def _load_lab_gpu() -> Any:
    """lab.py from a flat copy of the lab's files, as `harnesslab lab` stages them (it loads
    runner.py and its other siblings from beside itself)."""
    folder = gpu.copy_flat(Path(tempfile.mkdtemp(prefix="hl_test_lab_")), gpu.LAB)
    atexit.register(shutil.rmtree, folder, True)
    spec = importlib.util.spec_from_file_location("_test_lab_gpu", folder / "lab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAB_GPU = _load_lab_gpu()


def _row(strategy: str, case: str, median: float, **extra: Any) -> dict[str, Any]:
    row = {
        "task": "copyish", "strategy": strategy, "case": case, "dtype": "float16",
        "shape": {"rows": 4096, "dim": 4096}, "passed": True, "status": "passed", "reason": "",
        "median_us": median, "p10_us": median, "p90_us": median, "spread": 0.01,
        "host_us": median + 40, "launch_overhead_us": 40.0, "gbps": 2900.0,
        "pct_of_copy_bw": 95.0, "tflops": None, "timing_method": "isolated",
        "repeat_medians_us": [median, median * 1.01, median * 0.99], "repeat_spread": 0.02,
    }  # fmt: skip
    return {**row, **extra}


def _ncu(time_ns: float, dram_pct: float) -> dict[str, Any]:
    return {
        "kernel": "_k",
        "gpu__time_duration.sum": {"value": time_ns, "unit": "ns"},
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": {"value": dram_pct, "unit": "%"},
        "dram__bytes.sum.per_second": {"value": 2.8e12, "unit": "byte/s"},
    }


def synthetic_results() -> dict[str, Any]:
    """One bandwidth task with a case per claim status, and a ratio target on two cases."""
    cases = ["good", "one_repeat", "noisy", "ncu_off", "no_ncu", "low_dram", "wrong", "slow",
             "skipped"]  # fmt: skip
    rows = [_row("sol:fast", c, 30.0) for c in cases]
    by = {r["case"]: r for r in rows}
    by["one_repeat"]["repeat_medians_us"] = [30.0]
    by["noisy"].update(repeat_medians_us=[30.0, 33.0, 29.0], repeat_spread=4.0 / 30.0)
    by["wrong"].update(passed=False, status="failed", reason="12 of 100 elements out of tolerance")
    by["slow"].update(pct_of_copy_bw=70.0)
    by["skipped"].update(passed=False, status="skipped", reason="skipped: time budget")
    rows += [_row("torch_eager", c, 90.0, pct_of_copy_bw=31.0) for c in ("good", "slow")]
    rows += [_row("baseline", "good", 40.0)]
    ncu = {c: _ncu(30_000.0, 85.0) for c in cases if c not in ("no_ncu",)}
    ncu["ncu_off"] = _ncu(40_000.0, 85.0)
    ncu["low_dram"] = _ncu(30_000.0, 20.0)
    return {
        "schema": "harnesslab.lab/1",
        "info": {
            "device": "NVIDIA H100 80GB HBM3",
            "meaningful": True,
            "copy_gbps": 3000.0,
            "date": "2026-11-21",
            "torch": "2.11",
            "triton": "3.6",
        },
        "tasks": {
            "copyish": {
                "metric": "bandwidth",
                "strategies": ["baseline", "sol:fast", "torch_eager", "torch_compile"],
                "strategy_errors": {"torch_compile": "skipped: --no-compile"},
                "cases": cases,
                "claim_cases": cases,
                "best_strategy": "sol:fast",
                "targets": [
                    {"kind": "pct_of_copy", "min": 90.0, "cases": cases},
                    {"kind": "ratio", "vs": "torch_eager", "min": 2.0, "cases": ["good", "noisy"]},
                ],
            }
        },
        "rows": rows,
        "ncu": {"copyish": {"strategy": "sol:fast", "by_case": ncu}},
        "tuning": [],
        "wall_s": 12.0,
    }


def _status(claims, case: str, target_word: str = "copy") -> tuple[str, str]:
    found = [c for c in claims if c.case == case and target_word in c.target]
    assert len(found) == 1, (case, found)
    return found[0].status, found[0].reason


def test_claims_are_supported_only_with_correctness_repeats_and_a_matching_ncu_counter() -> None:
    claims = claims_ledger(synthetic_results())
    assert _status(claims, "good") == ("supported", "")
    assert _status(claims, "one_repeat")[0] == "caveated"
    assert "1 measurement(s), 3 needed" in _status(claims, "one_repeat")[1]
    assert "spread" in _status(claims, "noisy")[1] and _status(claims, "noisy")[0] == "caveated"
    assert "ncu time 40.0 us vs runner 30.0 us" in _status(claims, "ncu_off")[1]
    assert _status(claims, "no_ncu") == ("caveated", "no ncu profile of this case")
    assert "DRAM busy 20%" in _status(claims, "low_dram")[1]


def test_wrong_output_or_missed_target_rejects_and_missing_evidence_is_pending() -> None:
    claims = claims_ledger(synthetic_results())
    status, reason = _status(claims, "wrong")
    assert status == "rejected" and reason.startswith("correctness failed: 12 of 100")
    assert _status(claims, "slow") == ("rejected", "measured 70%, target >= 90%")
    status, reason = _status(claims, "skipped")
    assert status == "pending" and "time budget" in reason


def test_ratio_claims_use_the_comparators_repeated_medians() -> None:
    claims = claims_ledger(synthetic_results())
    good = next(c for c in claims if c.case == "good" and "torch_eager" in c.target)
    assert good.status == "supported" and good.value == pytest.approx(3.0)
    assert "3x the speed of torch_eager" in good.statement
    noisy = next(c for c in claims if c.case == "noisy" and "torch_eager" in c.target)
    assert noisy.status == "pending" and "comparator torch_eager not measured" in noisy.reason


def test_an_interpreter_run_leaves_every_correct_claim_pending() -> None:
    results = synthetic_results()
    results["info"]["meaningful"] = False
    claims = claims_ledger(results)
    assert {c.status for c in claims if c.case != "wrong"} == {"pending"}
    assert all("interpreter" in c.reason for c in claims if c.case == "good")


def test_report_writes_markdown_csv_and_plots_and_lists_the_misses(tmp_path: Path) -> None:
    summary = build_report(synthetic_results(), tmp_path, command="harnesslab lab --out x")
    assert summary.claims == {"supported": 2, "caveated": 5, "rejected": 2, "pending": 2}
    assert set(summary.files) >= {
        "report.md",
        "results.csv",
        "results.json",  # every report can be rebuilt from its own folder
        "copyish_perf.png",
        "copyish_speedup.png",
    }
    assert load_results(tmp_path / "results.json") == synthetic_results()
    for png in ("copyish_perf.png", "copyish_speedup.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert "## Claims ledger" in report and "## Misses against the targets" in report
    assert "measured 70%, target >= 90%" in report and "NOT MEANINGFUL" not in report
    assert "| good | " in report and "Launch-bound" in report
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[0].startswith("task,strategy,case") and len(lines) == 1 + 12
    assert any(len(m) and "slow" in m for m in summary.misses)


def test_report_from_an_interpreter_run_is_marked_not_meaningful(tmp_path: Path) -> None:
    results = synthetic_results()
    results["info"]["meaningful"] = False
    build_report(results, tmp_path)
    assert "NOT MEANINGFUL" in (tmp_path / "report.md").read_text()


def test_from_results_rebuilds_the_report_through_the_cli(tmp_path: Path, capsys) -> None:
    src = tmp_path / "results.json"
    src.write_text(json.dumps(synthetic_results()))
    assert cli_main(["lab", "--from-results", str(src), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "claims: 2 supported" in out
    assert "files in " in out and "report.md, results.csv, results.json" in out
    assert "{" not in out  # text mode prints text, not a raw {"files": [...]}
    assert (tmp_path / "rep" / "report.md").is_file()
    assert json.loads((tmp_path / "rep" / "results.json").read_text()) == synthetic_results()


def test_every_committed_lab_report_can_be_rebuilt_or_says_why_not() -> None:
    for folder in sorted(p.parent for p in (REPO / "docs" / "lab").glob("*/report.md")):
        raw = [folder / n for n in ("results.json", "lab_results.json") if (folder / n).is_file()]
        if raw:
            load_results(raw[0])
        else:
            note = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
            assert "cannot be rebuilt" in note, f"{folder.name}: no results.json and no note"


def test_cuda_against_triton_names_the_faster_language_per_case_and_ties_within_one_percent():
    """Rule: per case, the fastest passing CUDA solution (sol:cuda_*) against the fastest passing
    Triton strategy (baseline and the other solutions; torch and peers never count); ratio =
    Triton / CUDA, > 1: CUDA leads; within 1%: neither; a task without CUDA has no table."""
    res = synthetic_results()
    task = res["tasks"]["copyish"]
    task["strategies"] = ["baseline", "sol:fast", "sol:cuda_copyish", "torch_eager"]
    task["cases"] = ["a", "b", "c", "d"]
    res["rows"] = [
        _row("baseline", "a", 50.0), _row("sol:fast", "a", 40.0), _row("sol:cuda_copyish", "a", 20.0),
        _row("sol:fast", "b", 20.0), _row("sol:cuda_copyish", "b", 40.0),
        _row("torch_eager", "b", 10.0),  # faster, but not a harnesslab strategy
        _row("sol:fast", "c", 30.0), _row("sol:cuda_copyish", "c", 30.2),
        _row("sol:fast", "d", 30.0), _row("sol:cuda_copyish", "d", 5.0, passed=False),
    ]  # fmt: skip
    text = "\n".join(languages_section(res))
    assert "| a | 20.0 (`sol:cuda_copyish`) | 40.0 (`sol:fast`) | 2.00x | CUDA |" in text
    assert "| b | 40.0 (`sol:cuda_copyish`) | 20.0 (`sol:fast`) | 0.50x | Triton |" in text
    assert "| c |" in text and "| 0.99x | neither |" in text
    assert "| d | - | 30.0 | - | - |" in text
    assert "CUDA leads 1, Triton 1, neither (within 1%) 1 of the cases both passed." in text
    task["strategies"] = ["baseline", "sol:fast"]
    assert languages_section(res) == []


def test_the_copy_line_of_a_perf_plot_sits_below_the_top_border() -> None:
    assert perf_top([2900.0, 1200.0], 3000.0) >= 3000.0 * 1.1
    assert perf_top([3300.0], 3000.0) >= 3300.0 * 1.1
    assert perf_top([], None) > 0


def test_load_results_rejects_a_file_that_is_not_a_lab_run(tmp_path: Path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"status": "passed", "cases": []}))
    with pytest.raises(UsageError, match="not a lab results file"):
        load_results(bad)


def test_claim_cases_come_from_targets_and_the_large_case_floor() -> None:
    swiglu = LAB_GPU.read_task(REPO / "tasks" / "swiglu")
    assert LAB_GPU.claim_cases(swiglu) == [
        "4096x4096_fp16", "4096x11008_bf16", "8192x8192_fp16", "8192x3000_bf16", "8192x14336_bf16",
    ]  # fmt: skip
    matmul = LAB_GPU.read_task(REPO / "tasks" / "matmul")
    assert LAB_GPU.claim_cases(matmul) == ["4096x4096x4096_bf16", "8192x8192x8192_bf16"]
    assert LAB_GPU.comparators(matmul) == ["torch_eager"]
    rmsnorm = LAB_GPU.read_task(REPO / "tasks" / "rmsnorm_gate")
    assert "torch_compile" in LAB_GPU.comparators(rmsnorm)
    assert LAB_GPU.list_lab_tasks(REPO / "tasks") == [
        "decode_step",
        "matmul",
        "rmsnorm_gate",
        "softmax",
        "swiglu",
    ]


def test_best_strategy_ignores_torch_and_strategies_that_failed_a_case() -> None:
    rows = [_row("torch_eager", "a", 1.0), _row("sol:fast", "a", 10.0), _row("sol:x", "a", 5.0),
            _row("sol:x", "b", 5.0, passed=False), _row("sol:fast", "b", 10.0)]  # fmt: skip
    assert LAB_GPU.best_strategy(rows, ["a"]) == "sol:fast"


def test_stage_lab_copies_the_gpu_side_and_lab_argv_passes_the_options(tmp_path: Path) -> None:
    folder = stage_lab(tmp_path / "lab", ["swiglu"])
    assert (folder / "tools" / "runner.py").is_file() and (folder / "tools" / "lab.py").is_file()
    assert (folder / "tasks" / "swiglu" / "solutions" / "fast.py").is_file()
    assert not (folder / "tools" / "profile.py").exists()  # would shadow the stdlib's
    argv = lab_argv(
        "py", "/r", "/o", LabOptions(quick=True, ncu=False, max_cases=2), "auto", ["swiglu"]
    )
    assert argv[:2] == ["py", "/r/tools/lab.py"] and "--quick" in argv and "--no-ncu" in argv
    assert argv[argv.index("--max-cases") + 1] == "2"


FAKE_NCU = textwrap.dedent(
    """\
    #!{python}
    import json, subprocess, sys
    argv = sys.argv[1:]
    if argv[0] == "--query-metrics":
        print("sm__pipe_tensor_op_hmma_cycles_active  Counter")
        sys.exit(0)
    log = argv[argv.index("--log-file") + 1]
    metrics = argv[argv.index("--metrics") + 1].split(",")
    proc = subprocess.run(argv[argv.index("--log-file") + 2:], capture_output=True, text=True)
    head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
    rows, lid = [head], 0
    for line in proc.stdout.splitlines():
        if line.startswith('{{"ncu_case"'):
            for _ in range(json.loads(line)["calls"]):
                rows += [f'"{{lid}}","_k","{{m}}","ns","1,000"' for m in metrics]
                lid += 1
    open(log, "w").write("==PROF== Connected\\n" + "\\n".join(rows) + "\\n")
    sys.exit(proc.returncode)
    """
)


@pytest.mark.slow
def test_ncu_launches_are_attributed_to_cases_in_order(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bin").mkdir()
    ncu = tmp_path / "bin" / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable))
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    task = LAB_GPU.read_task(REPO / "tasks" / "swiglu")
    task["name"] = "swiglu"
    summary = {"best_strategy": "sol:fast", "claim_cases": ["4096x4096_fp16", "8192x3000_bf16"],
               "cases": [], "metric": "bandwidth"}  # fmt: skip

    class Args:
        ncu_calls, tasks_root, interpret = 2, REPO / "tasks", "always"

    rec = LAB_GPU.run_ncu(task, summary, Args, tmp_path, 120.0)
    assert rec.get("error") is None, rec.get("error")
    assert rec["launches"] == 4 and set(rec["by_case"]) == {"4096x4096_fp16", "8192x3000_bf16"}
    assert rec["by_case"]["8192x3000_bf16"]["gpu__time_duration.sum"]["value"] == 1000.0


@pytest.mark.slow
def test_harnesslab_lab_runs_end_to_end_on_the_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    out = tmp_path / "lab"
    proc = subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", "lab", "--tasks", "swiglu", "--max-cases",
         "3", "--interpret", "always", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["info"]["meaningful"] is False
    rows = [r for r in results["rows"] if r["strategy"] in ("baseline", "sol:fast", "torch_eager")]
    assert len(rows) == 3 * 3 and all(r["passed"] for r in rows)
    liger = [r for r in results["rows"] if r["strategy"] == "peer:liger"]  # on every case
    state = results["tasks"]["swiglu"]["peers"]["peer:liger"]["status"]
    assert len(liger) == 3 and state in ("ok", "missing", "failed")
    assert all(r["status"] == "missing" for r in liger) == (state == "missing")
    report = (out / "report.md").read_text()
    assert "NOT MEANINGFUL" in report and "| **pending** |" in report
    assert {"results.csv", "swiglu_perf.png", "swiglu_speedup.png"} <= {
        p.name for p in out.iterdir()
    }


PEER_OVERRIDE = textwrap.dedent(
    """

    def _absent():
        import harnesslab_no_such_kernel_package  # noqa: F401


    def _wrong():
        def run(a, b):
            return torch.zeros_like(a)

        return run


    PEERS = {"absent": ("no-such-package", _absent), "wrong": ("wrong-kernels", _wrong)}
    """
)


@pytest.mark.slow
def test_a_missing_peer_and_a_wrong_peer_each_show_as_such_in_the_results_and_report(
    tmp_path: Path,
) -> None:
    import shutil

    root = tmp_path / "tasks"
    shutil.copytree(REPO / "tasks" / "swiglu", root / "swiglu")
    ref = root / "swiglu" / "reference.py"
    ref.write_text(ref.read_text() + PEER_OVERRIDE)
    out = tmp_path / "out"
    rc = LAB_GPU.main(["--out", str(out), "--tasks", "swiglu", "--tasks-root", str(root),
                       "--max-cases", "1", "--interpret", "always", "--no-ncu", "--no-compile"])  # fmt: skip
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["strategy"]: r for r in results["rows"]}
    assert rows["peer:absent"]["status"] == "missing"
    assert "no-such-package not importable" in rows["peer:absent"]["reason"]
    assert rows["peer:wrong"]["status"] == "failed" and not rows["peer:wrong"]["passed"]
    assert "out of tolerance" in rows["peer:wrong"]["reason"]
    peers = results["tasks"]["swiglu"]["peers"]
    assert peers["peer:absent"]["status"] == "missing"
    assert peers["peer:wrong"]["status"] == "failed"
    build_report(results, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "`peer:absent` (no-such-package): **missing**" in report
    assert "`peer:wrong` (wrong-kernels): **failed**" in report


def test_claims_against_a_missing_or_failing_peer_are_pending_and_say_why() -> None:
    results = synthetic_results()
    results["rows"] += [
        _row("peer:gone", "good", 0.0, passed=False, status="missing", median_us=None,
             reason="missing: gone-pkg not importable here (ModuleNotFoundError: gone)"),
        _row("peer:bad", "good", 0.0, passed=False, status="failed", median_us=None,
             reason="3 of 10 elements out of tolerance"),
    ]  # fmt: skip
    summary = results["tasks"]["copyish"]
    summary["strategies"] += ["peer:gone", "peer:bad"]
    summary["targets"] += [
        {"kind": "ratio", "vs": "peer:gone", "min": 1.0, "cases": ["good"]},
        {"kind": "ratio", "vs": "peer:bad", "min": 1.0, "cases": ["good"]},
    ]
    claims = claims_ledger(results)
    gone = next(c for c in claims if "peer:gone" in c.target)
    bad = next(c for c in claims if "peer:bad" in c.target)
    assert gone.status == "pending" and "comparator peer:gone missing: " in gone.reason
    assert bad.status == "pending"
    assert "comparator peer:bad failed correctness: 3 of 10" in bad.reason

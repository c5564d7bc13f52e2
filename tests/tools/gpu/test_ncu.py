"""Nsight Compute's CSV and the lab's profiled run (tools/gpu/ncu.py), one test per rule: which
rows and columns of each page count, how launches are ordered and summarised, which metrics are
asked for, and how a run under ncu is attributed to cases or says why it cannot be. `ncu` here
is a stand-in script that writes the CSV a real one would."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harnesslab.tools.evaluation.profiling import summarize
from harnesslab.tools.gpu import ncu

DETAILS = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'


def details(*rows: tuple[str, str, str, str, str]) -> str:
    return "\n".join([DETAILS, *(",".join(f'"{c}"' for c in row) for row in rows)]) + "\n"


# -- the CSV ------------------------------------------------------------------------------------
def test_the_details_page_groups_metric_rows_by_launch_and_skips_foreign_lines() -> None:
    text = (
        "==PROF== Connected\nsome output\n"
        + details(
            ("0", "k", "gpu__time_duration.sum", "ns", "1,024"),
            ("0", "k", "launch__grid_size", "", "n/a"),
            ("1", "k2", "gpu__time_duration.sum", "ns", "2048"),
        )
        + DETAILS
        + "\n"
        + '"1","k2","short"\n'
    )  # a header repeated, a torn row: skipped
    assert ncu.parse_ncu_csv(text) == [
        {"id": "0", "kernel": "k", "metrics": {"gpu__time_duration.sum": [1024.0, "ns"],
                                               "launch__grid_size": [None, ""]}},
        {"id": "1", "kernel": "k2", "metrics": {"gpu__time_duration.sum": [2048.0, "ns"]}},
    ]  # fmt: skip


def test_no_csv_line_gives_no_launch() -> None:
    assert ncu.parse_ncu_csv("==PROF== nothing profiled\n") == []
    assert ncu.parse_ncu_csv("") == []


def test_launches_come_in_launch_order_a_non_numeric_id_first() -> None:
    text = details(
        ("10", "k", "m", "", "1"), ("9", "k", "m", "", "1"), ("x", "k", "m", "", "1"),
        ("2", "k", "m", "", "1"),
    )  # fmt: skip
    assert [x["id"] for x in ncu.parse_ncu_csv(text)] == ["x", "2", "9", "10"]
    text = details(("1", "k", "m", "", "1"), ("x", "k", "m", "", "1"), ("0", "k", "m", "", "1"))
    assert [x["id"] for x in ncu.parse_ncu_csv(text)] == ["x", "0", "1"]  # x counts as 0


def raw_page(names: list[str], units: list[str], *rows: list[str]) -> str:
    lines = [names, units, *rows]
    return "\n".join(",".join(f'"{c}"' for c in line) for line in lines) + "\n"


def test_the_raw_page_keeps_the_asked_metrics_with_their_units() -> None:
    text = raw_page(
        ["ID", "Kernel Name", "gpu__time_duration.sum", "other__metric", "launch__grid_size"],
        ["", "", "ns", "x", ""],
        ["1", "k", "2,000", "5", "64"],
        ["0", "k", "1000", "5", "32"],
        ["2", "k", "1"],  # torn: skipped
    )
    twins = raw_page(["ID", "Kernel Name", "gpu__time_duration.sum"], ["", "", "ns"],
                     ["0", "k", "5"], ["1", "k", "5"])  # fmt: skip
    assert [x["id"] for x in ncu.parse_ncu_csv(twins)] == ["0", "1"]  # one launch per ID
    assert ncu.parse_ncu_csv(text) == [
        {"id": "0", "kernel": "k", "metrics": {"gpu__time_duration.sum": [1000.0, "ns"],
                                               "launch__grid_size": [32.0, ""]}},
        {"id": "1", "kernel": "k", "metrics": {"gpu__time_duration.sum": [2000.0, "ns"],
                                               "launch__grid_size": [64.0, ""]}},
    ]  # fmt: skip
    assert ncu.parse_ncu_csv(text, ("other__metric",))[0]["metrics"] == {
        "other__metric": [5.0, "x"]
    }


def test_a_raw_page_without_kernel_names_or_all_units_still_parses() -> None:
    text = raw_page(["ID", "gpu__time_duration.sum", "launch__grid_size"], ["", "ns"],
                    ["0", "7", "8"])  # fmt: skip
    assert ncu.parse_ncu_csv(text) == [{"id": "0", "kernel": "?", "metrics": {
        "gpu__time_duration.sum": [7.0, "ns"], "launch__grid_size": [8.0, ""]}}]  # fmt: skip
    assert ncu.parse_ncu_csv(raw_page(["ID", "launch__grid_size"], [])) == []  # a header only


def test_every_metric_profile_kernel_reads_is_collected() -> None:
    # The raw page keeps only NCU_METRICS: a metric dropped from it is a field profile_kernel
    # (tools/evaluation/profiling.py) can no longer fill.
    names = [
        "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes.sum.per_second", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct", "launch__registers_per_thread",
        "launch__occupancy_limit_registers", "launch__grid_size", "launch__block_size",
        "smsp__sass_inst_executed_op_local_ld.sum", "smsp__sass_inst_executed_op_local_st.sum",
    ]  # fmt: skip
    values = [str(i + 1) for i in range(len(names))]
    text = raw_page(["ID", "Kernel Name", *names], ["", "", *[""] * len(names)],
                    ["0", "k", *values])  # fmt: skip
    (profile,) = summarize(ncu.parse_ncu_csv(text))
    fields = profile.model_dump() if hasattr(profile, "model_dump") else vars(profile)
    step_only = {"total_us", "share_pct"}  # a step task's torch.profiler rows fill these, not ncu
    assert step_only <= set(fields)
    assert None not in [v for k, v in fields.items() if k not in step_only]
    assert profile.local_memory_instructions == 11 + 12  # both kinds of local access
    assert ncu.LAB_METRICS == tuple(names[:5])


def test_a_summary_takes_the_median_of_the_launches_that_have_a_value() -> None:
    launches = [
        {"kernel": "k" * 200, "metrics": {"t": [3.0, "ns"], "g": [None, "x"]}},
        {"kernel": "other", "metrics": {"t": [1.0, "ns"]}},
        {"kernel": "other", "metrics": {"t": [None, "us"], "r": [4.0, "reg"]}},
        {"kernel": "other", "metrics": {"t": [100.0, "ns"]}},
    ]
    assert ncu.summarize_launches(launches) == {
        "kernel": "k" * 120,
        "g": {"value": None, "unit": "x"},
        "r": {"value": 4.0, "unit": "reg"},
        "t": {"value": 3.0, "unit": "ns"},
    }
    assert ncu.summarize_launches([]) == {"kernel": ""}


# -- the metrics asked for ------------------------------------------------------------------------
def script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


GMMA, HMMA, TENSOR = ncu.NCU_TENSOR


def lister(tmp_path: Path, names: list[str]) -> str:
    listed = "\n".join(n.split(".")[0] for n in names)
    return script(tmp_path / "ncu-list", f"""
        import sys
        if sys.argv[1:] == ["--query-metrics"]:
            print({listed!r})
        """)  # fmt: skip


def test_tensor_metrics_are_the_first_two_the_chip_lists(tmp_path: Path) -> None:
    lab = list(ncu.LAB_METRICS)
    assert ncu.ncu_metrics("unused", tensor=False) == lab
    both = ncu.ncu_metrics(lister(tmp_path, [GMMA, HMMA, TENSOR]), tensor=True)
    assert both == [*lab, GMMA, HMMA]
    assert ncu.ncu_metrics(lister(tmp_path, [HMMA, TENSOR]), tensor=True) == [*lab, HMMA, TENSOR]
    assert ncu.ncu_metrics(lister(tmp_path, [TENSOR, "dram__bytes"]), tensor=True) == [*lab, TENSOR]
    assert ncu.ncu_metrics(lister(tmp_path, ["dram__bytes"]), tensor=True) == lab


def test_without_a_list_of_metrics_the_hmma_one_is_guessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = list(ncu.LAB_METRICS)
    assert ncu.ncu_metrics(str(tmp_path / "missing"), tensor=True) == [*lab, HMMA]
    asked: list[dict] = []
    run = subprocess.run

    def bounded(*args, **kw):
        asked.append(kw)
        return run(*args, **kw)

    monkeypatch.setattr(subprocess, "run", bounded)
    quiet = script(tmp_path / "ncu-quiet", "pass\n")
    assert ncu.ncu_metrics(quiet, tensor=True) == [*lab, HMMA]
    assert asked[0]["timeout"] == 60  # a query that hangs is cut after a minute


def test_ncu_is_found_on_the_path_else_where_cuda_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = tmp_path / "bin"
    on_path.mkdir()
    exe = script(on_path / "ncu", "pass\n")
    monkeypatch.setenv("PATH", str(on_path))
    assert ncu.find_ncu() == exe
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    installed = tmp_path / "nsight-compute"
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [str(installed)])
    assert ncu.find_ncu() is None  # not there
    installed.write_text("")
    assert ncu.find_ncu() is None  # not executable
    script(installed, "pass\n")
    assert ncu.find_ncu() == str(installed)


# -- a run under ncu ------------------------------------------------------------------------------
FAKE_NCU = """
    import json, os, sys
    args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    conf = json.load(open(os.path.join(here, "conf.json")))
    log = args[args.index("--log-file") + 1]
    metrics = args[args.index("--metrics") + 1].split(",")
    with open(os.path.join(here, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps(args) + "\\n")
    if conf.get("nolog"):
        sys.exit(1)
    if conf.get("refuse") and any(m not in conf["refuse_unless"] for m in metrics):
        open(log, "w").write("==ERROR== Failed to find metric " + metrics[-1] + "\\n")
        sys.exit(1)
    rows = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for i, t in enumerate(conf["times"]):
        rows.append(f'"{i}","k","gpu__time_duration.sum","ns","{t}"')
    with open(log, "w", errors="surrogateescape") as fh:
        fh.write(conf.get("pad", "") + "\\n".join(rows) + "\\n")
    sys.stderr.write(conf.get("stderr", ""))
    sys.stdout.write(conf.get("stdout", ""))
    sys.exit(conf.get("rc", 0))
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir / "ncu", FAKE_NCU)
    monkeypatch.setenv("PATH", str(bin_dir))

    def configure(**conf) -> Path:
        (bin_dir / "conf.json").write_text(json.dumps(conf))
        return bin_dir / "calls.jsonl"

    return configure


def test_profiled_launches_are_attributed_to_cases_in_order(fake, tmp_path: Path) -> None:
    calls = fake(times=[1, 2, 3, 10, 20, 30])
    rec = ncu.profile(["target", "--x"], ["a", "b"], 3, tmp_path / "log.csv", 20, tensor=False)
    assert rec["rc"] == 0 and rec["launches"] == 6 and rec["metrics"] == list(ncu.LAB_METRICS)
    assert "error" not in rec and rec["csv"].startswith('"ID"')
    assert rec["by_case"]["a"]["gpu__time_duration.sum"] == {"value": 2.0, "unit": "ns"}
    assert rec["by_case"]["b"]["gpu__time_duration.sum"] == {"value": 20.0, "unit": "ns"}
    (args,) = [json.loads(x) for x in calls.read_text().splitlines()]
    assert args[:8] == ["--profile-from-start", "off", "--clock-control", "none", "--csv",
                        "--page", "details", "--print-units"]  # fmt: skip
    assert args[-2:] == ["target", "--x"]


def test_launches_that_do_not_match_cases_times_calls_are_not_attributed(
    fake, tmp_path: Path
) -> None:
    fake(times=[1, 2, 3], rc=3, stderr="E" * 3000 + "tail of stderr", stdout="out")
    rec = ncu.profile(["t"], ["a", "b"], 2, tmp_path / "log.csv", 20, tensor=False)
    assert "by_case" not in rec and rec["launches"] == 3 and rec["rc"] == 3
    assert rec["error"].startswith("3 profiled launches for 2 cases x 2 calls: cannot attribute")
    assert rec["error"].endswith("(rc=3): " + ("E" * 3000 + "tail of stderrout")[-300:])
    # what is kept of each stream: the last 2000 characters of stderr and 1000 of stdout
    fake(times=[1, 2, 3], rc=3, stderr="A" + " " * 2000, stdout="B" + " " * 1000)
    rec = ncu.profile(["t"], ["a", "b"], 2, tmp_path / "log.csv", 20, tensor=False)
    assert rec["error"].endswith("(rc=3): ")
    for stderr, stdout, kept in (("A" + " " * 1999, "", "A"), ("", "B" + " " * 999, "B")):
        fake(times=[1, 2, 3], rc=3, stderr=stderr, stdout=stdout)
        rec = ncu.profile(["t"], ["a", "b"], 2, tmp_path / "log.csv", 20, tensor=False)
        assert rec["error"].endswith("(rc=3): " + kept)
    fake(times=[])
    rec = ncu.profile(["t"], [], 2, tmp_path / "log.csv", 20, tensor=False)
    assert "by_case" not in rec and rec["error"].startswith("0 profiled launches")


def test_an_unknown_tensor_metric_is_dropped_and_the_run_tried_once_more(
    fake, tmp_path: Path
) -> None:
    calls = fake(times=[5], refuse=True, refuse_unless=list(ncu.LAB_METRICS))
    rec = ncu.profile(["t"], ["a"], 1, tmp_path / "log.csv", 20, tensor=True)
    assert rec["metrics"] == list(ncu.LAB_METRICS) and rec["by_case"]["a"]
    assert len(calls.read_text().splitlines()) == 2
    calls.unlink()
    fake(times=[5], refuse=True, refuse_unless=[])  # refused whatever it asks: two tries only
    rec = ncu.profile(["t"], ["a"], 1, tmp_path / "log.csv", 20, tensor=False)
    assert len(calls.read_text().splitlines()) == 2 and rec["launches"] == 0


def test_a_run_reads_only_its_own_log_whatever_its_bytes(fake, tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text(details(("0", "stale", "gpu__time_duration.sum", "ns", "1")))
    fake(nolog=True)
    assert ncu.profile(["t"], ["a"], 1, log, 20, tensor=False)["launches"] == 0
    fake(times=[7], pad="\udcff" + "=" * 500_000 + "\n")  # a byte that is no UTF-8, a long log
    rec = ncu.profile(["t"], ["a"], 1, log, 20, tensor=False)
    assert rec["launches"] == 1 and len(rec["csv"]) == 400_000


def test_no_ncu_or_under_twenty_seconds_is_not_profiled(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(times=[1])
    log = tmp_path / "log.csv"
    assert ncu.profile(["t"], ["a"], 1, log, 19.9, tensor=False) == {
        "error": "not profiled: time budget"}  # fmt: skip
    assert "by_case" in ncu.profile(["t"], ["a"], 1, log, 20, tensor=False)
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    assert ncu.profile(["t"], ["a"], 1, log, 60, tensor=False) == {
        "error": "not profiled: ncu not found"}  # fmt: skip


def test_a_run_past_its_budget_says_so(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(times=[1])
    seen: list[float] = []

    def slow(cmd, **kw):
        seen.append(kw["timeout"])
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", slow)
    rec = ncu.profile(["t"], ["a"], 1, tmp_path / "log.csv", 25, tensor=False)
    assert seen == [25] and rec["rc"] is None
    assert rec["error"].endswith("(rc=None): ncu timed out after 25s")

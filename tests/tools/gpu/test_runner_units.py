"""The runner's protocol loop and the Evaluator's rules in process (tools/gpu/runner.py), on the
CPU with a stand-in device: what decides a case's status and reason, which results a request
reports (cases, summary, configs), the refusals (a staged file that differs, an unknown mode).
Timing and the phases' accounting are timing.py's (tests/tools/gpu/test_timing_units.py), the
probe and profile modes diagnostics.py's (tests/tools/gpu/test_diagnostics_units.py); the runner
end to end through the launcher: tests/tools/gpu/test_runner.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import runner

REFERENCE = """
import torch

def make_inputs(shape, dtype, device, gen):
    x = torch.randn(shape["rows"], shape["dim"], generator=gen, device=device).to(dtype)
    return (x,), {}

def reference(x):
    return x.float() * 2

def output_spec(x):
    return tuple(x.shape), x.dtype

def bytes_moved(shape, elem):
    assert type(elem) is int
    return 2 * shape["rows"] * shape["dim"] * elem

def interpreter_shape(shape):
    return {**shape, "rows": min(shape["rows"], 4)}
"""

GOOD = "def run(x):\n    return x * 2\n"
CASES = [
    {"name": "a", "dtype": "float16", "shape": {"rows": 8, "dim": 16}},
    {"name": "b", "dtype": "float32", "shape": {"rows": 3, "dim": 32}},
]
TOL = {"float16": {"atol": 1e-2, "rtol": 1e-2}, "float32": {"atol": 1e-5, "rtol": 1e-5}}


class Torch:
    """torch, with a count of the CUDA cache's releases."""

    def __init__(self) -> None:
        self.released = 0
        self.generators: list[Any] = []
        self.seeded: list[Any] = []  # the generators handed out (initial_seed(): all 64 bits)
        self.cuda = type("cuda", (), {"empty_cache": lambda _: self._release()})()

    def _release(self) -> None:
        self.released += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def Generator(self, device: Any = "cpu") -> Any:  # noqa: N802 (torch's name)
        self.generators.append(device)
        self.seeded.append(torch.Generator(device="cpu"))
        return self.seeded[-1]


class FakeEnv:
    """The device: the CPU, with a count of syncs and a fixed copy bandwidth."""

    def __init__(self, interpret: bool = True, device: str = "cpu") -> None:
        self.torch, self.device, self.interpret = Torch(), device, interpret
        self.syncs, self.copies = 0, 0

    def sync(self) -> None:
        self.syncs += 1

    def copy_gbps(self) -> float:
        self.copies += 1
        return 12.5

    def info(self) -> dict[str, Any]:
        return {"device": "fake"}


@pytest.fixture
def out(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What the runner emits."""
    buf = io.StringIO()
    monkeypatch.setattr(runner, "_OUT", buf)
    return buf


def events(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def request(tmp_path: Path, kernel: str = GOOD, **more: Any) -> dict[str, Any]:
    (tmp_path / "ref").mkdir(exist_ok=True)
    (tmp_path / "ref" / "reference.py").write_text(REFERENCE)
    cand = tmp_path / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "kernel.py").write_text(kernel)
    req = {
        "reference": str(tmp_path / "ref" / "reference.py"),
        "tolerances": TOL,
        "cases": CASES,
        "entry": "kernel.py:run",
        "candidate_dir": str(cand),
        "config_file": "kernel_config.json",
        "seed": 5,
    }
    return {**req, **more}


def evaluator(tmp_path: Path, kernel: str = GOOD, env: FakeEnv | None = None, **more: Any) -> Any:
    return runner.Evaluator(env or FakeEnv(), request(tmp_path, kernel, **more))


# ----------------------------------------------------------------------------------------------
# one case's status


def test_a_right_kernel_passes_every_case_and_the_summary(tmp_path: Path, out: io.StringIO) -> None:
    ev = evaluator(tmp_path)
    res = ev.evaluate(ev.req["candidate_dir"], timing=False)
    assert res["status"] == "passed" and res["reason"] == ""
    assert [(c["name"], c["status"], c["passed"]) for c in res["cases"]] == [
        ("a", "passed", True), ("b", "passed", True)]  # fmt: skip
    assert res["cases"][0]["shape"] == {"rows": 4, "dim": 16}  # the interpreter's shape
    assert res["cases"][0]["rows"] == 4 and res["cases"][0]["dim"] == 16
    assert [e["name"] for e in events(out)] == ["a", "b"]
    assert all(e["event"] == "case" for e in events(out))
    assert set(res["phases_s"]) == {"load", "inputs", "correctness"} and 0 <= res["wall_s"] < 60
    first = res["cases"][0]
    assert (first["dtype"], first["reason"], first["max_abs_err"]) == ("float16", "", 0.0)
    assert ev.env.syncs == 2 * len(CASES)  # after the inputs, and after the call
    assert ev.case_timeout_s == 120.0
    assert set(ev.env.torch.generators) == {"cpu"}
    gpu = evaluator(tmp_path, env=FakeEnv(device="cuda:3"))
    gpu.ref = type(
        "Ref", (), {"make_inputs": staticmethod(lambda shape, dtype, device, gen: device)}
    )
    assert gpu.make({"rows": 1, "dim": 1}, torch.float32, salt=0) == "cuda:3"
    assert gpu.env.torch.generators == ["cuda:3"]  # inputs are drawn on the device


def test_the_allocator_is_poisoned_before_each_call(
    tmp_path: Path, out: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    poisoned: list[Any] = []
    monkeypatch.setattr(runner.correctness, "poison_allocator", lambda *a: poisoned.append(a))
    ev = evaluator(tmp_path, checks=2)
    ev.evaluate(ev.req["candidate_dir"], timing=False)
    assert poisoned == [(ev.torch, "cpu", 2 * 4 * 16)] * 2 + [(ev.torch, "cpu", 2 * 3 * 32)] * 2


@pytest.mark.parametrize(
    ("kernel", "status", "reason"),
    [
        ("def run(x):\n    return x * 3\n", "failed", "max abs err"),
        ("def run(x):\n    y = x * 2\n    x.zero_()\n    return y\n", "failed",
         "the candidate modified its inputs"),
        ("def run(x):\n    raise ValueError('boom')\n", "error", "ValueError at kernel.py:2: boom"),
        ("def run(x):\n    return (x * 2).float()\n", "failed", "wrong dtype"),
        ("def run(x):\n    y = x * 3\n    x.zero_()\n    return y\n", "failed", "max abs err"),
    ],
)  # fmt: skip
def test_what_decides_a_cases_status_and_reason(
    tmp_path: Path, out: io.StringIO, kernel: str, status: str, reason: str
) -> None:
    ev = evaluator(tmp_path, kernel)
    res = ev.evaluate(ev.req["candidate_dir"], timing=False)
    first = res["cases"][0]
    assert (first["status"], first["passed"]) == (status, False) and reason in first["reason"]
    assert res["status"] == "failed" and res["reason"] == f"a: {first['reason']}"
    assert res["score_us"] is None and res["geomean_pct_of_copy_bw"] is None


def test_a_case_past_its_deadline_times_out(tmp_path: Path, out: io.StringIO) -> None:
    kernel = "import time\ndef run(x):\n    time.sleep(5)\n"
    res = evaluator(tmp_path, kernel, case_timeout_s=0.3, cases=CASES[:1]).evaluate(
        str(tmp_path / "cand"), timing=False
    )
    assert [(c["status"], c["passed"]) for c in res["cases"]] == [("timeout", False)]
    assert res["cases"][0]["reason"] == "timeout: case exceeded 0s"


def test_every_check_draws_new_inputs(tmp_path: Path, out: io.StringIO) -> None:
    """A kernel that replays its first answer passes one check, not two."""
    replay = "seen = []\ndef run(x):\n    seen.append(x * 2)\n    return seen[0].clone()\n"
    for checks, status in ((None, "passed"), (1, "passed"), (2, "failed")):
        ev = evaluator(tmp_path, replay, **({} if checks is None else {"checks": checks}))
        runner.sys.modules.pop("_hl_candidate_" + runner.tree_hash(tmp_path / "cand"), None)
        res = ev.run_case(ev.load_candidate(ev.req["candidate_dir"])[0], CASES[1], 1,
                          ev.req["candidate_dir"], timing=False)  # fmt: skip
        assert res["status"] == status, res["reason"]


def test_inputs_are_seeded_by_the_request_the_case_and_the_salt(tmp_path: Path) -> None:
    ev = evaluator(tmp_path)
    shape = {"rows": 2, "dim": 8}
    draw = ev.make(shape, torch.float32, salt=3)[0][0]
    assert torch.equal(draw, ev.make(shape, torch.float32, salt=3)[0][0])
    assert not torch.equal(draw, ev.make(shape, torch.float32, salt=4)[0][0])
    want = torch.randn(2, 8, generator=torch.Generator().manual_seed(5 * 1_000_003 + 3))
    assert torch.equal(draw, want)
    other = evaluator(tmp_path, seed=6)
    assert not torch.equal(draw, other.make(shape, torch.float32, salt=3)[0][0])
    assert (
        evaluator(tmp_path, env=FakeEnv(interpret=False)).case_shape(CASES[0]) == CASES[0]["shape"]
    )
    req = request(tmp_path)
    del req["seed"]
    unseeded = runner.Evaluator(FakeEnv(), req).make(shape, torch.float32, salt=3)[0][0]
    assert torch.equal(unseeded, torch.randn(2, 8, generator=torch.Generator().manual_seed(3)))
    bigs = (-(-(2**63) // 1_000_003), 3**63 + 5)  # a product past 2**63 is cut to 63 bits
    assert any((big * 1_000_003 + 3) % 2**64 >= 2**63 for big in bigs)  # bit 63 set before
    for big in bigs:
        ev = evaluator(tmp_path, seed=big)
        drawn = ev.make(shape, torch.float32, salt=3)[0][0]
        seed = (big * 1_000_003 + 3) % 2**63
        assert torch.equal(drawn, torch.randn(2, 8, generator=torch.Generator().manual_seed(seed)))
        # what the device's generator is seeded with: the CPU's reads the low 32 bits only,
        # CUDA's Philox all 64, so bit 63 is pinned on the seed itself
        assert ev.env.torch.seeded[-1].initial_seed() == seed
    (tmp_path / "ref" / "plain.py").write_text(REFERENCE.split("def interpreter_shape")[0])
    plain = runner.Evaluator(
        FakeEnv(), {**request(tmp_path), "reference": str(tmp_path / "ref" / "plain.py")}
    )
    assert plain.case_shape(CASES[0]) == CASES[0]["shape"]


def test_timing_is_asked_with_the_requests_counts_and_the_case_inputs(
    tmp_path: Path, out: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    def time_case(env: Any, fn: Any, make: Any, nbytes: int, **kw: Any) -> dict[str, Any]:
        asked.append({"nbytes": nbytes, "inputs": make(2)[0][0], **kw})
        return {"median_us": 10.0 * len(asked), "pct_of_copy_bw": 25.0 * len(asked)}

    monkeypatch.setattr(runner.timing, "time_case", time_case)
    ev = evaluator(tmp_path, repeats=7, warmup=3, min_samples=4)
    res = ev.evaluate(ev.req["candidate_dir"])
    assert [a["nbytes"] for a in asked] == [2 * 4 * 16 * 2, 2 * 3 * 32 * 4]
    assert [(a["warmup"], a["samples"], a["floor"]) for a in asked] == [(3, 7, 4), (3, 7, 4)]
    assert asked[0]["phases"] is ev.phases
    want = ev.make({"rows": 4, "dim": 16}, torch.float16, salt=0 * 101 + 2)[0][0]
    assert torch.equal(asked[0]["inputs"], want)
    want = ev.make({"rows": 3, "dim": 32}, torch.float32, salt=1 * 101 + 2)[0][0]
    assert torch.equal(asked[1]["inputs"], want)
    assert res["score_us"] == 30.0 and res["geomean_pct_of_copy_bw"] == pytest.approx(
        (25 * 50) ** 0.5
    )
    assert "timing" in res["phases_s"]
    assert [e["median_us"] for e in events(out)] == [10.0, 20.0]
    asked.clear()
    evaluator(tmp_path, repeats=3, min_samples=9).evaluate(ev.req["candidate_dir"])
    assert next((a["warmup"], a["samples"], a["floor"]) for a in asked) == (10, 3, 3)
    asked.clear()
    evaluator(tmp_path, min_samples=0).evaluate(ev.req["candidate_dir"])
    assert next((a["samples"], a["floor"]) for a in asked) == (30, 1)
    asked.clear()
    evaluator(tmp_path).evaluate(ev.req["candidate_dir"])
    assert asked[0]["floor"] == min(runner.timing.MIN_SAMPLES, 30)


def test_a_candidate_that_does_not_import_fails_every_case(
    tmp_path: Path, out: io.StringIO
) -> None:
    for kernel, entry, why in (
        ("def run(x):\n    return x\n", "missing.py:run", "FileNotFoundError: missing.py not found"),
        ("def other(x):\n    return x\n", "kernel.py:run", "AttributeError: kernel.py defines no function run()"),
        ("def run(x:\n", "kernel.py:run", "SyntaxError at kernel.py:1"),
    ):  # fmt: skip
        out.truncate(0), out.seek(0)
        ev = evaluator(tmp_path, kernel, entry=entry)
        res = ev.evaluate(ev.req["candidate_dir"])
        assert res["status"] == "failed" and res["reason"].startswith("import failed: " + why)
        assert [(c["name"], c["status"], c["passed"], c["reason"]) for c in res["cases"]] == [
            (c["name"], "error", False, res["reason"]) for c in CASES]  # fmt: skip
        assert (
            res["cases"][0]["shape"] == CASES[0]["shape"] and res["cases"][1]["dtype"] == "float32"
        )
        assert [(e["event"], e["name"]) for e in events(out)] == [("case", "a"), ("case", "b")]


def test_an_entry_names_a_file_and_a_function_or_a_module_tasks_class(
    tmp_path: Path, out: io.StringIO
) -> None:
    ev = evaluator(tmp_path, "def run(x):\n    return x\n", entry="kernel.py:run:x")
    assert "defines no function run:x()" in ev.evaluate(str(tmp_path / "cand"))["reason"]
    assert " or class " not in ev.evaluate(str(tmp_path / "cand"))["reason"]
    (tmp_path / "ref" / "module.py").write_text(REFERENCE + "\nMODULE = {'init': {}}\n")
    ev = runner.Evaluator(
        FakeEnv(),
        {**request(tmp_path, "X = 1\n"), "reference": str(tmp_path / "ref" / "module.py")},
    )
    assert (
        "defines no function run() or class ModelNew"
        in ev.evaluate(str(tmp_path / "cand"))["reason"]
    )


def test_a_configs_private_copy_is_a_variant_folder(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, CONFIGURED, configs=[])
    fn, folder = ev.load_candidate(str(tmp_path / "cand"), {"k": 4})
    assert Path(folder).name.startswith("hl_variant_") and folder != str(tmp_path / "cand")
    assert fn(torch.ones(1)).item() == 4.0


def test_an_unchanged_candidate_is_imported_once_a_process_a_changed_one_or_a_config_again(
    tmp_path: Path,
) -> None:
    """Rule: a warm worker's requests share an unchanged candidate's module (its compiled
    kernels with it); new content, or a config's private copy, is imported afresh."""
    log = tmp_path / "imports.log"
    counting = f"open({str(log)!r}, 'a').write('x')\n" + CONFIGURED
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "kernel_config.json").write_text('{"k": 2}')
    first = evaluator(tmp_path, counting).load_candidate(str(tmp_path / "cand"))[0]
    again = evaluator(tmp_path, counting).load_candidate(str(tmp_path / "cand"))[0]
    assert log.read_text() == "x" and again is first
    (tmp_path / "cand" / "kernel_config.json").write_text('{"k": 3}')
    changed = evaluator(tmp_path, counting).load_candidate(str(tmp_path / "cand"))[0]
    assert log.read_text() == "xx" and changed(torch.ones(1)).item() == 3.0
    ev = evaluator(tmp_path, counting)
    for _ in range(2):
        assert ev.load_candidate(str(tmp_path / "cand"), {"k": 5})[0](torch.ones(1)).item() == 5
    assert log.read_text() == "xxxx"


def test_two_entry_files_of_one_folder_are_two_modules(tmp_path: Path) -> None:
    """The import cache's key is the folder's content and the entry file: a folder holding two
    solutions (a task's solutions/) gives each entry its own module."""
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "other.py").write_text("def run(x):\n    return x * 7\n")
    ev = evaluator(tmp_path, "def run(x):\n    return x * 2\n")
    first = ev.load_candidate(str(tmp_path / "cand"))[0]
    ev.req["entry"] = "other.py:run"
    other = ev.load_candidate(str(tmp_path / "cand"))[0]
    assert first(torch.ones(1)).item() == 2.0 and other(torch.ones(1)).item() == 7.0


def test_the_same_content_in_another_folder_is_imported_there(tmp_path: Path) -> None:
    """A failure's reason names the file it came from: a candidate copied to another folder
    (another workspace's stage) gets a module whose code is that folder's."""
    kernel = "def run(x):\n    raise ValueError('boom')\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ev = evaluator(tmp_path / "a", kernel)
    evaluator(tmp_path / "b", kernel).load_candidate(str(tmp_path / "b" / "cand"))
    res = ev.evaluate(ev.req["candidate_dir"], timing=False)
    assert "ValueError at kernel.py:2: boom" in res["cases"][0]["reason"]
    fn = ev.load_candidate(ev.req["candidate_dir"])[0]
    assert fn.__code__.co_filename.startswith(str(tmp_path / "a"))


def test_a_keyboard_interrupt_while_loading_is_not_a_failed_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = evaluator(tmp_path)
    monkeypatch.setattr(ev, "load_candidate", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(ev.req["candidate_dir"])


def test_the_summary_passes_only_a_nonempty_all_passed_list(tmp_path: Path) -> None:
    ev = evaluator(tmp_path)
    assert ev._summary([], 0.0)["status"] == "failed"
    ok = {"name": "a", "passed": True, "median_us": 2.0, "pct_of_copy_bw": 4.0}
    bad = {"name": "b", "passed": False, "reason": "wrong", "median_us": 3.0}
    assert ev._summary([ok], 0.0)["geomean_pct_of_copy_bw"] == 4.0
    s = ev._summary([ok, bad, {**bad, "name": "c"}], 0.0)
    assert (s["status"], s["score_us"], s["reason"]) == ("failed", None, "b: wrong")
    assert ev._summary([ok, bad], 0.0, error="import failed")["reason"] == "import failed"


# ----------------------------------------------------------------------------------------------
# sweeps and step traces


CONFIGURED = (
    "import json, os\n"
    "K = json.load(open(os.path.join(os.path.dirname(__file__), 'kernel_config.json')))['k']\n"
    "def run(x):\n    return x * K\n"
)


def test_a_sweep_scores_each_config_in_a_private_copy(tmp_path: Path, out: io.StringIO) -> None:
    ev = evaluator(tmp_path, CONFIGURED, configs=[{"k": 2}, {"k": 3}], compile_only=True)
    (tmp_path / "cand" / "kernel_config.json").write_text('{"k": 9}')
    res = ev.sweep()
    assert res["status"] == "passed"
    assert [(c["config"], c["status"]) for c in res["configs"]] == [({"k": 2}, "passed"), ({"k": 3}, "failed")]  # fmt: skip
    assert res["configs"][1]["reason"].startswith("a: ") and res["configs"][0]["score_us"] is None
    assert len(res["configs"][0]["cases"]) == 2 and 0 <= res["configs"][0]["wall_s"] < 60
    assert (tmp_path / "cand" / "kernel_config.json").read_text() == '{"k": 9}'
    configs = [e for e in events(out) if e["event"] == "config"]
    assert configs == [
        {"event": "config", "index": 0, "config": {"k": 2}, "status": "passed", "score_us": None, "reason": ""},
        {"event": "config", "index": 1, "config": {"k": 3}, "status": "failed", "score_us": None,
         "reason": res["configs"][1]["reason"]},
    ]  # fmt: skip
    assert (ev.req["warmup"], ev.req["repeats"], ev.req["min_samples"]) == (
        runner.SWEEP_WARMUP, runner.SWEEP_REPEATS, runner.SWEEP_MIN_SAMPLES)  # fmt: skip
    assert "timing" not in ev.phases


def test_a_sweep_times_unless_compile_only_and_keeps_the_requests_counts(
    tmp_path: Path, out: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[int] = []
    monkeypatch.setattr(runner.timing, "time_case",
                        lambda env, fn, make, nbytes, **kw: timed.append(kw["samples"]) or {"median_us": 1.0})  # fmt: skip
    res = evaluator(tmp_path, CONFIGURED, configs=[{"k": 2}], repeats=4).sweep()
    assert timed == [4, 4] and res["configs"][0]["score_us"] == 2.0


def test_step_traces_hand_over_or_fail_every_trace(
    tmp_path: Path, out: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = {"traces": [{"name": "t1", "dtype": "float16"}, {"name": "t2", "dtype": "bf16"}]}
    got: list[Any] = []

    def objective(torch_: Any, ref: Any, fn: Any, req: Any, **kw: Any) -> dict[str, Any]:
        got.append((torch_, ref, fn(torch.ones(1)), req, kw))
        return {"status": "passed", "score_us": 3.0, "cases": [], "reason": ""}

    monkeypatch.setattr(runner.step_trace, "objective", objective)
    env = FakeEnv()
    ev = evaluator(tmp_path, env=env, step=traces)
    res = ev.step_traces()
    assert res["status"] == "passed" and res["score_us"] == 3.0 and "traces" in res["phases_s"]
    t, ref, value, req, kw = got[0]
    assert t is env.torch and ref is ev.ref and value.item() == 2.0 and req is ev.req
    assert kw == {"interpret": True, "device": "cpu", "emit": runner.emit,
                  "candidate_dir": ev.req["candidate_dir"]}  # fmt: skip
    broken = evaluator(tmp_path, "def run(:\n", step=traces).step_traces()
    assert broken["status"] == "failed" and broken["score_us"] is None
    assert broken["reason"].startswith("import failed: SyntaxError") and 0 <= broken["wall_s"] < 60
    assert all(r["reason"] == broken["reason"] for r in broken["cases"])
    assert [(e["event"], e["name"]) for e in events(out)][-2:] == [("case", "t1"), ("case", "t2")]
    assert [(r["name"], r["dtype"], r["status"], r["passed"]) for r in broken["cases"]] == [
        ("t1", "float16", "error", False), ("t2", "bf16", "error", False)]  # fmt: skip
    sweep = evaluator(tmp_path, env=env, step=traces, configs=[{"k": 1}]).sweep()
    assert sweep["configs"][0]["score_us"] == 3.0 and len(got) == 2


# ----------------------------------------------------------------------------------------------
# the protocol loop


def test_a_staged_file_that_differs_is_refused(tmp_path: Path) -> None:
    scores = Path(runner.HERE) / "scores.py"
    digest = hashlib.sha256(scores.read_bytes()).hexdigest()
    runner.check_harness({"a/b/scores.py": digest})
    for bad in ({"scores.py": "0" * 64}, {"no_such_file.py": digest}):
        with pytest.raises(RuntimeError, match="does not match"):
            runner.check_harness(bad)
    with pytest.raises(RuntimeError, match="staged harness file scores.py"):
        runner.handle(FakeEnv(), {"mode": "health", "harness_sha256": {"scores.py": "0"}})


def test_health_measures_the_copy_bandwidth_unless_told_not_to() -> None:
    env = FakeEnv()
    res = runner.handle(env, {"mode": "health", "seed": 3, "request_id": "r1"})
    assert res["status"] == "passed" and res["copy_gbps"] == 12.5 and env.copies == 1
    assert (res["mode"], res["env"], res["seed"], res["request_id"]) == (
        "health",
        {"device": "fake"},
        3,
        "r1",
    )
    assert 0 <= res["runner_wall_s"] < 60
    assert "copy_gbps" not in runner.handle(env, {"mode": "health", "measure_copy": False})
    assert env.copies == 1


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        runner.handle(FakeEnv(), request(tmp_path, mode="nope"))


def test_evaluate_reports_the_copy_bandwidth_and_phases(
    tmp_path: Path, out: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = FakeEnv()
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(runner.timing, "time_case", lambda *a, **kw: {"median_us": 1.0})
    cache = tmp_path / "tc" / "sub"
    res = runner.handle(env, request(tmp_path, compile_only=True, triton_cache=str(cache)))
    assert res["status"] == "passed" and res["mode"] == "evaluate" and res["copy_gbps"] is None
    assert "copy_bandwidth" in res["phases_s"] and "load" in res["phases_s"] and env.copies == 0
    assert cache.is_dir() and os.environ["TRITON_CACHE_DIR"] == str(cache)
    res = runner.handle(
        env, request(tmp_path, mode="evaluate", config=None, triton_cache=str(cache))
    )
    assert res["copy_gbps"] == 12.5 and env.copies == 1
    res = runner.handle(env, request(tmp_path, mode="sweep", configs=[{"k": 1}]))
    assert res["copy_gbps"] == 12.5 and "copy_bandwidth" in res["phases_s"] and env.copies == 2
    assert env.torch.released == 0  # the CPU has no CUDA cache to give back
    monkeypatch.setitem(runner.MODES, "probe", lambda env, req, ev: {"status": "passed"})
    gpu = FakeEnv(device="cuda")
    runner.handle(gpu, request(tmp_path, mode="probe"))
    assert gpu.torch.released == 1
    res = runner.handle(gpu, request(tmp_path, mode="sweep", configs=[]))
    assert gpu.torch.released == 2 and "release" in res["phases_s"]
    assert (
        "release" not in runner.handle(env, request(tmp_path, mode="sweep", configs=[]))["phases_s"]
    )


def test_the_guarded_modes_never_get_the_dev_triton_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    seen: list[str] = []
    for mode in ("verify", "step_verify"):
        monkeypatch.setitem(runner.MODES, mode, lambda env, req, ev: seen.append(req["mode"]) or {"status": "passed"})  # fmt: skip
        res = runner.handle(
            FakeEnv(), request(tmp_path, mode=mode, triton_cache=str(tmp_path / "tc"))
        )
        assert res["status"] == "passed" and "copy_gbps" not in res and "phases_s" not in res
    assert seen == ["verify", "step_verify"]
    assert "TRITON_CACHE_DIR" not in os.environ and not (tmp_path / "tc").exists()
    monkeypatch.setitem(runner.MODES, "probe", lambda env, req, ev: {"status": "passed"})
    for cache in ("", 1, ["x"]):
        runner.handle(FakeEnv(), request(tmp_path, mode="probe", triton_cache=cache))
    assert "TRITON_CACHE_DIR" not in os.environ


# ----------------------------------------------------------------------------------------------
# plumbing


def test_load_module_and_tree_hash(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("X = 1\n")
    assert runner.load_module(tmp_path / "m.py", "_hl_test_m").X == 1
    assert sys.modules.pop("_hl_test_m").X == 1
    (tmp_path / "bad.py").write_text("raise KeyError('x')\n")
    with pytest.raises(KeyError):
        runner.load_module(tmp_path / "bad.py", "_hl_test_bad")
    assert "_hl_test_bad" not in sys.modules
    with pytest.raises(ImportError, match="cannot load"):
        runner.load_module(tmp_path / "m.txt", "_hl_test_txt")
    tree = tmp_path / "t"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.py").write_text("a")
    first = runner.tree_hash(tree)
    assert len(first) == 16 and first == runner.tree_hash(tree)
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "a.pyc").write_text("x")
    assert runner.tree_hash(tree) == first
    (tree / "sub" / "a.py").write_text("b")
    assert runner.tree_hash(tree) != first
    (tree / "sub" / "a.py").write_text("a")
    (tree / "sub" / "a.py").rename(tree / "a.py")
    assert runner.tree_hash(tree) != first
    want = hashlib.sha256(b"a.py\0a\0").hexdigest()[:16]
    assert runner.tree_hash(tree) == want


def test_emit_writes_one_json_line_and_nonfinite_floats_as_null(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    with os.fdopen(w, "w") as stream:  # buffered: the line is there only once flushed
        monkeypatch.setattr(runner, "_OUT", stream)
        runner.emit({"a": Path("x"), "b": 1})
        assert os.read(r, 100) == b'{"a": "x", "b": 1}\n'
    os.close(r)
    assert runner._json_default(float("inf")) is None and runner._json_default(float("nan")) is None
    assert runner._json_default(2.5) == "2.5"

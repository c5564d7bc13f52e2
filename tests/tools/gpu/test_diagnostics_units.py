"""The runner's modes without a score in process (tools/gpu/diagnostics.py), on the CPU with
test_runner_units' stand-in device: which probes run in which order and at which shapes, seeds
and tolerances, what a probe's row says (passed, failed, raised, timed out, not applicable), one
"probe" event per row; the profiler's target (warm-up outside the window, the window only on
CUDA, the bytes it reports); a step task's probes and profile handed over with the candidate.
The probe mode end to end through the launcher: tests/servers/test_task_server.py."""

from __future__ import annotations

import importlib
import io
import time
import types
import zlib
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from harnesslab.tests.tools.gpu.test_runner_units import GOOD, REFERENCE, FakeEnv, events, request
from harnesslab.tools import gpu
from harnesslab.tools.gpu import diagnostics, runner

# A task's own probes (a probe named like a suite edge replaces it) and their notes.
OWN = """
SEEDS = []
PROBE_NOTES = {"tiny": "a 2x3 input", "odd_dims": "the task's own odd sizes"}

def _tiny(dtype, device, gen):
    SEEDS.append(gen.initial_seed())
    return (torch.randn(2, 3, generator=gen).to(dtype),), {}

def _odd(dtype, device, gen):
    return (torch.ones(5, 7, dtype=dtype),), {}

PROBES = {"tiny": _tiny, "odd_dims": _odd}
"""
PROBED = REFERENCE + OWN


@pytest.fixture
def out(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What the runner emits (its protocol stream)."""
    stream = io.StringIO()
    monkeypatch.setattr(runner, "_OUT", stream)
    return stream


@pytest.fixture
def numerics(monkeypatch: pytest.MonkeyPatch) -> Any:
    """numerics.py by its plain name, as the probe mode imports it in the staged folder."""
    monkeypatch.syspath_prepend(str(gpu.FOLDER))
    return importlib.import_module("numerics")


def probed(tmp_path: Path, kernel: str = GOOD, env: FakeEnv | None = None, **more: Any) -> Any:
    req = request(tmp_path, kernel, **more)
    Path(req["reference"]).write_text(PROBED)
    return runner.Evaluator(env or FakeEnv(), req)


def rows(res: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["probe"], r["dtype"]) for r in res["probes"]]


class Suite:
    """numerics.Suite's stand-in: records what it was built with and asked for, hands out
    `edges` (name -> Edge) and records each generator's seed and device."""

    made: ClassVar[list[Any]] = []

    def __init__(self, torch: Any, ref: Any, device: str, cfg: Any, *, interpret: bool,
                 scale: Any) -> None:  # fmt: skip
        self.built = (torch, ref, device, cfg, interpret, scale)
        self.asked: list[tuple[Any, ...]] = []
        Suite.made.append(self)

    def names(self) -> list[str]:
        return ["odd_dims", "zeros"]

    def edge(self, name: str, shape: Any, dtype: Any, gen: Any, tol: Any) -> Any:
        self.asked.append((name, shape, dtype, gen.initial_seed(), tol))
        return self.edges[name](dtype)

    edges: ClassVar[dict[str, Any]] = {}


@pytest.fixture
def suite(numerics: Any, monkeypatch: pytest.MonkeyPatch) -> type[Suite]:
    Suite.made = []
    x = torch.ones(3, 4)
    Suite.edges = {
        "odd_dims": lambda dt: numerics.Edge("odd_dims", (x.to(dt),), {}, x.to(dt).float() * 2),
        "zeros": lambda dt: numerics.Edge("zeros", why="the reference raised ValueError"),
    }
    monkeypatch.setattr(numerics, "Suite", Suite)
    return Suite


# ----------------------------------------------------------------------------------------------
# probe: which probes, in which order


def test_task_probes_come_first_then_the_suite_each_for_every_dtype(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    ev = probed(tmp_path)
    res = diagnostics.probe(ev, runner.emit)
    suite = [n for n in numerics.NAMES if n != "odd_dims"]
    names = ["tiny", "odd_dims", *suite]
    assert rows(res) == [(n, d) for n in names for d in ("float16", "float32")]
    assert res["status"] == "passed" and all(r["passed"] for r in res["probes"])
    by = {(r["probe"], r["dtype"]): r for r in res["probes"]}
    assert by["tiny", "float16"]["note"] == "a 2x3 input"
    assert by["odd_dims", "float32"]["note"] == "the task's own odd sizes"  # the task's wins
    assert "family" not in by["odd_dims", "float32"]  # the task's probe, not the suite's edge
    assert by["odd_dims", "float32"]["shape"] == [5, 7]
    assert by["zeros", "float16"]["note"] == numerics.NOTES["zeros"]
    assert by["zeros", "float16"]["family"] == "zeros"
    # No hidden domain in the request: the long reduction has nothing to judge.
    long = by["long_reduction", "float16"]
    assert long["passed"] and long["reason"] == f"not applicable: {long['not_applicable']}"
    assert long["not_applicable"] == "the hidden domain declares no larger dims"
    assert events(out) == [{"event": "probe", **r} for r in res["probes"]]


def test_the_request_names_the_probes_the_dtypes_and_the_suites_skips(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    ev = probed(tmp_path, probes=["zeros", "tiny"], dtypes=["float32"])
    assert rows(diagnostics.probe(ev, runner.emit)) == [("zeros", "float32"), ("tiny", "float32")]
    ev = probed(tmp_path, numerics={"skip": ["zeros", "ties"]})
    names = {p for p, _ in rows(diagnostics.probe(ev, runner.emit))}
    assert names == {"tiny", *numerics.NAMES} - {"zeros", "ties"}


def test_a_suite_edge_runs_at_the_first_dev_case_of_its_dtype(
    tmp_path: Path, out: io.StringIO, suite: type[Suite]
) -> None:
    env = FakeEnv(device="cuda")  # the suite draws on the device (the stand-in's: the CPU)
    cases = [{"name": "h", "dtype": "float32", "shape": {"rows": 9, "dim": 8}},
             {"name": "f", "dtype": "float16", "shape": {"rows": 2, "dim": 16}},
             {"name": "g", "dtype": "float16", "shape": {"rows": 7, "dim": 4}}]  # fmt: skip
    tol = {**request(tmp_path)["tolerances"], "bfloat16": {"atol": 0.5, "rtol": 0.5}}
    ev = probed(tmp_path, env=env, cases=cases, tolerances=tol, numerics={"skip": ["x"]})
    ev.ref.PROBES.pop("odd_dims")  # the suite's odd_dims, not the task's
    res = diagnostics.probe(ev, runner.emit)
    (made,) = suite.made
    assert made.built[:5] == (env.torch, ev.ref, "cuda", {"skip": ["x"]}, True)
    assert made.built[5]({"rows": 9, "dim": 3}) == {"rows": 4, "dim": 3}  # the device's shape
    asked = {(name, str(dtype)): (shape, seed, t) for name, shape, dtype, seed, t in made.asked}
    seed = 5 + zlib.crc32(b"odd_dims") % 10_000  # the request's seed and the probe's name
    assert asked["odd_dims", "torch.float16"] == ({"rows": 2, "dim": 16}, seed, tol["float16"])
    assert asked["odd_dims", "torch.float32"] == ({"rows": 4, "dim": 8}, seed, tol["float32"])
    # No dev case of the dtype: the first case's shape.
    assert asked["odd_dims", "torch.bfloat16"] == ({"rows": 4, "dim": 8}, seed, tol["bfloat16"])
    # The task's probes draw on the CPU (3 dtypes of tiny), the suite's edges on the device.
    assert env.torch.generators == ["cpu"] * 3 + ["cuda"] * len(made.asked)
    assert rows(res)[-6:] == [(n, d) for n in ("odd_dims", "zeros")
                              for d in ("float16", "float32", "bfloat16")]  # fmt: skip


def test_without_dev_cases_a_suite_edge_gets_an_empty_shape(
    tmp_path: Path, out: io.StringIO, suite: type[Suite]
) -> None:
    ev = probed(tmp_path, env=FakeEnv(interpret=False), cases=[], probes=["odd_dims"],
                dtypes=["float16"])  # fmt: skip
    ev.ref.PROBES.pop("odd_dims")
    diagnostics.probe(ev, runner.emit)
    assert [a[1] for a in suite.made[0].asked] == [{}]


def test_a_task_probe_is_seeded_by_the_request_and_its_name(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    ev = probed(tmp_path, probes=["tiny"], dtypes=["float16"], seed=11)
    diagnostics.probe(ev, runner.emit)
    assert ev.ref.SEEDS == [11 + zlib.crc32(b"tiny") % 10_000]


# ----------------------------------------------------------------------------------------------
# probe: what a row says


def test_a_wrong_output_fails_its_row_with_the_error_and_the_tolerance_ratio(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    env = FakeEnv()
    ev = probed(tmp_path, "def run(x):\n    return x * 3\n", env=env, probes=["tiny", "zeros"],
                dtypes=["float32"])  # fmt: skip
    res = diagnostics.probe(ev, runner.emit)
    assert res["status"] == "failed"
    tiny, zeros = res["probes"]
    assert not tiny["passed"] and tiny["reason"].startswith("6 of 6 elements out of tolerance")
    assert tiny["shape"] == [2, 3] and tiny["max_abs_err"] > 0
    assert tiny["tolerance_ratio"] > 1
    assert not zeros["passed"] and zeros["family"] == "zeros"
    assert env.syncs == 2  # each call synchronized before its output is read


def test_a_right_output_passes_with_its_stats(tmp_path: Path, out: io.StringIO, numerics: Any):
    ev = probed(tmp_path, probes=["tiny"], dtypes=["float16"])
    (row,) = diagnostics.probe(ev, runner.emit)["probes"]
    assert row["passed"] is True and row["reason"] == "" and row["max_abs_err"] == 0.0
    assert row["tolerance_ratio"] == 0.0


def test_one_failed_row_fails_the_probe(tmp_path: Path, out: io.StringIO, numerics: Any):
    kernel = "def run(x):\n    return x * (2 if x.shape[0] == 2 else 3)\n"  # right on tiny only
    ev = probed(tmp_path, kernel, probes=["tiny", "odd_dims"], dtypes=["float32"])
    res = diagnostics.probe(ev, runner.emit)
    assert [r["passed"] for r in res["probes"]] == [True, False] and res["status"] == "failed"


def test_a_rows_shape_is_its_first_inputs(tmp_path: Path, out: io.StringIO, numerics: Any):
    ev = probed(tmp_path, "def run(x, w):\n    return x * 2\n", probes=["pair"],
                dtypes=["float32"])  # fmt: skip
    ev.ref.reference = lambda x, w: x.float() * 2
    ev.ref.output_spec = lambda x, w: (tuple(x.shape), x.dtype)
    ev.ref.PROBES["pair"] = lambda dtype, device, gen: ((torch.ones(2, 3), torch.ones(4)), {})
    (row,) = diagnostics.probe(ev, runner.emit)["probes"]
    assert row["passed"] and row["shape"] == [2, 3]


def test_a_nonfinite_tolerance_ratio_is_reported_as_none(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    kernel = "import torch\ndef run(x):\n    return torch.full_like(x, float('nan'))\n"
    ev = probed(tmp_path, kernel, probes=["tiny"], dtypes=["float32"])
    (row,) = diagnostics.probe(ev, runner.emit)["probes"]
    assert not row["passed"] and row["tolerance_ratio"] is None


def test_a_raising_candidate_fails_its_row_at_its_own_line(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    kernel = "def run(x):\n    raise ValueError('boom')\n"
    ev = probed(tmp_path, kernel, probes=["tiny", "odd_dims"], dtypes=["float16"])
    res = diagnostics.probe(ev, runner.emit)
    assert [r["reason"] for r in res["probes"]] == ["ValueError at kernel.py:2: boom"] * 2
    assert res["status"] == "failed" and not any(r["passed"] for r in res["probes"])


def test_an_inapplicable_edge_passes_with_why(
    tmp_path: Path, out: io.StringIO, suite: type[Suite], numerics: Any
) -> None:
    ev = probed(tmp_path, "def run(x):\n    raise ValueError('never called')\n",
                probes=["zeros"], dtypes=["float16"])  # fmt: skip
    res = diagnostics.probe(ev, runner.emit)
    assert res["status"] == "passed"
    assert res["probes"] == [{"probe": "zeros", "dtype": "float16",
                              "note": numerics.NOTES["zeros"], "family": "zeros",
                              "not_applicable": "the reference raised ValueError",
                              "passed": True,
                              "reason": "not applicable: the reference raised ValueError"}]  # fmt: skip


def test_a_probe_past_the_case_deadline_fails_as_a_timeout(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    kernel = "import time\ndef run(x):\n    time.sleep(3)\n    return x * 2\n"
    ev = probed(tmp_path, kernel, probes=["tiny"], dtypes=["float16"], case_timeout_s=0.2)
    started = time.monotonic()
    (row,) = diagnostics.probe(ev, runner.emit)["probes"]
    assert time.monotonic() - started < 2.5
    assert not row["passed"] and row["reason"].startswith("timeout: case exceeded")


def test_the_runner_hands_the_probe_mode_its_protocol_stream(
    tmp_path: Path, out: io.StringIO, numerics: Any
) -> None:
    res = runner.handle(FakeEnv(), request(tmp_path, mode="probe", probes=["zeros"],
                                           dtypes=["float32"]))  # fmt: skip
    assert res["mode"] == "probe" and rows(res) == [("zeros", "float32")]
    assert [e["event"] for e in events(out)] == ["probe"]


# ----------------------------------------------------------------------------------------------
# a step task's probes and profile: handed over


def test_a_step_tasks_probes_and_profile_are_handed_the_loaded_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = FakeEnv(interpret=False)
    ev = runner.Evaluator(env, request(tmp_path, step={"traces": []}))
    seen: list[Any] = []

    def run(*args: Any, **kw: Any) -> dict[str, Any]:
        seen.append((args, kw))
        return {"status": "probed"}

    def profile(*args: Any, **kw: Any) -> dict[str, Any]:
        seen.append((args, kw))
        return {"status": "profiled"}

    monkeypatch.setattr(diagnostics.step_probe, "run", run)
    monkeypatch.setattr(diagnostics.step_profile, "profile", profile)
    emit = seen.append
    assert diagnostics.probe(ev, emit) == {"status": "probed"}
    assert diagnostics.profile_step(ev) == {"status": "profiled"}
    cand = str(tmp_path / "cand")
    for (args, kw), more in zip(seen, ({"emit": emit}, {}), strict=True):
        assert args[:2] == (env.torch, ev.ref) and args[2](torch.ones(2)).tolist() == [2.0, 2.0]
        assert args[3] is ev.req
        assert kw == {"interpret": False, "device": "cpu", "candidate_dir": cand, **more}


# ----------------------------------------------------------------------------------------------
# profile_target


class Calls:
    """A candidate that logs its calls (and the profiler's start and stop) in one list."""

    def __init__(self) -> None:
        self.log: list[Any] = []

    def __call__(self, x: Any) -> Any:
        self.log.append(("call", x))
        return x


def profiling(tmp_path: Path, device: str, **more: Any) -> tuple[Any, Calls, FakeEnv]:
    env = FakeEnv(device=device)
    ev = runner.Evaluator(env, request(tmp_path, **more))
    calls = Calls()
    ev.load_candidate = lambda folder, config=None: (calls, folder)  # type: ignore[method-assign]
    made: ClassVar[list[Any]] = []

    def make(shape: Any, dtype: Any, salt: int) -> Any:
        made.append((shape, dtype, salt))
        return (f"x{salt}",), {}

    ev.make = make  # type: ignore[method-assign]
    env.sync = lambda: calls.log.append("sync")  # type: ignore[method-assign]
    profiler = types.SimpleNamespace(start=lambda: calls.log.append("start"),
                                     stop=lambda: calls.log.append("stop"))  # fmt: skip
    env.torch.cuda = types.SimpleNamespace(profiler=profiler)
    calls.made = made  # type: ignore[attr-defined]
    return ev, calls, env


def test_the_profile_window_holds_only_the_steady_state_calls_on_cuda(tmp_path: Path) -> None:
    ev, calls, _ = profiling(tmp_path, "cuda", warmup=1, repeats=2)
    res = diagnostics.profile_target(ev)
    x = ("call", "x7")
    assert calls.log == [x, "sync", "start", x, x, "sync", "stop"]
    assert calls.made == [({"rows": 4, "dim": 16}, torch.float16, 7)]  # type: ignore[attr-defined]
    assert res == {"status": "passed", "case": "a", "shape": {"rows": 4, "dim": 16}, "calls": 2,
                   "bytes": 2 * 4 * 16 * 2, "profiled": True}  # fmt: skip


def test_off_cuda_nothing_is_profiled_and_the_defaults_are_two_warmups_and_three_calls(
    tmp_path: Path,
) -> None:
    cases = [{"name": "b", "dtype": "float32", "shape": {"rows": 3, "dim": 32}}]
    ev, calls, _ = profiling(tmp_path, "cpu", cases=cases)
    res = diagnostics.profile_target(ev)
    x = ("call", "x7")
    assert calls.log == [x, x, "sync", x, x, x, "sync"]
    assert res == {"status": "passed", "case": "b", "shape": {"rows": 3, "dim": 32}, "calls": 3,
                   "bytes": 2 * 3 * 32 * 4, "profiled": False}  # fmt: skip
    assert type(res["bytes"]) is int

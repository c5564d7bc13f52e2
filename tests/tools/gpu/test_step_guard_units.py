"""The step verify's trusted parent (tools/gpu/verify/step_guard.py) in process, rule by rule:
StepVerify.run over hidden traces with the real step child (step_child.StepChild) answering in
this interpreter through a pipe, where the sandboxed process would (tests/tools/integrity/
test_step_cheats.py runs that one). What it certifies: every checked step's logits, the lengths
left alone, the cache after each pass, the first failure ending the trace and the verify, and the
child's failures (its import, a crash or a hang: KidFailed) as the result's error, and the
fresh-process rule of verify(). With an incumbent (`baseline_dir`): its own process and arena,
timed beside the candidate on every trace the candidate passed, and its failures its own. The
arena itself: test_step_arena.py."""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from harnesslab.tests.tools.gpu.step_support import expected_lengths
from harnesslab.tools.gpu import runner, step_trace, wire
from harnesslab.tools.gpu.verify import step_guard
from harnesslab.tools.gpu.verify.guard_kid import KidFailed
from harnesslab.tools.gpu.verify.step_child import StepChild
from harnesslab.tools.gpu.verify.step_replay import StepReplay
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
EAGER = TASK.workspace_template / "kernel.py"
TRACES = TASK.step.hidden("units")  # type: ignore[union-attr]
STEPS = {"final0_float16": 6, "final1_float16": 9}  # the interpreter's sizes


class InProcessKid:
    """guard_kid.Kid's surface over a StepChild in this process: each request handled at once,
    its reply read back from the child's pipe. `fail_at`: the op at which the process "dies"."""

    fail_at, fail_after = "", 0
    role = "candidate"

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.child: Any = None
        self.ops: list[str] = []
        self.lengths: list[list[int]] = []  # each checked step's lengths, as the parent sent them
        self.tokens: list[list[int]] = []  # ... and the arena's tokens then
        self.embeds: list[Any] = []  # each trace's embedding weights, as the arena held them
        self.closed = False

    def started(self) -> dict[str, Any]:
        return {"level": "none"}

    def send(self, msg: dict[str, Any]) -> None:
        """The config (the first message), or a request whose reply() comes later: handled
        then (after what the parent did in between)."""
        if self.child is not None:
            self.ops.append(f"send:{msg['op']}")
            self.pending = msg
            return
        self.cfg = msg
        threads = torch.get_num_threads()  # the child's setting is its own process's
        self.child = StepChild(msg, self.w)
        torch.set_num_threads(threads)

    def reply(self, t0: float, **_: Any) -> tuple[dict[str, Any], float]:
        return self.ask(self.pending)

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        assert self.child is not None
        self.ops.append(msg["op"])
        if msg["op"] == "step":
            self.lengths.append(list(msg["host_lengths"]))
            self.tokens.append(self.child.views["tokens"].tolist())
        if msg["op"] == self.fail_at and self.ops.count(self.fail_at) > self.fail_after:
            raise KidFailed("candidate_crashed", "the process died", self.role)
        t0 = time.perf_counter()
        self.handlers()[msg["op"]](msg)
        reply = wire.recv(self.r, timeout_s=5), (time.perf_counter() - t0) * 1e6
        if msg["op"] == "trace":
            self.embeds.append(self.child.views["w.embed"].clone())
        return self.lie(msg["op"], reply[0]), reply[1]

    def handlers(self) -> dict[str, Any]:
        return {"load": self.child.load, "arena": self.child.map_arena,
                "trace": self.child.trace, "step": self.child.step,
                "timed_step": self.child.timed_step}  # fmt: skip

    def lie(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        return reply

    def close(self) -> None:
        self.closed = True
        os.close(self.r)
        os.close(self.w)

    def ask_exit(self) -> None:  # guard_kid.close_all's two halves: exit asked, then reaped
        pass

    def reap(self) -> None:
        self.close()


class InProcessReplayKid(InProcessKid):
    """A role's replay process (step_replay.StepReplay) the same way; `frozen` (the test's
    stand-in for guard_kid.frozen) says whether the candidates' processes are stopped now."""

    frozen: ClassVar[list[bool]] = []

    def send(self, msg: dict[str, Any]) -> None:
        threads = torch.get_num_threads()
        self.cfg, self.child = msg, StepReplay(msg, self.w)
        torch.set_num_threads(threads)

    def handlers(self) -> dict[str, Any]:
        rep = self.child
        if self.ops[-1] == "timed_step":
            self.frozen_then.append(bool(self.frozen and self.frozen[-1]))
        return {"arena": rep.map_arena, "trace": rep.trace, "program": rep.program,
                "prepare": rep.prepare, "drop": lambda msg: rep.drop(msg, reply=True),
                "step": rep.step, "timed_step": rep.timed_step}  # fmt: skip


def request(cand: Path, traces: list[dict[str, Any]] | None = None,
            baseline: Path | None = None, replay: str = "gpu") -> dict[str, Any]:  # fmt: skip
    spec = TASK.step.request()  # type: ignore[union-attr]
    return {"seed": 5, "nonce": "n-1", "reference": str(TASK.root / "reference.py"),
            "candidate_dir": str(cand), "entry": "kernel.py:step", "case_timeout_s": 60,
            "step": {**spec, "traces": traces if traces is not None else TRACES[:2],
                     "replay": replay},
            "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()},
            **({"baseline_dir": str(baseline)} if baseline else {})}  # fmt: skip


class Run:
    def __init__(self, result: dict[str, Any], kid: InProcessKid, events: list[dict[str, Any]],
                 verify: step_guard.StepVerify, inc: InProcessKid | None = None,
                 replayers: dict[str, InProcessReplayKid] | None = None) -> None:  # fmt: skip
        self.result, self.kid, self.events, self.verify = result, kid, events, verify
        self.inc = inc  # the incumbent's kid, when the request named one
        self.replayers = replayers or {}  # the roles' replay kids, with step.replay on


@pytest.fixture
def verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """verify(kernel source, kid type, traces) -> Run: StepVerify.run on the CPU interpreter."""
    monkeypatch.setattr(step_guard, "stage_root", lambda: str(tmp_path / "stage"))
    threads = torch.get_num_threads()

    def folder(source: str) -> Path:
        cand = tmp_path / f"cand{len(list(tmp_path.iterdir()))}"
        cand.mkdir()
        (cand / "kernel.py").write_text(source)
        return cand

    def run(source: str, kid_type: type = InProcessKid, traces=None, sync=None,
            incumbent: str | None = None, inc_type: type = InProcessKid,
            replay: str = "gpu") -> Run:  # fmt: skip
        """`incumbent`: a staged incumbent's kernel.py (its kid an `inc_type`); `replay`: the
        request's step.replay ("always": the roles' replay kids time the timed pass)."""
        cand = folder(source)
        baseline = folder(incumbent) if incumbent is not None else None
        events: list[dict[str, Any]] = []
        rt = types.SimpleNamespace(load_module=runner.load_module, Phases=runner.Phases,
                                   compare=runner.compare, emit=events.append)  # fmt: skip
        env = types.SimpleNamespace(device="cpu", interpret=True, torch=torch)
        v = step_guard.StepVerify(env, request(cand, traces, baseline, replay), rt)
        kids = {"candidate": kid_type(), "incumbent": inc_type()}
        replayers = {"candidate": InProcessReplayKid(), "incumbent": InProcessReplayKid()}
        for role in kids:
            kids[role].role = replayers[role].role = role
            replayers[role].frozen_then = []

        def kid_of(role: str, folder: str | None, memfd: int) -> InProcessKid:
            kid = kids[role] if folder else replayers[role]
            kid.memfd = memfd  # the one descriptor its process would inherit
            return kid

        v.candidate_kid = kid_of  # type: ignore[method-assign]
        if sync is not None:  # a GPU's synchronize (sync(kid)), on the CPU's arena
            v.sync = lambda: sync(kids["candidate"])
        inc = kids["incumbent"] if incumbent is not None else None
        return Run(v.run(), kids["candidate"], events, v, inc, replayers)

    yield run
    torch.set_num_threads(threads)
    for name in ("_hl_candidate", "_hl_step_reference", "_hl_step_verify_reference"):
        sys.modules.pop(name, None)


def kernel(body: str) -> str:
    """The eager step renamed _honest, and a step built on it."""
    return EAGER.read_text().replace("\ndef step(state", "\ndef _honest(state") + body


def test_an_honest_step_is_checked_on_every_step_of_both_passes_and_timed(verify) -> None:
    run = verify(EAGER.read_text())
    res = run.result
    assert res["status"] == "measured" and res["certifies"] == "step_outputs"
    assert res["nonce"] == "n-1" and res["load"] == {"candidate": {"ok": True}}
    assert res["sandbox"] == {"candidate": {"level": "none"}} and res["wall_s"] > 0
    assert "error" not in res
    # where the seconds went (operator-side evidence): every phase ran, within the wall time
    assert set(res["phases_s"]) == {"start", "state", "reference", "poison", "candidate",
                                    "compare", "timed"}  # fmt: skip
    assert 0 < sum(res["phases_s"].values()) <= res["wall_s"]
    rows = res["cases"]
    assert [r["name"] for r in rows] == list(STEPS) and [r["dtype"] for r in rows] == [
        "float16"
    ] * 2
    for r in rows:
        assert r["codes"] == [] and r["steps_checked"] == 2 * STEPS[r["name"]]
        assert r["steps_timed"] == STEPS[r["name"]] and 0 < r["p50_us"] <= r["p95_us"]
        assert 0 <= r["max_abs_err"] < 0.05
    assert run.events == [{"event": "case", "index": 0, "status": "measured"},
                          {"event": "case", "index": 1, "status": "measured"}]  # fmt: skip
    # the child got the arena's size, one trace request per trace, a step per checked step
    ops = run.kid.ops
    assert ops[:3] == ["send:load", "load", "arena"] and ops.count("trace") == 2
    assert ops.count("step") == 2 * sum(STEPS.values())
    assert ops.count("timed_step") == sum(STEPS.values())
    assert "push" not in ops and "pull" not in ops  # no untimed turn after a poison
    assert run.kid.cfg == {"device": "cpu", "candidate_dir": run.verify.req["candidate_dir"],
                           "entry": "kernel.py:step", "reference": str(TASK.root / "reference.py"),
                           "memfd": run.kid.cfg["memfd"], "record": False}  # fmt: skip
    assert run.kid.closed
    # each checked step carried the lengths its trace gives it (prompts written, then one a step)
    spec = TASK.step.request()  # type: ignore[union-attr]
    want = []
    for t in TRACES[:2]:
        config, trace = step_trace.sized(run.verify.ref, spec, t, True)
        want += expected_lengths(trace, config.batch) * 2
    assert run.kid.lengths == want
    # each trace's weights are its own draw from the verify's seed
    assert len(run.kid.embeds) == 2 and not torch.equal(*run.kid.embeds)
    assert res["wall_s"] < 600
    with pytest.raises(OSError):  # the arena's memfd is closed
        os.fstat(run.kid.cfg["memfd"])


def test_the_input_seed_mixes_the_requests_with_fresh_randomness(verify) -> None:
    seeds = {
        verify("def step(s, t):\n    raise ValueError\n").result["input_seed"] for _ in range(2)
    }
    assert len(seeds) == 2 and 5 not in seeds and all(0 < s < 1 << 60 for s in seeds)


@pytest.mark.parametrize(
    ("body", "code", "where"),
    [("\ndef step(state, tokens):\n    return _honest(state, tokens) + 1.0\n", "wrong_output",
      "pass 0 step 0: logits: output out of tolerance"),
     ("\ndef step(state, tokens):\n    return _honest(state, tokens).float()\n", "wrong_shape",
      "pass 0 step 0: the logits are not a plain tensor"),
     ("\ndef step(state, tokens):\n    raise ValueError('mine')\n", "candidate_error",
      "pass 0 step 0: the step raised ValueError"),
     ("\ndef step(state, tokens):\n    out = _honest(state, tokens)\n    state.lengths += 1\n"
      "    return out\n", "lengths_modified", "pass 0 step 0: the step changed the lengths"),
     ("\nCALLS = []\n\n\ndef step(state, tokens):\n    CALLS.append(1)\n"
      "    out = _honest(state, tokens)\n    return out.fill_(float('nan')) if len(CALLS) == 2 else out\n",
      "wrong_output", "pass 0 step 1: logits: output has NaN")],
)  # fmt: skip
def test_a_checked_step_that_fails_is_the_traces_reason_and_ends_the_verify(
    verify, body, code, where
) -> None:
    run = verify(kernel(body))
    (row,) = run.result["cases"]  # the second trace never ran
    assert [c[0] for c in row["codes"]] == [code], row["codes"]
    assert row["codes"][0][1].startswith(f"final0_float16: {where}")
    assert "p50_us" not in row and "timed_step" not in run.kid.ops
    assert run.kid.ops[-1] == "step" and row["steps_checked"] == int(where.split()[3][:1])


def test_a_cache_the_step_never_writes_fails_after_the_first_pass(verify) -> None:
    corpus = Path(step_guard.__file__).parents[2] / "integrity" / "cheats" / "step"
    run = verify((corpus / "unwritten_kv_cache.py").read_text())
    (row,) = run.result["cases"]
    assert [c[0] for c in row["codes"]] == ["wrong_kv_cache"]
    assert row["codes"][0][1].startswith("final0_float16: after pass 0: the cache's valid slots")
    assert row["steps_checked"] == STEPS["final0_float16"] and "pull" not in run.kid.ops


def test_a_step_wrong_only_in_the_second_pass_is_caught_there(verify) -> None:
    body = """
CALLS = []


def step(state, tokens):
    CALLS.append(1)
    out = _honest(state, tokens)
    return out + 1.0 if len(CALLS) > 6 else out
"""
    run = verify(kernel(body))
    (row,) = run.result["cases"]
    assert row["codes"][0][0] == "wrong_output" and "pass 1 step 0" in row["codes"][0][1]
    assert row["steps_checked"] == 6


def test_on_a_gpu_the_poison_tokens_and_nan_slot_are_synchronised_before_each_step(verify) -> None:
    """The parent's writes into the device arena are queued work of its own device: each step's
    request goes only after a synchronize that found them all in place (the child's step, in
    another process, must not start before the poison lands)."""
    seen: list[tuple[int, bool, bool]] = []

    def sync(kid) -> None:  # what the arena held at each synchronize, after how many requests
        views = kid.child.views if kid.child is not None else {}
        if views:
            stale = views["kv_cache"][:, 1, 0, :, int(views["lengths"][0]) :]  # sequence 0's
            seen.append((len(kid.ops), bool(views["logits"].isnan().all()),
                         bool((stale == step_trace.POISON).all())))  # fmt: skip

    run = verify(EAGER.read_text(), sync=sync, traces=TRACES[:1])
    assert run.result["cases"][0]["codes"] == []
    steps = [i for i, op in enumerate(run.kid.ops) if op == "step"]
    assert len(steps) == 2 * STEPS["final0_float16"]
    for i in steps:  # the last synchronize before the request (sent at i - 1, its reply read
        # at i): the slot NaN, the stale poisoned
        last = [s for s in seen if s[0] == i - 1][-1]
        assert last[1:] == (True, True), (i, last)


def test_the_reference_runs_while_the_child_steps(verify, monkeypatch) -> None:
    """In a checked pass the request goes, the reference's step runs here, and only then is the
    reply awaited: the two overlap (the child's step in its own process)."""
    load = runner.load_module

    def loading(path, name):
        mod = load(path, name)
        if name == "_hl_step_verify_reference":
            inner = mod.reference_step

            def logged(state, tokens):
                Logged.current.ops.append("reference")
                return inner(state, tokens)

            mod.reference_step = logged
        return mod

    class Logged(InProcessKid):
        current: ClassVar[Any] = None

        def __init__(self) -> None:
            super().__init__()
            Logged.current = self

    monkeypatch.setattr(runner, "load_module", loading)
    run = verify(EAGER.read_text(), Logged, traces=TRACES[:1])
    assert run.result["cases"][0]["codes"] == []
    ops = [o for o in run.kid.ops if o in ("send:step", "reference", "step")]
    checked = 2 * STEPS["final0_float16"]
    assert ops[: 3 * checked] == ["send:step", "reference", "step"] * checked


def test_a_candidate_that_fails_to_import_is_import_failed_with_no_case(verify) -> None:
    run = verify("raise KeyError('x')\n")
    res = run.result
    assert res["error"] == "import failed: KeyError" and res["error_code"] == "import_failed"
    assert res["cases"] == [] and res["load"] == {"candidate": {"ok": False}}
    assert run.kid.ops == ["send:load", "load"] and run.kid.closed
    run = verify("x = 1\n")  # imports, but has no step
    assert run.result["error"] == "import failed: no_entry" and run.result["cases"] == []


class DiesAtTrace(InProcessKid):
    fail_at = "trace"


class DiesAtLoad(InProcessKid):
    fail_at = "load"


def test_a_child_that_dies_mid_trace_is_that_traces_error(verify) -> None:
    run = verify(EAGER.read_text(), DiesAtTrace)
    (row,) = run.result["cases"]
    assert row["error"] == "the process died" and row["error_code"] == "candidate_crashed"
    assert "error" not in run.result and run.kid.closed


def test_a_child_that_dies_before_any_trace_is_the_verifys_error(verify) -> None:
    run = verify(EAGER.read_text(), DiesAtLoad)
    res = run.result
    assert (
        res["error"] == "candidate: the process died" and res["error_code"] == "candidate_crashed"
    )
    assert res["cases"] == [] and run.kid.closed


def test_a_verify_refuses_a_process_that_has_run_candidate_code(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "_hl_candidate_x", types.ModuleType("_hl_candidate_x"))
    with pytest.raises(RuntimeError, match="fresh runner process"):
        step_guard.verify(None, {}, runner)


def test_the_childs_config_is_the_references_fields() -> None:
    ref = runner.load_module(TASK.root / "reference.py", "decode_step_reference_units")
    config = ref.Config(**TASK.step.interpreter.model_dump(), dtype="float16")  # type: ignore[union-attr]
    got = step_guard._config_dict(config)
    import dataclasses

    assert got == {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


class LeavesScratch(InProcessKid):
    """A child that leaves a scratch folder behind (as a killed sandbox would)."""

    scratch = ""

    def send(self, cfg: dict[str, Any]) -> None:
        os.makedirs(os.path.join(self.scratch, "sbx-left"), exist_ok=True)
        open(os.path.join(self.scratch, "sbx-left.lock"), "w").close()  # its lock, not held
        super().send(cfg)


def test_after_a_verify_no_scratch_folder_stays_and_torch_ran_on_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify
) -> None:
    LeavesScratch.scratch = str(tmp_path / "stage" / "scratch")
    run = verify("def step(s, t):\n    raise ValueError\n", LeavesScratch)
    assert run.result["cases"][0]["codes"][0][0] == "candidate_error"
    assert os.listdir(LeavesScratch.scratch) == [] and torch.get_num_threads() == 1


def test_the_verify_takes_its_timeout_lock_and_scratch_from_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_guard, "stage_root", lambda: str(tmp_path / "stage"))
    events: list[dict[str, Any]] = []
    rt = types.SimpleNamespace(
        load_module=runner.load_module, Phases=runner.Phases, emit=events.append
    )
    env = types.SimpleNamespace(device="cpu", interpret=True, torch=torch)
    req = {**request(tmp_path), "gpu_lock": {"file": str(tmp_path / "locks" / "gpu3"), "gpu": 3}}
    v = step_guard.StepVerify(env, req, rt)
    assert v.timeout_s == 60.0 and v.ref.Config and v.env is env and v.rt is rt
    scratch = tmp_path / "stage" / "scratch"
    assert v.scratch_root == str(scratch) and (scratch.stat().st_mode & 0o777) == 0o700
    assert "3" in v.lock.message and v.lock.fd >= 0
    v.lock.on_wait("queued")
    assert events == [{"event": "waiting", "message": "queued"}]
    v.lock.close()
    del req["case_timeout_s"], req["gpu_lock"]
    v = step_guard.StepVerify(env, req, rt)
    assert v.timeout_s == 120.0 and v.lock.fd < 0 and "0" in v.lock.message


def test_verify_hardens_the_process_then_runs_the_step_verify(monkeypatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(step_guard.guard_spawn, "harden", lambda: calls.append("harden"))

    class Fake:
        def __init__(self, env, req, rt) -> None:
            calls.append(("init", env, req, rt))

        def run(self) -> dict[str, Any]:
            calls.append("run")
            return {"status": "measured"}

    monkeypatch.setattr(step_guard, "StepVerify", Fake)
    # A fresh runner process: candidates an earlier test of this worker loaded are set aside
    # (verify refuses a process that has run candidate code).
    for name in [n for n in sys.modules if n.startswith("_hl_candidate")]:
        monkeypatch.delitem(sys.modules, name)
    assert step_guard.verify("env", {"r": 1}, runner) == {"status": "measured"}
    assert calls == ["harden", ("init", "env", {"r": 1}, runner), "run"]


class LiesAboutLoad(InProcessKid):
    answer: ClassVar[dict[str, Any]] = {}

    def lie(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        return self.answer if op == "load" else reply


@pytest.mark.parametrize(
    ("answer", "error"),
    [({"ok": False, "error": ""}, "import failed: no reply"),
     ({"ok": True, "error": "KeyError"}, "import failed: KeyError")],
)  # fmt: skip
def test_a_load_is_ok_only_when_the_child_says_ok_and_no_error(verify, answer, error) -> None:
    kid_type = type("Kid", (LiesAboutLoad,), {"answer": answer})
    run = verify(EAGER.read_text(), kid_type)
    assert run.result["error"] == error and run.result["load"] == {"candidate": {"ok": False}}


class LiesAboutCopying(InProcessKid):
    """Says it copied the logits of pass 0 step 1 without running the step (a child that lies)."""

    def ask(self, msg: dict[str, Any], *, spin: bool = False) -> tuple[dict[str, Any], float]:
        if msg["op"] == "step" and self.ops.count("step") == 1:
            self.ops.append("step")
            return {"error": "", "copied": True}, 1.0
        return super().ask(msg, spin=spin)


def test_logits_a_child_did_not_write_read_as_nan(verify) -> None:
    run = verify(EAGER.read_text(), LiesAboutCopying)
    (row,) = run.result["cases"]
    assert [c[0] for c in row["codes"]] == ["wrong_output"]
    assert "pass 0 step 1: logits: output has NaN" in row["codes"][0][1]


class Racing(InProcessKid):
    """The child's view of the arena, for a test to write as a child still running would."""

    current: Any = None

    def __init__(self) -> None:
        super().__init__()
        Racing.current = self


def test_the_logits_are_copied_out_of_the_arena_before_they_are_compared(verify,
                                                                         monkeypatch) -> None:  # fmt: skip
    """A child writing the slot after its reply (the arena is shared) changes nothing."""
    original = step_guard.StepVerify.logits_ok

    def racing(self, got, want, config, rec, where):
        Racing.current.child.views["logits"].fill_(100.0)
        return original(self, got, want, config, rec, where)

    monkeypatch.setattr(step_guard.StepVerify, "logits_ok", racing)
    run = verify(EAGER.read_text(), Racing, traces=TRACES[:1])
    (row,) = run.result["cases"]
    assert row["codes"] == [] and row["steps_checked"] == 2 * STEPS["final0_float16"]


def test_the_largest_logits_error_over_the_steps_is_recorded(verify) -> None:
    body = """
CALLS = []


def step(state, tokens):
    CALLS.append(1)
    out = _honest(state, tokens)
    return out + 0.0125 if len(CALLS) == 2 else out
"""
    run = verify(kernel(body), traces=TRACES[:1])
    (row,) = run.result["cases"]
    assert row["codes"] == [] and 0.0125 <= row["max_abs_err"] < 0.02


class DiesAtSecondTrace(InProcessKid):
    fail_at, fail_after = "trace", 1


def test_a_child_that_dies_in_a_later_trace_is_that_traces_error(verify) -> None:
    run = verify(EAGER.read_text(), DiesAtSecondTrace)
    first, second = run.result["cases"]
    assert "error" not in first and first["codes"] == []
    assert second["error"] == "the process died" and second["error_code"] == "candidate_crashed"


def test_the_verify_runs_torch_on_one_thread_on_the_cpu(verify) -> None:
    torch.set_num_threads(3)
    verify("def step(s, t):\n    raise ValueError\n")
    assert torch.get_num_threads() == 1


def test_the_verify_closes_its_lock(verify, tmp_path: Path, monkeypatch) -> None:
    closed = []
    monkeypatch.setattr(step_guard.phase_lock.PhaseLock, "close", lambda self: closed.append(1))
    verify("def step(s, t):\n    raise ValueError\n")
    assert closed == [1]


def test_exact_logits_record_no_error_and_the_largest_error_is_kept() -> None:
    ref = runner.load_module(TASK.root / "reference.py", "decode_step_reference_units")
    config = ref.Config(**TASK.step.interpreter.model_dump(), dtype="float16")  # type: ignore[union-attr]
    v = step_guard.StepVerify.__new__(step_guard.StepVerify)
    v.rt, v.torch = runner, torch
    v.req = {"tolerances": {"float16": TASK.tolerances["float16"].model_dump()}}
    want = torch.randn(config.batch, config.vocab).half().float()  # representable in fp16
    rec: dict[str, Any] = {"name": "t", "codes": []}
    assert v.logits_ok(want.half(), want, config, rec, "s0") and rec["max_abs_err"] == 0.0
    assert v.logits_ok((want + 0.0078125).half(), want, config, rec, "s1")
    assert v.logits_ok(want.half(), want, config, rec, "s2")
    assert rec["max_abs_err"] == pytest.approx(0.0078125, rel=0.2) and rec["codes"] == []


# -- the incumbent (the best final checkpoint, staged as baseline_dir) ----------------------------


def test_an_incumbent_is_timed_beside_the_candidate_on_every_trace_in_an_arena_of_its_own(
    verify,
) -> None:
    run = verify(EAGER.read_text(), incumbent=EAGER.read_text())
    res, inc = run.result, run.inc
    assert inc is not None and "error" not in res and "incumbent_error" not in res
    assert res["load"] == {"candidate": {"ok": True}, "incumbent": {"ok": True}}
    assert res["sandbox"] == {"candidate": {"level": "none"}, "incumbent": {"level": "none"}}
    for r in res["cases"]:
        assert r["codes"] == [] and r["steps_timed"] == STEPS[r["name"]]
        mine = r["incumbent"]
        assert mine["passed"] is True and mine["codes"] == [] and mine["name"] == r["name"]
        assert mine["steps_timed"] == STEPS[r["name"]] and 0 < mine["p50_us"] <= mine["p95_us"]
    # its own process: its folder, its own arena's descriptor (never the candidate's), its own
    # State per trace; per trace one untimed warm-up pass (as warm as the candidate after its
    # two checked passes), then the timed steps
    assert (
        inc.cfg["candidate_dir"] == run.verify.req["baseline_dir"] != run.kid.cfg["candidate_dir"]
    )
    assert inc.memfd == inc.cfg["memfd"] != run.kid.cfg["memfd"]
    assert [op for op in inc.ops if not op.startswith("send:")][:2] == ["load", "arena"]
    assert inc.ops.count("trace") == 2 and inc.ops.count("step") == sum(STEPS.values())
    # the warm-up is the candidate's first checked pass again: its prompts, lengths and tokens
    firsts = [0, 2 * STEPS["final0_float16"]]  # where each trace's first checked pass starts
    want = [x for at, n in zip(firsts, STEPS.values(), strict=True)
            for x in run.kid.lengths[at : at + n]]  # fmt: skip
    assert inc.lengths == want
    assert inc.tokens == [x for at, n in zip(firsts, STEPS.values(), strict=True)
                          for x in run.kid.tokens[at : at + n]]  # fmt: skip
    for name, steps in STEPS.items():  # each trace: its warm-up pass, then its timed pass
        at = [i for i, op in enumerate(inc.ops) if op == "trace"][list(STEPS).index(name)]
        assert inc.ops[at + 1 : at + 1 + 2 * steps] == ["step"] * steps + ["timed_step"] * steps
    assert inc.ops.count("timed_step") == run.kid.ops.count("timed_step") == sum(STEPS.values())
    # the same weights as the candidate's, per trace
    assert all(torch.equal(a, b) for a, b in zip(inc.embeds, run.kid.embeds, strict=True))
    assert inc.closed and run.kid.closed
    for fd in (inc.cfg["memfd"], run.kid.cfg["memfd"]):
        with pytest.raises(OSError):  # both arenas closed
            os.fstat(fd)
    assert res["phases_s"]["incumbent"] > 0  # its cost, apart from the candidate's


def test_an_incumbent_that_fails_to_import_leaves_the_verify_not_the_verdict(verify) -> None:
    run = verify(EAGER.read_text(), traces=TRACES[:1], incumbent="raise KeyError('x')\n")
    res = run.result
    assert "error" not in res and res["incumbent_error"].startswith("import_failed")
    assert res["load"]["incumbent"] == {"ok": False}
    (row,) = res["cases"]
    assert row["codes"] == [] and row["steps_timed"] and "incumbent" not in row
    assert run.inc is not None and run.inc.closed and "trace" not in run.inc.ops


def test_an_incumbent_with_wrong_logits_fails_its_trace_and_is_not_timed_again(verify) -> None:
    wrong = kernel("\ndef step(state, tokens):\n    return _honest(state, tokens) + 1.0\n")
    run = verify(EAGER.read_text(), incumbent=wrong)
    first, second = run.result["cases"]
    assert first["codes"] == second["codes"] == [] and second["steps_timed"]
    assert first["incumbent"]["passed"] is False
    assert [c[0] for c in first["incumbent"]["codes"]] == ["wrong_output"]
    assert "incumbent" not in second and "incumbent_error" not in run.result
    assert run.inc is not None and run.inc.closed and run.inc.ops.count("trace") == 1


def test_an_incumbent_whose_process_dies_mid_pass_loses_the_comparison_only(verify) -> None:
    dying = type("Dying", (InProcessKid,), {"fail_at": "timed_step", "fail_after": 2})
    run = verify(EAGER.read_text(), incumbent=EAGER.read_text(), inc_type=dying)
    res = run.result
    assert "error" not in res and res["incumbent_error"].startswith("candidate_crashed")
    assert all(r["codes"] == [] and r["steps_timed"] == STEPS[r["name"]] for r in res["cases"])
    assert res["cases"][0]["incumbent"]["passed"] is False and "incumbent" not in res["cases"][1]


def test_a_candidate_rejected_in_its_checks_never_sets_the_incumbent_to_work(verify) -> None:
    run = verify(kernel("\ndef step(state, tokens):\n    return _honest(state, tokens) + 1.0\n"),
                 incumbent=EAGER.read_text())  # fmt: skip
    (row,) = run.result["cases"]
    assert row["codes"][0][0] == "wrong_output" and "incumbent" not in row
    assert run.inc is not None and "trace" not in run.inc.ops and "timed_step" not in run.inc.ops


class ErrsButCopies(InProcessKid):
    """An incumbent's process that says its step raised, and that it copied the logits."""

    def lie(self, op: str, reply: dict[str, Any]) -> dict[str, Any]:
        return {"error": "ValueError", "copied": True} if op == "step" else reply


@pytest.mark.parametrize(
    ("source", "inc_type", "reason"),
    [("def step(state, tokens):\n    raise ValueError('old')\n", InProcessKid,
      ["candidate_error", "final0_float16: warm-up step 0: the step raised ValueError"]),
     (EAGER.read_text(), ErrsButCopies,
      ["candidate_error", "final0_float16: warm-up step 0: the step raised ValueError"]),
     (kernel("\ndef step(state, tokens):\n    return _honest(state, tokens).float()\n"),
      InProcessKid,
      ["wrong_shape", "final0_float16: warm-up step 0: the logits are not a plain tensor"])],
)  # fmt: skip
def test_an_incumbent_that_fails_its_warm_up_leaves_before_the_timed_pass(
    verify, source, inc_type, reason
) -> None:
    run = verify(EAGER.read_text(), incumbent=source, inc_type=inc_type)
    first, second = run.result["cases"]
    assert first["codes"] == second["codes"] == [] and second["steps_timed"]
    assert first["incumbent"]["passed"] is False and first["incumbent"]["codes"] == [reason]
    assert "incumbent" not in second  # it left the verify: not set to work again
    assert run.inc is not None and run.inc.closed and "timed_step" not in run.inc.ops
    assert run.inc.ops.count("trace") == 1


@pytest.fixture
def freezes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """step_guard.frozen replaced: each use records the roles it stopped, and while it holds,
    InProcessReplayKid.frozen says so."""
    import contextlib

    seen: list[list[str]] = []

    @contextlib.contextmanager
    def frozen(kids):
        seen.append([k.role for k in kids])
        InProcessReplayKid.frozen.append(True)
        try:
            yield []
        finally:
            InProcessReplayKid.frozen.append(False)

    monkeypatch.setattr(step_guard, "frozen", frozen)
    monkeypatch.setattr(InProcessReplayKid, "frozen", [])
    return seen


def test_with_the_replay_the_timed_pass_times_the_recorded_steps_with_the_candidate_stopped(
    verify, freezes
) -> None:
    run = verify(EAGER.read_text(), replay="always")
    result, child, rep = run.result, run.kid, run.replayers["candidate"]
    assert result["certifies"] == "step_replayed" and not result.get("error")
    assert all(not r["codes"] and r["steps_timed"] == STEPS[r["name"]] for r in result["cases"])
    # the candidate's process stepped both checked passes (the second recorded) and no more
    assert child.ops.count("step") == 2 * sum(STEPS.values()) and "timed_step" not in child.ops
    assert child.cfg["record"] is True
    # its replay process got each trace's programs, then every timed step, each while the
    # candidate's process was stopped, and nothing else of the candidate's
    assert rep.ops.count("timed_step") == sum(STEPS.values()) and "step" not in rep.ops
    assert rep.ops.count("program") == sum(STEPS.values()) and rep.ops.count("trace") == 2
    assert rep.frozen_then and all(rep.frozen_then)
    assert freezes == [["candidate"], ["candidate"]]  # one stop per trace, the replay not in it
    assert result["replay"] == {f"candidate:{n}": {"steps": s, "programs": 1}
                                for n, s in STEPS.items()}  # fmt: skip
    assert set(result["sandbox"]) == {"candidate", "candidate_replay"}


def test_without_the_replay_the_candidates_own_steps_are_timed_and_nothing_is_stopped(
    verify, freezes
) -> None:
    run = verify(EAGER.read_text(), replay="never")
    assert run.result["certifies"] == "step_outputs" and run.kid.cfg["record"] is False
    assert run.kid.ops.count("timed_step") == sum(STEPS.values())
    assert run.replayers["candidate"].ops == [] and freezes == []


def test_with_the_replay_the_incumbent_is_recorded_in_its_warm_up_and_replayed_beside(
    verify, freezes
) -> None:
    run = verify(EAGER.read_text(), incumbent=EAGER.read_text(), replay="always")
    result, inc_rep = run.result, run.replayers["incumbent"]
    assert all(r["incumbent"]["passed"] for r in result["cases"]), result["cases"]
    assert inc_rep.ops.count("timed_step") == sum(STEPS.values()) and all(inc_rep.frozen_then)
    assert "timed_step" not in run.inc.ops and run.inc.ops.count("step") == sum(STEPS.values())
    assert freezes == [["candidate", "incumbent"]] * 2
    assert set(result["replay"]) == {f"{role}:{n}" for role in ("candidate", "incumbent")
                                     for n in STEPS}  # fmt: skip


def test_a_recording_the_schema_refuses_fails_its_step_in_the_recorded_pass(verify) -> None:
    run = verify(
        kernel("""
import torch as _t
_KEPT = _t.zeros(1)


def step(state, tokens):
    return _honest(state, tokens) + _KEPT.to(_t.float16)
"""),
        replay="always",
    )
    (rec,) = run.result["cases"]
    assert [c[0] for c in rec["codes"]] == ["unreplayable"]
    assert rec["codes"][0][1].startswith(f"{rec['name']}: pass 1 step 0: the recorded step: ")
    assert run.replayers["candidate"].ops.count("program") == 0

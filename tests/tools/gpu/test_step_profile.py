"""The step profile's rules (tools/gpu/step_profile.py) on the host, with decode_step's reference
and eager baseline at the interpreter's sizes: per-step launches, time and shares biggest first
(at most MAX_ROWS, long names cut), the warm-up steps left out and the last `repeats` steps
profiled (clamped to the trace), the longest context they reach, the profiled steps checked
(a wrong or failing step's profile is no profile), the reference's operators kept out.

The GPU path runs here with a stand-in CUDA device (`_Cuda`): real torch on the CPU, but a
"cuda" device whose profiler records how it was opened and answers the device's events, so the
rules of that path (CUDA activity, the device's own time, a synchronize inside the window, the
states and tokens on the device) are checked without one."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from harnesslab.tests.tools.gpu.step_support import expected_lengths, recorded_deadlines
from harnesslab.tools.gpu import step_profile, step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
BASELINE = (TASK.workspace_template / "kernel.py").read_text()
REF = load_module(TASK.reference_path, "_step_profile_ref")
EAGER = load_module(TASK.workspace_template / "kernel.py", "_step_profile_eager")
CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


@pytest.fixture(autouse=True)
def _one_thread():
    """As run_trace does on the CPU: tiny tensors on a loaded 2-core machine run many times
    faster on one thread than on torch's default."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _request(traces=("fixed_fp16",), **req):
    return {"step": TASK.step.request(list(traces)), "repeats": 2, "seed": 1,  # type: ignore[union-attr]
            "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()}, **req}  # fmt: skip


class _Event:
    def __init__(self, key: str, count: int, cpu_us: float, device=CPU, device_us: float = 0.0):
        self.key, self.count, self.self_cpu_time_total = key, count, cpu_us
        self.device_type, self.self_device_time_total = device, device_us


class _Cuda:
    """torch with a stand-in CUDA device: tensors stay on the CPU (the device each asked for is
    noted), the profiler notes its activities and answers `events`, synchronize is noted."""

    def __init__(self, events: list[_Event]) -> None:
        self.log: list[object] = []
        self.devices: list[object] = []
        self.events = events
        self.profiler = SimpleNamespace(profile=self._profile,
                                        ProfilerActivity=torch.profiler.ProfilerActivity)  # fmt: skip
        self.cuda = SimpleNamespace(synchronize=lambda: self.log.append("synchronize"))

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def tensor(self, data, **kwargs):
        self.devices.append(kwargs.pop("device", None))
        return torch.tensor(data, **kwargs)

    @contextlib.contextmanager
    def _profile(self, **kwargs):
        self.log.append(("profile", kwargs.get("activities")))
        yield SimpleNamespace(key_averages=lambda: self.events)
        self.log.append("closed")


class _OnCuda:
    """The reference, its States made on the CPU whatever device is asked (noted)."""

    def __init__(self) -> None:
        self.devices: list[str] = []

    def __getattr__(self, name: str):
        return getattr(REF, name)

    def new_state(self, config, *, seed: int = 0, device: str = "cpu"):
        self.devices.append(device)
        return REF.new_state(config, seed=seed)


class _Spy:
    """The eager step, noting each call's tokens and embedding table."""

    def __init__(self, log: list[object] | None = None) -> None:
        self.tokens: list[list[int]] = []
        self.embeds: list[torch.Tensor] = []
        self.log = log

    def __call__(self, state, tokens):
        self.tokens.append(tokens.tolist())
        self.embeds.append(state.weights["embed"])
        if self.log is not None:
            self.log.append("step")
        return EAGER.step(state, tokens)


def test_the_profile_adds_steps_and_reports_per_step_shares_biggest_first():
    totals: dict[str, list[float]] = {}
    step_profile.add(torch, [_Event("mm", 3, 30.0), _Event("idle", 1, 0.0)], False, totals)
    step_profile.add(torch, [_Event("mm", 3, 30.0), _Event("softmax", 2, 40.0)], False, totals)
    step_profile.add(torch, [_Event("tiny", 1, 0.5)], False, totals)  # under a microsecond counts
    rows, total = step_profile.rows(totals, repeats=2)
    assert total == pytest.approx(50.25)  # (30 + 30 + 40 + 0.5) us over 2 steps
    assert [r["kernel"] for r in rows] == ["mm", "softmax", "tiny"]  # no-time events dropped
    assert rows[0]["launches"] == 3 and rows[0]["total_us"] == pytest.approx(30.0)
    assert rows[1]["launches"] == 1 and rows[1]["total_us"] == pytest.approx(20.0)
    assert rows[0]["share_pct"] == pytest.approx(100 * 30 / 50.25)
    assert rows[1]["share_pct"] == pytest.approx(100 * 20 / 50.25)


def test_on_a_gpu_the_rows_are_the_devices_kernels_by_their_device_time():
    totals: dict[str, list[float]] = {}
    events = [_Event("gemm", 2, 1.0, CUDA, 12.0), _Event("cudaLaunchKernel", 2, 9.0, CPU, 0.0),
              _Event("aten::mm", 2, 4.0, CPU, 12.0),  # the operator that launched gemm
              _Event("copy", 1, 3.0, CUDA, 0.0)]  # fmt: skip
    step_profile.add(torch, events, True, totals)
    assert totals == {"gemm": [2.0, 12.0]}  # the host's operators (no double count), idle ones


def test_a_long_kernel_name_is_cut_to_200_characters_and_rows_stop_at_max_rows():
    totals: dict[str, list[float]] = {}
    step_profile.add(torch, [_Event("k" * 300, 1, 5.0)], False, totals)
    assert list(totals) == ["k" * 200]
    many = {f"k{i}": [1.0, float(i + 1)] for i in range(20)}
    rows, total = step_profile.rows(many, repeats=1)
    assert len(rows) == step_profile.MAX_ROWS == 16  # the reply's cap, the biggest kept
    assert [r["kernel"] for r in rows] == [f"k{i}" for i in range(19, 3, -1)]
    assert total == pytest.approx(sum(range(1, 21)))  # the step's total counts every kernel


def test_rows_with_no_time_share_nothing_rather_than_divide_by_zero():
    rows, total = step_profile.rows({"idle": [2.0, 0.0]}, repeats=2)
    assert total == 0 and rows == [{"kernel": "idle", "launches": 1.0, "total_us": 0.0,
                                    "share_pct": 0.0}]  # fmt: skip
    rows, total = step_profile.rows({"fast": [1.0, 0.5]}, repeats=1)  # under a microsecond
    assert total == 0.5 and rows[0]["share_pct"] == 100.0


def test_the_profile_of_the_eager_step_checks_the_profiled_steps_and_leaves_the_reference_out(
    tmp_path,
):
    request = _request()
    out = step_profile.profile(torch, REF, EAGER.step, request, interpret=True, device="cpu")
    assert out["status"] == "passed" and out["meaningful"] is False, out
    assert out["trace"] == "fixed_fp16" and out["steps_profiled"] == 2 and out["reason"] == ""
    assert out["context"] == 20 + 6  # the interpreter's fixed trace: prompt 20, 6 steps
    names = [k["kernel"] for k in out["kernels"]]
    assert "aten::_softmax" not in names and "aten::bmm" not in names  # the reference's ops
    assert any("scaled_dot_product" in n for n in names)  # the eager step's attention
    assert sum(k["share_pct"] for k in out["kernels"]) <= 100.0 + 1e-6  # MAX_ROWS of them
    assert out["step_us"] >= sum(k["total_us"] for k in out["kernels"]) > 0
    path = tmp_path / "kernel.py"
    path.write_text(BASELINE.replace("<= pos[:, None])", "<= pos[:, None] + 1)"))
    wrong = load_module(path, "_step_profile_wrong").step
    out = step_profile.profile(torch, REF, wrong, request, interpret=True, device="cpu")
    assert out["status"] == "failed" and out["reason"].startswith("logits at step 0")
    assert out["kernels"] == [] and "step_us" not in out  # a wrong step's profile says nothing


def test_a_failing_step_is_an_error_with_its_reason():
    def broken(state, tokens):
        raise RuntimeError("no kernel today")

    out = step_profile.profile(torch, REF, broken, _request(), interpret=True, device="cpu")
    assert out["status"] == "error" and "no kernel today" in out["reason"]
    assert out["kernels"] == [] and out["trace"] == "fixed_fp16"


@pytest.mark.parametrize(("repeats", "profiled"), [(None, 3), (0, 1), (1, 1), (5, 5), (9, 5)])
def test_the_last_repeats_steps_are_profiled_after_the_warm_up(repeats, profiled):
    """The interpreter's fixed trace has 6 steps: at most 5 profiled (one warms up), at least 1,
    3 when the request says nothing; the profiled ones are the last."""
    fake = _Cuda([_Event("gemm", 1, 0.0, CUDA, 4.0)])
    spy = _Spy(fake.log)
    req = _request() if repeats is None else _request(repeats=repeats)
    if repeats is None:
        del req["repeats"]
    out = step_profile.profile(fake, _OnCuda(), spy, req, interpret=True, device="cuda")
    assert out["status"] == "passed", out
    assert out["steps_profiled"] == profiled and len(spy.tokens) == 6
    first = next(i for i, entry in enumerate(fake.log) if entry != "step")
    assert first == 6 - profiled and fake.log.count("closed") == profiled  # warm-up unprofiled
    assert out["kernels"][0]["launches"] == 1 and out["step_us"] == pytest.approx(4.0)


def test_on_a_gpu_the_profile_records_cuda_and_synchronizes_inside_the_window():
    fake = _Cuda([_Event("gemm", 2, 1.0, CUDA, 8.0), _Event("aten::mm", 1, 6.0, CPU, 0.0)])
    ref = _OnCuda()
    out = step_profile.profile(fake, ref, _Spy(fake.log), _request(), interpret=True,
                               device="cuda")  # fmt: skip
    assert out["status"] == "passed" and out["meaningful"] is True
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    window = [("profile", activities), "step", "synchronize", "closed"]
    assert fake.log[-8:] == window * 2  # the two profiled steps, each synchronized inside
    assert ref.devices == ["cuda", "cuda"] and set(fake.devices) == {"cuda"}
    assert out["kernels"] == [{"kernel": "gemm", "launches": 2.0, "total_us": 8.0,
                               "share_pct": 100.0}]  # fmt: skip


def test_on_the_cpu_nothing_synchronizes_and_only_the_cpu_is_profiled():
    fake = _Cuda([_Event("aten::mm", 1, 6.0, CPU, 0.0)])
    out = step_profile.profile(fake, REF, _Spy(fake.log), _request(), interpret=True,
                               device="cpu")  # fmt: skip
    assert "synchronize" not in fake.log and out["meaningful"] is False
    assert ("profile", [torch.profiler.ProfilerActivity.CPU]) in fake.log
    assert out["kernels"][0]["kernel"] == "aten::mm" and set(fake.devices) == {"cpu"}


def test_the_first_trace_runs_as_given_over_weights_from_the_requests_seed():
    spec = TASK.step.request(["fixed_fp16", "dynamic_fp16"])  # type: ignore[union-attr]
    _, trace = step_trace.sized(REF, spec, spec["traces"][0], True)
    config = REF.Config(**spec["interpreter"], dtype="float16")
    for seed in (None, 0, 7):
        spy = _Spy()
        req = _request(["fixed_fp16", "dynamic_fp16"], seed=seed)
        if seed is None:
            del req["seed"]
        out = step_profile.profile(_Cuda([]), REF, spy, req, interpret=True, device="cpu")
        assert out["trace"] == "fixed_fp16" and out["status"] == "passed"
        assert spy.tokens == trace["segments"][0]["tokens"]  # the trace's own tokens (pass 0)
        drawn = REF.new_state(config, seed=seed or 0).weights["embed"]
        assert torch.equal(spy.embeds[0], drawn), seed


def test_the_context_is_the_longest_any_profiled_step_reaches():
    spec = TASK.step.request(["dynamic_fp16"])  # type: ignore[union-attr]
    config, trace = step_trace.sized(REF, spec, spec["traces"][0], True)
    lengths = expected_lengths(trace, config.batch)  # 9 steps: 3 per bucket of 16, 32, 64
    for repeats in (2, 8):
        out = step_profile.profile(_Cuda([]), REF, EAGER.step, _request(["dynamic_fp16"],
                                   repeats=repeats), interpret=True, device="cpu")  # fmt: skip
        assert out["status"] == "passed", out
        assert out["context"] == max(max(n) + 1 for n in lengths[-repeats:])
    assert min(lengths[-1]) < max(lengths[-1])  # sequences differ: the longest, not any


def test_the_deadline_is_the_requests_case_timeout_or_the_runners_120_s(monkeypatch):
    seen = recorded_deadlines(monkeypatch)
    for req in ({}, {"case_timeout_s": 7}):
        out = step_profile.profile(torch, REF, lambda s, t: None, _request(**req),
                                   interpret=True, device="cpu")  # fmt: skip
        assert out["status"] == "failed"
    assert seen == [120.0, 7.0]

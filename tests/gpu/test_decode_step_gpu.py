"""decode_step's trace objective on a real GPU (tests/gpu/conftest.py marks these gpu and skips
them without one): the eager baseline over the tiny config's dynamic trace passes every pass's
check, and the CUDA path reports device time and launch overhead for every bucket (the CPU path
cannot: tests/tasks/test_decode_step.py); run_objective on a decode_step workspace passes at
task.toml's GPU sizes. benchmarks/decode_step_gpu.py times real sizes."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import anyio
import pytest
import torch

from harnesslab.tools.evaluation import run_step_objective
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.gpu import step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

TASK = Path(str(resources.files("harnesslab.tasks"))) / "decode_step"


def test_the_eager_step_on_a_gpu_is_correct_and_timed_per_bucket_with_device_time_apart():
    ref = load_module(TASK / "reference.py", "decode_step_reference_gpu")
    eager = load_module(TASK / "workspace" / "kernel.py", "decode_step_eager_gpu")
    config = ref.Config(dtype="bfloat16")
    trace = step_trace.dynamic_trace(config, buckets=[8, 16, 32, 64], steps_per_segment=4,
                                     segments_per_bucket=2, seed=3)  # fmt: skip
    result = step_trace.run_trace(torch, ref, eager.step, config, trace, device="cuda")
    assert result["correct"], result["failures"]
    assert result["meaningful"] and [row["bucket"] for row in result["buckets"]] == [8, 16, 32, 64]
    for row in [*result["buckets"], result["total"]]:
        assert row["device_p50_us"] > 0 and row["launch_overhead_us"] is not None


def test_run_objective_on_a_decode_step_workspace_passes_at_the_task_toml_sizes(tmp_path):
    """The runner's step mode on a GPU, end to end (launcher, sandbox, CUDA): the eager
    baseline at task.toml's GPU sizes passes every dev trace within its tolerances (measured at
    the interpreter's sizes only, until this runs) and every bucket has its device time."""
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("decode_step", tmp_path / "ws", settings)

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(600):
                return await run_step_objective(ws, launcher, seed=1)
        finally:
            await launcher.aclose()

    res = anyio.run(go)
    assert res.status == "passed", res.reason
    assert res.meaningful
    for case in res.cases:
        print(case.name, [b.model_dump(exclude_none=True) for b in case.buckets or []])
        for row in case.buckets or []:
            assert row.failed_steps == 0 and row.steps == row.checked_steps > 0
            assert row.device_p50_us and row.device_p50_us > 0


def _step_verify(tmp_path, kernel: Path | None):
    from harnesslab.tools.integrity.step_verify import guarded_step_verify

    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("decode_step", tmp_path / "ws", settings)
    if kernel is not None:
        (ws.root / "kernel.py").write_text(kernel.read_text())

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(600):
                return await guarded_step_verify(ws, launcher, settings)
        finally:
            await launcher.aclose()

    return anyio.run(go)


def test_the_guarded_step_verify_passes_the_baseline_and_rejects_a_step_cheat_on_a_gpu(tmp_path):
    """The step verify's GPU path (gpu/verify/step_arena.py: the candidate's State in device
    memory the parent allocates and the child maps) at task.toml's GPU sizes: the eager baseline passes every hidden trace
    (the tolerances are measured at the interpreter's sizes only, until this runs), and the
    corpus's logits cache is rejected."""
    passed = _step_verify(tmp_path / "a", None)
    assert passed.verdict == "passed", passed.reasons
    assert passed.certifies == "step_replayed" and passed.sandbox in ("full", "partial")
    print(
        "baseline:", [c.max_abs_err for c in passed.result.cases], passed.evidence["runner_wall_s"]
    )
    corpus = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step"
    cheat = _step_verify(tmp_path / "b", corpus / "logits_cache.py")
    assert cheat.verdict == "rejected" and cheat.reasons[0]["code"] == "wrong_output"


def test_the_triton_solution_on_a_gpu_replays_its_graphs_correctly_and_passes_the_verify(tmp_path):
    """The shipped solution (tasks/decode_step/solutions/triton.py) compiled for the GPU: its
    CUDA-graph path (one graph per bucket, replayed from the second step of a bucket on) passes
    every pass's check over the tiny config's dynamic trace, and the guarded step verify passes
    it at task.toml's GPU sizes."""
    from harnesslab.tools.task import load_task

    solution = load_task("decode_step").solutions()["triton"]
    ref = load_module(TASK / "reference.py", "decode_step_reference_gpu")
    step = load_module(solution, "decode_step_solution_gpu").step
    config = ref.Config(dtype="float16")
    trace = step_trace.dynamic_trace(config, buckets=[8, 16, 32, 64], steps_per_segment=4,
                                     segments_per_bucket=2, seed=4)  # fmt: skip
    result = step_trace.run_trace(torch, ref, step, config, trace, device="cuda")
    assert result["correct"], result["failures"]
    verdict = _step_verify(tmp_path, solution)
    assert verdict.verdict == "passed", verdict.reasons
    print("solution:", [c.max_abs_err for c in verdict.result.cases])


STEP_CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step"

CHILD = """
import os, sys, torch
from harnesslab.tools.gpu.verify import step_arena
fd, size = int(sys.argv[1]), int(sys.argv[2])
arena = step_arena.DeviceArena.mapped(torch, fd, size)
u8 = arena.buf.u8
assert bool((u8[:4096] == 7).all()), "the parent's bytes are not there"
u8[4096:8192].fill_(9)
torch.cuda.synchronize()
arena.close()
print("ok")
"""


def test_the_step_arena_on_a_gpu_is_one_device_memory_for_the_parent_and_its_child(tmp_path):
    """step_arena.DeviceArena across two processes, as the verify uses it: the parent's writes
    are in the child's mapping of the inherited descriptor (no copy), the child's writes in the
    parent's, and the parent's memory outlives the child's mapping."""
    import subprocess
    import sys

    from harnesslab.tools.gpu.verify import step_arena

    arena = step_arena.DeviceArena.create(torch, 3 << 20, str(tmp_path))
    u8 = arena.buf.u8
    assert u8.is_cuda and arena.size >= 3 << 20
    u8.zero_()
    u8[:4096].fill_(7)
    torch.cuda.synchronize()
    out = subprocess.run([sys.executable, "-c", CHILD, str(arena.fd), str(arena.size)],
                         pass_fds=(arena.fd,), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert bool((u8[4096:8192] == 9).all()) and bool((u8[8192:] == 0).all())
    del u8
    arena.close()


def _expect(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return re.search(r"^expect: (\S+)", doc, re.M).group(1)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "path",
    sorted([*STEP_CORPUS.glob("*.py"), *(STEP_CORPUS / "replay").glob("*.py")]),
    ids=lambda p: p.stem,
)
def test_every_step_cheat_is_rejected_with_its_code_at_the_gpu_sizes(tmp_path, path: Path):
    """The step corpus at task.toml's GPU sizes (the CPU tests run the interpreter's tiny
    config): each cheat is rejected with the reason its docstring names; replay/'s, whose own
    steps are right, by the replay a GPU verify times (step.replay "gpu"). poison_undone_in_copy
    can only show on a GPU: it patches the child's copy of the cache (push_state) that carried
    the poison to the device before the State moved there; with the State in the parent's
    device memory it is rejected as on the CPU (before, on a GPU, it passed)."""
    v = _step_verify(tmp_path, path)
    assert v.verdict == "rejected" and _expect(path) in {r["code"] for r in v.reasons}, v.reasons


@pytest.mark.parametrize(
    "path", sorted((STEP_CORPUS / "honest").glob("*.py")), ids=lambda p: p.stem
)
def test_every_honest_step_twin_passes_at_the_gpu_sizes(tmp_path, path: Path):
    v = _step_verify(tmp_path, path)
    assert v.verdict == "passed", v.reasons


def test_the_triton_solutions_verify_scores_a_lower_p50_than_the_eager_baseline(tmp_path):
    """The step verify's timed pass on a GPU (gpu/verify/step_timed.py: the state in the shared
    device arena, steps back to back, the parent's clock from request to its read of the logits) at task.toml's
    GPU sizes, on one workspace (the same hidden traces): both verdicts pass with a meaningful
    score, and the shipped solution's p50 is below eager's on every hidden trace."""
    from harnesslab.tools.integrity.step_verify import guarded_step_verify
    from harnesslab.tools.task import load_task

    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("decode_step", tmp_path / "ws", settings)
    solution = load_task("decode_step").solutions()["triton"].read_text()

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(1200):
                eager = await guarded_step_verify(ws, launcher, settings)
                (ws.root / "kernel.py").write_text(solution)
                return eager, await guarded_step_verify(ws, launcher, settings)
        finally:
            await launcher.aclose()

    eager, sol = anyio.run(go)
    for name, v in (("eager", eager), ("solution", sol)):
        assert v.verdict == "passed", v.reasons
        assert v.meaningful and v.score_us is not None and v.score_us > 0
        assert v.certifies == "step_replayed" and v.unverified == ["step_idle"]
        print(name, v.score_us, [(c.name, c.median_us, c.buckets[0].p95_us, c.buckets[0].steps)
                                 for c in v.result.cases if c.buckets])  # fmt: skip
        phases = v.evidence.get("runner_phases_s") or {}
        print(name, "wall", round(v.evidence.get("runner_wall_s") or 0, 1), "s; phases",
              {k: round(t, 1) for k, t in phases.items()})  # fmt: skip
    for e, s in zip(eager.result.cases, sol.result.cases, strict=True):
        assert s.median_us is not None and e.median_us is not None
        assert s.median_us < e.median_us, (e.name, e.median_us, s.median_us)
    assert sol.score_us < eager.score_us
    # The second verify timed eager (the best checkpoint) beside the solution, A B B A per half
    # segment: the same-verify comparison decides the best pointer.
    inc = sol.incumbent
    assert eager.incumbent is None and inc is not None and inc["meaningful"]
    assert inc["hash"] == eager.evidence["candidate"] and inc["error"] is None, inc
    print("solution vs eager in one verify:", inc["speedup"], inc["cases"])
    assert all(
        r["incumbent_passed"] and r["incumbent_us"] > r["candidate_us"] for r in inc["cases"]
    )
    assert inc["faster"] and sol.is_new_best

"""The GPU-side runner through the launcher, on the Triton interpreter (CPU)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.task.spec import load_task

SMALL = ["1024x1024_fp16", "384x4096_bf16"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def patch_kernel(ws, old: str, new: str) -> None:
    path = ws.root / "kernel.py"
    src = path.read_text()
    assert old in src, f"baseline kernel changed; cannot find {old!r}"
    path.write_text(src.replace(old, new, 1))


def baseline_store_line(ws) -> str:
    """The baseline's `tl.store(...)` call: the place to plant a bug."""
    src = (ws.root / "kernel.py").read_text()
    m = re.search(r"tl\.store\((.*)\)", src)
    assert m, "baseline kernel has no tl.store"
    return m.group(0)


@pytest.mark.anyio
async def test_baseline_passes_on_the_interpreter_with_a_full_result(tmp_path):
    ws = make_workspace(tmp_path)
    res = await run_objective(ws, make_launcher(tmp_path), cases=SMALL)
    assert res.status == "passed", res.reason
    assert res.meaningful is False
    assert res.score_us == pytest.approx(sum(c.median_us for c in res.cases))
    case = res.cases[0]
    for field in (
        "median_us",
        "p10_us",
        "p90_us",
        "spread",
        "launch_overhead_us",
        "gbps",
        "pct_of_copy_bw",
        "max_abs_err",
        "max_rel_err",
    ):
        assert getattr(case, field) is not None, field
    assert res.env.torch and res.env.triton
    assert res.record_id and (ws.history_path).is_file()


# slow: each solution passes a guarded verify in tests/tools/integrity/test_cheats.py's
# test_honest_kernel_passes_every_check[solution_<name>] and matches the reference on irregular
# shapes in tests/tasks/test_task_contract.py (both fast); run_objective through the runner stays
# fast in test_baseline_passes_on_the_interpreter_with_a_full_result.
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("solution", sorted(load_task("rmsnorm_gate").solutions()))
async def test_reference_solutions_pass_on_the_interpreter(tmp_path, solution):
    ws = make_workspace(tmp_path)
    (ws.root / "kernel.py").write_bytes(
        load_task("rmsnorm_gate").solutions()[solution].read_bytes()
    )
    res = await run_objective(ws, make_launcher(tmp_path), cases=SMALL)
    assert res.status == "passed", res.reason


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bug", "reason"),
    [
        ("off_by_factor", "out of tolerance"),
        ("nan", "NaN"),
        ("skip_last_column", r"out of tolerance|NaN"),
    ],
)
async def test_wrong_kernels_fail_with_the_right_reason(tmp_path, bug, reason):
    ws = make_workspace(tmp_path)
    if bug == "skip_last_column":
        # Store everything but the last column of each row.
        store = baseline_store_line(ws)
        mask_arg = re.search(r"mask=([^,)]+)", store)
        assert mask_arg, store
        new = store.replace(mask_arg.group(0), f"mask=({mask_arg.group(1)}) & (cols < dim - 1)")
        patch_kernel(ws, store, new)
        src = (ws.root / "kernel.py").read_text()
        assert "cols" in src and "dim" in src, "baseline names changed: update this test"
    else:
        (ws.root / "kernel.py").write_text(
            (ws.root / "kernel.py").read_text()
            + (
                "\n_orig = rmsnorm_gate\n"
                "def rmsnorm_gate(x, gate, weight, eps=1e-5):\n"
                + (
                    "    return _orig(x, gate, weight, eps) * 1.01\n"
                    if bug == "off_by_factor"
                    else "    y = _orig(x, gate, weight, eps)\n    y[0, 0] = float('nan')\n    return y\n"
                )
            )
        )
    res = await run_objective(ws, make_launcher(tmp_path), cases=SMALL[:1])
    assert res.status == "failed"
    assert res.score_us is None
    assert re.search(reason, res.cases[0].reason), res.cases[0].reason


@pytest.mark.anyio
async def test_a_syntax_error_fails_every_case_naming_file_and_line(tmp_path):
    ws = make_workspace(tmp_path)
    (ws.root / "kernel.py").write_text(
        "def rmsnorm_gate(x, gate, weight, eps=1e-5):\n    return (\n"
    )
    res = await run_objective(ws, make_launcher(tmp_path), cases=SMALL)
    assert res.status == "failed"
    assert all(c.status == "error" for c in res.cases)
    assert "SyntaxError at kernel.py:" in res.cases[0].reason


@pytest.mark.anyio
async def test_a_hanging_case_times_out_inside_the_runner(tmp_path):
    ws = make_workspace(tmp_path)
    (ws.root / "kernel.py").write_text(
        "import time\ndef rmsnorm_gate(x, gate, weight, eps=1e-5):\n    time.sleep(600)\n"
    )
    res = await run_objective(ws, make_launcher(tmp_path, case_timeout_s=2), cases=SMALL)
    assert [c.status for c in res.cases] == ["timeout", "timeout"]
    assert res.status == "failed"


@pytest.mark.anyio
async def test_a_case_that_hangs_inside_a_triton_kernel_reads_as_a_timeout_not_a_repr(tmp_path):
    """The interpreter wraps whatever a kernel body raises (InterpreterError(repr(e))), the
    case's deadline included: it was reported as an error reading "CaseTimeout('exceeded
    2s')" at the launch line."""
    ws = make_workspace(tmp_path)
    (ws.root / "kernel.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def _spin(out_ptr):\n    i = 0\n    while i >= 0:\n        i += 1\n"
        "    tl.store(out_ptr, i)\n\n\n"
        "def rmsnorm_gate(x, gate, weight, eps=1e-5):\n    out = torch.empty_like(x)\n"
        "    _spin[(1,)](out)\n    return out\n"
    )
    res = await run_objective(ws, make_launcher(tmp_path, case_timeout_s=2), cases=SMALL[:1])
    case = res.cases[0]
    assert case.status == "timeout", case.reason
    assert case.reason == "timeout: case exceeded 2s", case.reason


@pytest.mark.anyio
async def test_a_runner_that_hangs_is_killed_with_its_process_group(tmp_path):
    ws = make_workspace(tmp_path)
    # Ignores SIGALRM's exception and spawns a child: the whole group must die.
    (ws.root / "kernel.py").write_text(
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '317.25'])\n"
        "def rmsnorm_gate(x, gate, weight, eps=1e-5):\n"
        "    while True:\n"
        "        try:\n            time.sleep(600)\n        except BaseException:\n            pass\n"
    )
    launcher = make_launcher(tmp_path, eval_timeout_s=12, case_timeout_s=1)
    res = await run_objective(ws, launcher, cases=SMALL)
    assert res.status == "failed"
    assert {c.status for c in res.cases} == {"timeout"}
    assert "killed" in res.cases[0].reason or "timeout" in res.cases[0].reason
    leftover = subprocess.run(["pgrep", "-f", "sleep 317.25"], capture_output=True, text=True)
    assert not leftover.stdout.split(), f"leftover processes: {leftover.stdout}"


@pytest.mark.anyio
async def test_bad_config_is_a_usage_error_and_the_workspace_is_untouched(tmp_path):
    ws = make_workspace(tmp_path)
    before = ws.editable_files()
    (ws.root / "kernel_config.json").write_text(
        '{"num_warps": 3, "num_stages": 1, "rows_per_program": 1}'
    )
    with pytest.raises(UsageError, match=r"num_warps=3 is not one of 1,2,4,8,16,32"):
        await run_objective(ws, make_launcher(tmp_path))
    (ws.root / "kernel_config.json").write_text("{not json")
    with pytest.raises(UsageError, match="kernel_config.json: not valid JSON"):
        await run_objective(ws, make_launcher(tmp_path))
    assert (ws.root / "kernel.py").read_bytes() == before["kernel.py"]
    assert not ws.history_path.exists()


def test_runner_module_runs_alone_without_harnesslab(tmp_path):
    """The GPU host has no harnesslab: a copy of the staged files (runner.py imports its
    siblings timing.py, scores.py and correctness.py by plain name there) must start in an
    isolated interpreter with no site-packages (-I -S), where any import of harnesslab would
    fail."""
    from harnesslab.tools.execution.staging import RUNNER_FILES, runner_source
    from harnesslab.tools.gpu import staged_name

    for name in RUNNER_FILES:  # flat, as on the GPU host
        (tmp_path / staged_name(name)).write_bytes(runner_source(name))
    copy = tmp_path / "runner.py"
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert "usage: runner.py" in out.stderr


@pytest.mark.anyio
async def test_run_objective_says_where_its_seconds_went_without_counting_any_twice(tmp_path):
    import time

    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path)
    t0 = time.perf_counter()
    res = await run_objective(ws, launcher, cases=SMALL)
    wall = time.perf_counter() - t0
    assert res.status == "passed", res.reason
    phases = res.phases_s
    for key in ("snapshot", "stage", "gpu_lock", "sync", "transport", "result", "runner_load",
                "runner_inputs", "runner_correctness", "runner_timing"):  # fmt: skip
        assert key in phases, key
    assert all(v >= 0 for v in phases.values()), phases
    assert sum(phases.values()) <= wall * 1.01 + 0.01  # exclusive phases: never more than wall
    assert phases["runner_timing"] > 0 and phases["runner_correctness"] > 0
    assert all(c.samples and c.samples >= 1 for c in res.cases)

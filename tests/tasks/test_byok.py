"""Bring your own kernel: a task scaffolded from a PyTorch function of ours (a fused op with two
inputs and a weight, our Triton kernel as the baseline) and three KernelBench-format files (an
elementwise op, a reduction, a small matmul) go through init, eval, sweep, probe and the guarded
verify on the Triton interpreter; a wrong baseline is reported as wrong; a declaration error
names its field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools.authoring.kernelbench import import_kernelbench
from harnesslab.tools.authoring.kernelbench_sizes import size_constants
from harnesslab.tools.authoring.scaffold import write_task
from harnesslab.tools.authoring.task_new import plan_new
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.probe import numerical_probe
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.gpu import numerics
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import TaskSpec, load_task, parse_task

HERE = Path(__file__).resolve().parent / "byok"
FUSED = ["--input", "x:rows,dim", "--input", "residual:rows,dim", "--input", "weight:dim"]
FUSED_DIMS = ["rows=16,dim=96"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TaskSpec]:
    root = tmp_path_factory.mktemp("byok")
    plan = plan_new(
        "gelu_res",
        f"{HERE / 'fused.py'}:scaled_residual_gelu",
        kernel=f"{HERE / 'fused_kernel.py'}:fused_gelu",
        inputs=FUSED[1::2],
        dims=FUSED_DIMS,
        scalars=["alpha=0.5"],
        dtypes=["float16", "float32"],
        ranges=["rows=8:40"],
    )
    out = {"gelu_res": write_task(plan, root / "gelu_res")}
    for row in import_kernelbench(HERE / "kernelbench", root / "kb", dtypes=["float32"]):
        assert row.status == "written", row.reason
        out[row.task] = load_task(Path(row.folder))
    return out


def test_the_scaffolded_task_declares_inputs_output_and_scalars(tasks) -> None:
    t = tasks["gelu_res"]
    assert t.declare is not None and t.entry == "fused_kernel.py:fused_gelu"
    assert [(i.name, i.shape) for i in t.declare.inputs] == [
        ("x", ["rows", "dim"]), ("residual", ["rows", "dim"]), ("weight", ["dim"]),
    ]  # fmt: skip
    assert t.declare.output.shape == ["rows", "dim"] and t.declare.scalars == {"alpha": 0.5}
    assert not (t.root / "reference.py").exists()  # generated at staging, never written here
    assert t.final is not None
    assert {k: (r.min, r.max) for k, r in t.final.ranges.items()} == {
        "rows": (8, 40), "dim": (48, 192),  # given; the default is half to twice the dev size
    }  # fmt: skip


def test_kernelbench_files_become_tasks_with_their_constants_as_dims(tasks) -> None:
    assert sorted(tasks) == [
        "gelu_res", "kb_1_scaled_add", "kb_2_sum_reduction", "kb_3_small_matmul",
    ]  # fmt: skip
    red = tasks["kb_2_sum_reduction"]
    assert red.declare is not None and red.declare.reference_kind == "module"
    assert red.declare.scalars == {"dim": 1}  # get_init_inputs -> Model's constructor
    assert red.declare.inputs[0].shape == ["batch_size", "dim1", "dim2"]
    assert red.declare.output.shape == ["batch_size", 1, "dim2"]
    assert red.final is not None and set(red.final.ranges) == {"batch_size", "dim1", "dim2"}
    mm = tasks["kb_3_small_matmul"]
    assert mm.declare is not None
    assert [i.shape for i in mm.declare.inputs] == [["M", "K"], ["K", "N"]]
    assert mm.declare.output.shape == ["M", "N"]
    assert "model_new" in (mm.root / "task.md").read_text()


def test_size_constants_leave_out_constructor_arguments() -> None:
    src = (HERE / "kernelbench" / "2_sum_reduction.py").read_text()
    assert size_constants(src) == {"batch_size": 8, "dim1": 48, "dim2": 40}


async def _all_tools(task: TaskSpec, tmp: Path) -> None:
    cfg = Settings(state_dir=tmp / "state", interpret="always")
    ws = init_workspace(task.root, tmp / "ws", cfg)
    launcher = Launcher(cfg)
    try:
        ev = await run_objective(ws, launcher, warmup=0, repeats=1)
        assert ev.status == "passed", [c.reason for c in ev.cases]
        sw = await sweep(
            ws, launcher, space={"num_warps": [1, 2]}, cases=[task.dev_cases[0].name], repeats=1
        )
        assert sw.ok == 2, [r.model_dump() for r in sw.results]
        pr = await numerical_probe(ws, launcher, dtypes=[task.dtypes[0]])
        assert [r.probe for r in pr.results] == list(numerics.NAMES)  # the generic suite
        assert pr.status == "passed", pr.failing
        solution = HERE / "solutions" / f"{task.name}.py"
        if task.name == "kb_1_scaled_add":
            # An imported baseline is the forward in PyTorch: no kernel, and the guard says so
            # (checked on one task: a verify costs seconds on the interpreter).
            verdict = await guarded_verify(ws, launcher, cfg)
            assert verdict.verdict == "rejected"
            assert "no_triton_launch" in {r["code"] for r in verdict.reasons}
        if solution.is_file():  # our Triton kernel for a KernelBench task
            shutil.copy(solution, ws.root / "kernel.py")
        verdict = await guarded_verify(ws, launcher, cfg)
        assert verdict.verdict == "passed", verdict.reasons
    finally:
        await launcher.aclose()


# kb_2 and kb_3 repeat kb_1's run (a KernelBench Model task with a constructor scalar through
# eval, sweep, probe and a passing guarded verify, 12 s of a worker each); what is theirs stays
# fast: their declared shapes (test_kernelbench_files_become_tasks_with_their_constants_as_dims),
# kb_3's guarded verify (test_a_wrong_candidate_of_a_kernelbench_task_is_rejected), a reduction's
# and a matmul's staged reference passing (tests/tasks/test_kernelbench.py, 47_Sum_reduction and
# 2_Standard_matrix_multiplication).
KB_REPEATS = "repeats [kb_1_scaled_add]'s tools on a KernelBench task"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name",
    [
        "gelu_res",
        "kb_1_scaled_add",
        pytest.param("kb_2_sum_reduction", marks=pytest.mark.slow(KB_REPEATS)),
        pytest.param("kb_3_small_matmul", marks=pytest.mark.slow(KB_REPEATS)),
    ],
)
async def test_eval_sweep_probe_and_guarded_verify_pass_on_the_interpreter(
    tasks, name: str, tmp_path: Path
) -> None:
    with anyio.fail_after(300):
        await _all_tools(tasks[name], tmp_path)


@pytest.mark.anyio
async def test_a_wrong_candidate_of_a_kernelbench_task_is_rejected(tasks, tmp_path: Path) -> None:
    task = tasks["kb_3_small_matmul"]
    cfg = Settings(state_dir=tmp_path / "state", interpret="always")
    ws = init_workspace(task.root, tmp_path / "ws", cfg)
    kernel = ws.root / "kernel.py"
    right = (HERE / "solutions" / f"{task.name}.py").read_text()
    kernel.write_text(right.replace("acc.to(c_ptr", "(acc + 0.1).to(c_ptr"))
    launcher = Launcher(cfg)
    try:
        with anyio.fail_after(300):
            verdict = await guarded_verify(ws, launcher, cfg)
    finally:
        await launcher.aclose()
    assert verdict.verdict == "rejected"
    assert "wrong_output" in {r["code"] for r in verdict.reasons}, verdict.reasons


def test_task_new_reports_a_wrong_baseline_as_wrong(tmp_path: Path, capsys, monkeypatch) -> None:
    wrong = tmp_path / "wrong_kernel.py"
    wrong.write_text((HERE / "fused_kernel.py").read_text().replace("alpha * r", "alpha * r * 1.5"))
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HARNESSLAB_INTERPRET", "always")
    code = cli_main(
        ["task", "new", "gelu_bad", "--reference", f"{HERE / 'fused.py'}:scaled_residual_gelu",
         "--kernel", f"{wrong}:fused_gelu", *FUSED, "--dims", *FUSED_DIMS, "--scalar",
         "alpha=0.5", "--out", str(tmp_path / "gelu_bad"), "--json"]
    )  # fmt: skip
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "failed"
    assert report["tasks"][0]["baseline"] == "failed"
    assert "out of tolerance" in " ".join(report["tasks"][0]["failing"])


def _declared_toml(tmp_path: Path, tasks, **edits: str) -> str:
    src = tasks["gelu_res"].root
    shutil.copy(src / "fused.py", tmp_path / "fused.py")
    text = (src / "task.toml").read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


def test_an_unknown_dim_is_named_with_its_field(tasks, tmp_path: Path) -> None:
    text = _declared_toml(tmp_path, tasks, **{'shape = ["dim"]': 'shape = ["cols"]'})
    with pytest.raises(UsageError, match=r"declare\.inputs\[2\]\.shape: unknown dim 'cols'"):
        parse_task(text, tmp_path)


def test_an_unknown_dim_in_a_formula_is_named_with_its_field(tasks, tmp_path: Path) -> None:
    text = _declared_toml(tmp_path, tasks, **{"[declare]\n": '[declare]\nflops = "8*rows*cols"\n'})
    with pytest.raises(UsageError, match=r"declare\.flops: unknown dim 'cols'"):
        parse_task(text, tmp_path)


def test_a_bad_dtype_is_named_with_its_field(tasks, tmp_path: Path) -> None:
    text = (tasks["gelu_res"].root / "task.toml").read_text()
    shutil.copy(tasks["gelu_res"].root / "fused.py", tmp_path / "fused.py")
    # the second input's dtype line
    head, _, tail = text.partition('name = "residual"')
    tail = tail.replace('dtype = "case"', 'dtype = "float8"', 1)
    with pytest.raises(UsageError, match=r"declare\.inputs\[1\]\.dtype: 'float8' is not one of"):
        parse_task(head + 'name = "residual"' + tail, tmp_path)


def test_a_missing_reference_file_is_named(tasks, tmp_path: Path) -> None:
    shutil.copy(tasks["gelu_res"].root / "task.toml", tmp_path / "task.toml")
    parse_task((tmp_path / "task.toml").read_text(), tmp_path)  # the text alone is valid
    with pytest.raises(UsageError, match=r"declare\.reference: fused\.py is not a file"):
        load_task(tmp_path)  # the folder has no fused.py


def test_inputs_and_output_are_inferred_from_an_example_call(tmp_path: Path) -> None:
    example = tmp_path / "example.py"
    example.write_text(
        "import torch\n\n\ndef example():\n"
        "    return (torch.randn(8, 40), torch.randn(8, 40), torch.randn(40)), {'alpha': 0.25}\n"
    )
    plan = plan_new(
        "gelu_ex", f"{HERE / 'fused.py'}:scaled_residual_gelu", example=f"{example}:example"
    )
    assert [(i.name, i.shape) for i in plan.inputs] == [
        ("x", ["d0", "d1"]), ("residual", ["d0", "d1"]), ("weight", ["d1"]),
    ]  # fmt: skip
    assert plan.dims == {"d0": 8, "d1": 40} and plan.scalars == {"alpha": 0.25}
    assert plan.output_shape == ["d0", "d1"]


def _staged_reference(task: TaskSpec, tmp_path: Path):
    """The task's reference as the GPU host gets it: declared.py beside declaration.json."""
    from harnesslab.tools.execution.launcher import runner_source
    from harnesslab.tools.gpu.runner import load_module

    assert task.declare is not None
    stage = tmp_path / "stage"
    stage.mkdir()
    shutil.copy(task.root / task.declare.reference.split(":")[0], stage)
    (stage / "reference.py").write_bytes(runner_source("declared.py"))
    (stage / "declaration.json").write_text(task.declare.staged_json(task.dev_cases[0].shape))
    return load_module(stage / "reference.py", f"_byok_ref_{task.name}")


def test_the_generated_reference_derives_bytes_flops_and_probe_shapes(tasks, tmp_path) -> None:
    import torch

    ref = _staged_reference(tasks["kb_3_small_matmul"], tmp_path)
    dims = {"M": 32, "K": 48, "N": 24}
    # A (M, K) + B (K, N) + C (M, N), 4 bytes each; one flop per output element by default
    assert ref.bytes_moved(dims, 4) == 4 * (32 * 48 + 48 * 24 + 32 * 24)
    assert ref.flops(dims) == 32 * 24
    (a, b), kwargs = ref.make_inputs(dims, torch.float16, "cpu", torch.Generator().manual_seed(1))
    assert kwargs == {}
    assert a.shape == (32, 48) and b.shape == (48, 24) and a.dtype == torch.float16
    assert ref.output_spec(a, b) == ((32, 24), torch.float16)
    expected = ref.reference(a, b)
    assert expected.dtype == torch.float32
    assert torch.allclose(expected, a.float() @ b.float())
    # Its edges are the generic suite's, batched along the first input's first dim.
    assert ref.BATCH_DIM == "M" and not hasattr(ref, "edge_cases")


@pytest.mark.slow
def test_the_autopilot_loop_runs_on_a_kernelbench_task(tasks, tmp_path: Path) -> None:
    """One autopilot iteration (attempt, guarded score, no build turn) on an imported task whose
    workspace holds our Triton solution: the loop's path, not just the tools, takes the task."""
    cfg = Settings(state_dir=tmp_path / "state", interpret="always")
    task = tasks["kb_1_scaled_add"]
    ws = init_workspace(task.root, tmp_path / "ws", cfg)
    shutil.copy(HERE / "solutions" / f"{task.name}.py", ws.root / "kernel.py")
    env = {
        **os.environ,
        "HARNESSLAB_STATE_DIR": str(tmp_path / "state"),
        "HARNESSLAB_INTERPRET": "always",
    }
    run = subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", "run", "-w", str(ws.root), "--iterations",
         "1", "--runner", "autopilot", "--build", "never", "--json"],
        capture_output=True, text=True, env=env, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["status"] == "completed" and summary["iterations_done"] == 1, summary
    assert summary["baseline"]["verdict"] == "passed"
    assert summary["iterations"][0]["score"]["verdict"] == "passed"
    assert summary["final"]["verdict"] == "passed"


def test_equal_dev_sizes_do_not_confuse_the_output_axes(tmp_path: Path) -> None:
    ref = tmp_path / "transpose_scale.py"
    ref.write_text("def transpose_scale(x, s):\n    return (x * s).t()\n")
    plan = plan_new(
        "tr", f"{ref}:transpose_scale", inputs=["x:rows,dim", "s:dim"], dims=["rows=64,dim=64"]
    )
    assert plan.output_shape == ["dim", "rows"]


@pytest.mark.anyio
async def test_a_kernelbench_models_weights_are_inputs_drawn_fresh(tmp_path: Path) -> None:
    """nn.Linear's weight and bias become the task's last inputs: the baseline that uses them
    passes, a candidate that uses its own copy of the seeded init's weights does not."""
    (row,) = import_kernelbench(
        HERE / "kernelbench_weights" / "4_linear_relu.py", tmp_path / "kb", dtypes=["float32"]
    )
    task = load_task(Path(row.folder))
    assert task.declare is not None
    assert task.declare.module_params == ["linear.weight", "linear.bias"]
    assert [i.name for i in task.declare.inputs] == ["x", "linear_weight", "linear_bias"]
    # (out_features, in_features): the constructor's sizes, smaller on the interpreter
    assert task.declare.inputs[1].shape == ["out_features", "in_features"]
    assert task.declare.inputs[1].distribution == "init"  # as the Model's nn.Linear draws it
    cfg = Settings(state_dir=tmp_path / "state", interpret="always")
    ws = init_workspace(task.root, tmp_path / "ws", cfg)
    launcher = Launcher(cfg)
    try:
        with anyio.fail_after(120):
            ev = await run_objective(ws, launcher, warmup=0, repeats=1)
            assert ev.status == "passed", [c.reason for c in ev.cases]
            kernel = ws.root / "kernel.py"  # the Model itself as ModelNew: it uses the weights
            kernel.write_text(
                kernel.read_text()
                + "\n\ndef model_new(x, linear_weight, linear_bias, *, in_features, "
                "out_features):\n    torch.manual_seed(0)\n"
                "    return Model(in_features, out_features)(x)\n"
            )
            ev = await run_objective(ws, launcher, warmup=0, repeats=1)
            assert ev.status == "failed"
    finally:
        await launcher.aclose()

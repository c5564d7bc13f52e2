"""KernelBench imported whole: a sample of its public problems (tests/tasks/kernelbench/, copied
unchanged from github.com/ScalingIntelligence/KernelBench, MIT) across elementwise, reduction,
norm, softmax, loss, matmul, conv, pooling and fused level-2 ops. Each becomes a task whose
baseline passes its own eval on the Triton interpreter, or is refused with its reason; the
declarations name conv and pooling output sizes, index bounds, tied and constructor sizes; a
Triton solution of each kind, as a `model_new` function or a KernelBench `ModelNew` class,
passes the guarded verify (slow)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools.authoring.baseline_check import check_baselines
from harnesslab.tools.authoring.kernelbench import import_kernelbench, plan_kernelbench, task_name
from harnesslab.tools.authoring.scaffold import TaskRow
from harnesslab.tools.errors import UsageError
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import TaskSpec, load_task

SAMPLE = Path(__file__).resolve().parent / "kernelbench"
EDGE = Path(__file__).resolve().parent / "byok" / "kernelbench_edge"
# file -> "passed" (written, its baseline passes its own eval) or the refusal's reason (a part)
EXPECTED = {
    "level1/19_ReLU.py": "passed",
    "level1/23_Softmax.py": "passed",
    "level1/2_Standard_matrix_multiplication_.py": "passed",
    "level1/33_BatchNorm.py": "passed",
    "level1/36_RMSNorm_.py": "passed",
    "level1/44_Average_Pooling_1D.py": "passed",
    "level1/47_Sum_reduction_over_a_dimension.py": "passed",
    "level1/67_conv_standard_1D.py": "passed",
    "level1/95_CrossEntropyLoss.py": "passed",
    "level1/100_HingeLoss.py": "passed",
    "level1/5_Matrix_scalar_multiplication.py": "gives s as a float, not a tensor",
    "level2/1_Conv2D_ReLU_BiasAdd.py": "passed",
    "level2/76_Gemm_Add_ReLU.py": "passed",
    "level2/66_Matmul_Dropout_Softmax.py": "random: two calls of Model.forward",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TaskRow]:
    """Both sample levels imported, and every written task's baseline run once (one launcher)."""
    out = tmp_path_factory.mktemp("kb")
    rows: dict[str, TaskRow] = {}
    for level in ("level1", "level2"):
        for row in import_kernelbench(SAMPLE / level, out / level, dtypes=["float32"]):
            rows[f"{level}/{row.file}"] = row
    written = [r for r in rows.values() if r.status == "written"]
    cfg = Settings(state_dir=out / "state", interpret="always")
    results = anyio.run(check_baselines, [Path(r.folder) for r in written], cfg)
    for row, result in zip(written, results, strict=True):
        row.baseline = result if isinstance(result, str) else result.status
        if not isinstance(result, str):
            row.failing = [f"{c.name}: {c.reason}" for c in result.cases if c.status != "passed"]
    return rows


def test_the_sample_covers_every_file_and_kind() -> None:
    files = {f"{p.parent.name}/{p.name}" for p in SAMPLE.glob("level*/*.py")}
    assert files == set(EXPECTED)
    assert "MIT License" in (SAMPLE / "LICENSE").read_text()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_kernelbench_problem_imports_with_a_passing_baseline_or_a_reason(imported, name) -> None:
    row, want = imported[name], EXPECTED[name]
    if want == "passed":
        assert row.status == "written", row.reason
        assert row.baseline == "passed", row.failing or row.baseline
    else:
        assert row.status == "refused" and want in row.reason, row
        assert not row.folder


def _task(imported, name: str) -> TaskSpec:
    return load_task(Path(imported[name].folder))


def test_output_sizes_index_bounds_and_constructor_sizes_are_declared(imported) -> None:
    conv = _task(imported, "level1/67_conv_standard_1D.py").declare
    assert conv is not None
    # length - kernel + 1 (never an input's shape), the channels sizes of the constructor
    assert conv.output.shape == ["batch_size", "out_channels", "length - 2"]
    assert conv.scalar_dims == {"in_channels": "in_channels", "out_channels": "out_channels"}
    assert conv.inputs[1].shape == ["out_channels", "in_channels", 3]
    pool = _task(imported, "level1/44_Average_Pooling_1D.py").declare
    assert pool is not None and pool.output.shape == [
        "batch_size",
        "in_channels",
        "input_length + 1",
    ]
    ce = _task(imported, "level1/95_CrossEntropyLoss.py")
    assert ce.declare is not None
    targets = ce.declare.inputs[1]
    assert (targets.dtype, targets.low, targets.high) == ("int64", 0, "num_classes")
    assert ce.declare.interpreter["num_classes"] < ce.dev_cases[0].shape["num_classes"]
    hinge = _task(imported, "level1/100_HingeLoss.py").declare
    assert hinge is not None and hinge.inputs_from is not None
    # batch_size == input_shape[0] in the file, and its loss broadcasts one against the other
    assert hinge.inputs_from.constants == {
        "batch_size": "batch_size",
        "input_shape": ["batch_size"],
    }
    fused = _task(imported, "level2/1_Conv2D_ReLU_BiasAdd.py")
    assert fused.declare is not None
    assert fused.declare.scalar_dims["bias_shape"] == ["out_channels", 1, 1]  # a tuple argument
    assert fused.declare.init_order == ["in_channels", "out_channels", "kernel_size", "bias_shape"]
    assert fused.final is not None
    ranges = {k: (r.min, r.max) for k, r in fused.final.ranges.items()}
    assert ranges["out_channels"] == (128, 128)  # the Model as written on the GPU
    # hidden sizes from half a top size up to it: the file's, or less where a tensor would pass
    # 2^26 elements (the guarded verify holds every case's tensors at once)
    top = {k: hi for k, (_, hi) in ranges.items()}
    assert all(
        lo == -(-hi // 2)
        for k, (lo, hi) in ranges.items()
        if k not in ("in_channels", "out_channels")
    )
    assert top["batch_size"] * 64 * top["height"] * top["width"] <= 1 << 26
    assert top["batch_size"] * 128 * (top["height"] - 2) * (top["width"] - 2) <= 1 << 26


def test_batchnorm_runs_in_train_mode_with_its_parameters_as_inputs(imported) -> None:
    bn = _task(imported, "level1/33_BatchNorm.py").declare
    assert bn is not None and bn.module_mode == "train"
    # the running statistics are the Model's state, restored each call, never inputs
    assert bn.module_params == ["bn.weight", "bn.bias"]
    assert [i.name for i in bn.inputs] == ["x", "bn_weight", "bn_bias"]


def test_the_import_builds_nothing_at_the_files_full_size(imported) -> None:
    """ReLU's file size is 4096 x 393216 (6.4 GB in fp32): the dev case keeps it for the GPU,
    the interpreter gets a few thousand elements, and the import took well under a second."""
    relu = _task(imported, "level1/19_ReLU.py")
    assert relu.dev_cases[0].shape == {"batch_size": 4096, "dim": 393216}
    assert relu.declare is not None
    small = relu.declare.interpreter
    assert small["batch_size"] * small["dim"] <= 1 << 12


def test_a_folder_import_keeps_going_and_reports_every_file(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    folder = tmp_path / "problems"
    folder.mkdir()
    shutil.copy(SAMPLE / "level1" / "19_ReLU.py", folder)
    shutil.copy(SAMPLE / "level1" / "5_Matrix_scalar_multiplication.py", folder)
    (folder / "not_kernelbench.py").write_text("x = 1\n")
    (folder / "broken.py").write_text("import torch\nclass Model(:\n")
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HARNESSLAB_INTERPRET", "always")
    code = cli_main(
        ["task", "import-kernelbench", str(folder), "--out", str(tmp_path / "t"), "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    rows = {r["file"]: r for r in report["tasks"]}
    assert rows["19_ReLU.py"]["baseline"] == "passed"
    scalar = rows["5_Matrix_scalar_multiplication.py"]["reason"]
    assert "not a tensor" in scalar and "--scalar" not in scalar  # a flag it does not take
    assert "defines no Model" in rows["not_kernelbench.py"]["reason"]
    assert "SyntaxError" in rows["broken.py"]["reason"]
    assert report["totals"] == {"files": 4, "written": 1, "baseline_passes": 1, "baseline_fails": 0,
                                "refused": 3}  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["kb_19_relu"]


def test_a_failing_baseline_exits_1_and_init_refuses_the_task(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import harnesslab.tools.authoring.kernelbench as kb

    wrong = "import torch\n\n\ndef model_new(x):\n    return torch.relu(x) + 1.0\n"
    monkeypatch.setattr(kb, "forward_as_function", lambda source, init: wrong)
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HARNESSLAB_INTERPRET", "always")
    out = tmp_path / "t"
    code = cli_main(
        ["task", "import-kernelbench", str(SAMPLE / "level1" / "19_ReLU.py"), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "baseline FAILS" in printed and "next: harnesslab init" not in printed
    assert json.loads((out / "kb_19_relu" / "check.json").read_text())["baseline"] == "failed"
    code = cli_main(["init", "--task", str(out / "kb_19_relu"), "-w", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert code == 2 and "baseline failed" in err and "--allow-failed-baseline" in err
    assert not (tmp_path / "ws").exists()


async def _verify(task: TaskSpec, solution: Path, tmp: Path) -> None:
    cfg = Settings(state_dir=tmp / "state", interpret="always")
    ws = init_workspace(task.root, tmp / "ws", cfg)
    shutil.copy(solution, ws.root / "kernel.py")
    launcher = Launcher(cfg)
    try:
        verdict = await guarded_verify(ws, launcher, cfg)
    finally:
        await launcher.aclose()
    assert verdict.verdict == "passed", verdict.reasons


SOLUTIONS = sorted((SAMPLE / "solutions").glob("kb_*.py"))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.anyio
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
async def test_a_triton_solution_of_each_kind_passes_the_guarded_verify(solution, tmp_path) -> None:
    """elementwise, reduction, norm, softmax, loss, matmul, pooling as `model_new` functions;
    conv and a fused level-2 conv as KernelBench `ModelNew` classes; a fused GEMM as a
    function given the Model's weights."""
    files = [p for p in SAMPLE.glob("level*/*.py") if task_name(p) == solution.stem]
    (row,) = import_kernelbench(files[0], tmp_path / "kb", dtypes=["float32"])
    assert row.status == "written", row.reason
    with anyio.fail_after(840):
        await _verify(load_task(Path(row.folder)), solution, tmp_path)


def test_eval_mode_makes_the_buffers_inputs_and_turns_dropout_off() -> None:
    conv_bn = plan_kernelbench(EDGE / "strided_conv_bn.py", dtypes=["float32"], mode="eval")
    assert conv_bn.module_mode == "eval"
    assert conv_bn.module_params[-3:] == [
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    dropout = SAMPLE / "level2" / "66_Matmul_Dropout_Softmax.py"
    assert plan_kernelbench(dropout, dtypes=["float32"], mode="eval").module_mode == "eval"
    # BatchNorm alone in eval mode, at its initial statistics and affine, is the identity
    with pytest.raises(UsageError, match="cannot tell its output from zeros or a copy"):
        plan_kernelbench(SAMPLE / "level1" / "33_BatchNorm.py", dtypes=["float32"], mode="eval")

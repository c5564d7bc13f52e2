"""How the KernelBench import learns a file's sizes on meta tensors: constants written any way a
file writes them, axes named by the constant that moves them (or `2*D`, or `H - 2`), sizes a
Model needs equal tied, sizes it cannot take apart fixed, outputs derived where no expression
names them, and the staged reference that runs such a task (inputs from get_inputs, weights from
the Model's initialiser, BatchNorm's running statistics restored after every call)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnesslab.tools.authoring.kernelbench import plan_kernelbench
from harnesslab.tools.authoring.kernelbench_sizes import (
    Sizes,
    constructor_constants,
    fit,
    size_constants,
)
from harnesslab.tools.authoring.scaffold import write_task
from harnesslab.tools.task.spec import TaskSpec

EDGE = Path(__file__).resolve().parent / "byok" / "kernelbench_edge"

SOURCE = """
import torch
batch_size = 1024 * 2
height = width = 128
depth, rows, cols = (16, 32, 32)
input_shape = (4096,)
derived = batch_size * 2
kernel_size = 3
in_features = 64
flag = True
eps = 1e-5
height, width = (64, 48)

def get_inputs():
    return [torch.rand(batch_size, *input_shape)]

def get_init_inputs():
    return [in_features, kernel_size]
"""


def test_size_constants_read_every_way_a_file_writes_them() -> None:
    assert size_constants(SOURCE) == {
        "batch_size": 2048,  # folded
        "height": 64,  # the last binding wins (a chained one before it)
        "width": 48,
        "depth": 16,  # unpacked from a tuple
        "rows": 32,
        "cols": 32,
        "input_shape": (4096,),  # a tuple constant: its elements are dims
        "in_features": 64,  # a constructor size (from 16 on)
    }  # derived follows batch_size; kernel_size is a constructor argument below 16
    assert {"in_features", "kernel_size"} <= constructor_constants(SOURCE)


def test_an_axis_is_named_by_the_constant_that_moves_it() -> None:
    runs = Sizes(dims={"H": 20, "W": 33}).runs(0)
    assert fit([r["W"] for r in runs], runs) == "W"
    assert fit([2 * r["H"] for r in runs], runs) == "2*H"
    assert fit([r["H"] - 2 for r in runs], runs) == "H - 2"
    assert fit([7 for _ in runs], runs) == 7
    # a strided output is no linear expression of any dim: derived by the reference per case
    assert fit([(r["H"] + 2 - 3) // 2 + 1 for r in runs], runs) is None
    # W's value at the file's sizes, H's in the perturbed runs: neither (each dim's third
    # offset differs, so one dim never passes for another shifted)
    assert fit([runs[0]["W"], *(r["H"] for r in runs[1:])], runs) is None


@pytest.fixture(scope="module")
def plans() -> dict:
    return {p.stem: plan_kernelbench(p, dtypes=["float32"]) for p in sorted(EDGE.glob("*.py"))}


def test_a_strided_conv_output_is_derived_and_batchnorm_buffers_are_no_inputs(plans) -> None:
    plan = plans["strided_conv_bn"]
    assert plan.output_shape == "reference"
    assert plan.module_params == ["conv.weight", "conv.bias", "bn.weight", "bn.bias"]
    assert plan.module_mode == "train"
    assert plan.baseline.rstrip().endswith("class ModelNew(Model):\n    pass")


def test_sizes_the_model_needs_equal_are_tied_and_module_globals_keep_the_class_baseline(
    plans,
) -> None:
    plan = plans["global_sizes"]
    assert plan.inputs_from["constants"] == {"n": "n", "d0": "d0", "d1": "d0"}
    assert [i.shape for i in plan.inputs] == [["n", "2*d0"], ["n", "2*d0"]]
    assert "class ModelNew(Model)" in plan.baseline  # forward reads SCALE: no function rewrite


def test_sizes_the_model_cannot_take_apart_are_fixed(plans) -> None:
    plan = plans["doubled_width_norm"]
    assert plan.dims == {"batch_size": 6, "height": 10}  # width and features stay as written
    assert plan.inputs[0].shape == ["batch_size", "height", 32]
    assert plan.scalars == {"features": 64}


def _staged(plan, tmp: Path):
    """The task written, and its reference as the GPU host gets it."""
    from harnesslab.tools.execution.launcher import runner_source
    from harnesslab.tools.gpu.runner import load_module

    task: TaskSpec = write_task(plan, tmp / plan.name)
    assert task.declare is not None
    stage = tmp / "stage"
    stage.mkdir()
    for p in task.root.glob("*.py"):
        shutil.copy(p, stage)
    (stage / "reference.py").write_bytes(runner_source("declared.py"))
    (stage / "declaration.json").write_text(task.declare.staged_json(task.dev_cases[0].shape))
    return load_module(stage / "reference.py", f"_kb_sizes_ref_{plan.name}"), task


def test_the_staged_reference_derives_the_output_and_restores_the_buffers(plans, tmp_path) -> None:
    import torch

    ref, _ = _staged(plans["strided_conv_bn"], tmp_path)
    for h, w in ((20, 33), (9, 16)):
        dims = {"batch_size": 3, "height": h, "width": w}
        args, kwargs = ref.make_inputs(dims, torch.float32, "cpu", torch.Generator().manual_seed(1))
        assert args[0].shape == (3, 3, h, w) and 0 <= float(args[0].min())  # get_inputs' rand
        out = ref.reference(*args, **kwargs)
        assert ref.output_spec(*args, **kwargs)[0] == tuple(out.shape)
        assert tuple(out.shape) == (3, 8, (h - 1) // 2 + 1, (w - 1) // 2 + 1)
        assert ref.bytes_moved(dims, 4) > 4 * args[0].numel()  # the derived output counted
    (model,) = [m for k, m in ref._MODULES.items() if "cpu" in k]
    assert float(model.bn.running_mean.abs().max()) == 0.0  # never drifted
    assert int(model.bn.num_batches_tracked) == 0


def test_index_inputs_stay_within_the_size_they_index(tmp_path) -> None:
    import torch

    sample = Path(__file__).resolve().parent / "kernelbench" / "level1" / "95_CrossEntropyLoss.py"
    ref, task = _staged(plan_kernelbench(sample, dtypes=["float32"]), tmp_path)
    dims = {"batch_size": 16, "num_classes": 5}
    (logits, targets), _ = ref.make_inputs(dims, torch.float32, "cpu", torch.Generator())
    assert logits.shape == (16, 5) and int(targets.max()) < 5
    # the probes and edges draw per declaration: the bound is the dim there too
    assert (
        int(
            ref._draw(
                task.declare.inputs[1].model_dump(),
                ref._shape(task.declare.inputs[1].model_dump(), dims),
                torch.Generator(),
            ).max()
        )
        < 5
    )

"""What every shipped task must satisfy, whatever it computes: its task.toml parses and its kind
accepts it; for a kernel task, the baseline and every reference solution match the reference on
irregular shapes and pass every probe with the declared output shape and dtype, and the
baseline's config is inside the declared launch space. Task-specific checks (probes that catch
known bugs, the reference's interface) stay in tests/tasks/test_<task>.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harnesslab.tests.tasks.kernel_check import failures, interpret, load_reference
from harnesslab.tools.gpu import numerics
from harnesslab.tools.task.kinds import kind_of
from harnesslab.tools.task.spec import TaskSpec, list_tasks, load_task

TASKS = list_tasks()
KERNEL_TASKS = [t for t in TASKS if load_task(t).kind == "kernel"]
# Shapes that break tiling assumptions (ragged last blocks, lost 16-byte alignment, the wide
# paths); a task without an entry here is checked on its dev cases' interpreter shapes.
IRREGULAR: dict[str, list[dict[str, int]]] = {
    "rmsnorm_gate": [{"rows": 3, "dim": 1000}, {"rows": 3, "dim": 3000}, {"rows": 3, "dim": 5120}],
    "swiglu": [{"rows": 3, "dim": 1000}, {"rows": 5, "dim": 3000}, {"rows": 2, "dim": 14336}],
    "softmax": [{"rows": 7, "dim": 1000}, {"rows": 3, "dim": 3000}, {"rows": 2, "dim": 32768},
                {"rows": 2, "dim": 40000}],
    # No size a multiple of 32; k = 1000 is not a multiple of the CPU tile's BLOCK_K; n = 72
    # keeps the TMA path (16-byte rows).
    "matmul": [{"m": 37, "n": 72, "k": 1000}, {"m": 100, "n": 40, "k": 88}],
}  # fmt: skip


def irregular_shapes(spec: TaskSpec) -> list[dict[str, int]]:
    if spec.name in IRREGULAR:
        return IRREGULAR[spec.name]
    ref = load_reference(spec)
    return [ref.interpreter_shape(c.shape) for c in spec.dev_cases]


@pytest.fixture(scope="module", params=KERNEL_TASKS)
def interpreted(request: pytest.FixtureRequest) -> tuple[TaskSpec, dict[str, Any]]:
    spec = load_task(request.param)
    kernels = {"baseline": spec.workspace_template / "kernel.py", **spec.solutions()}
    return spec, interpret(spec, kernels, irregular_shapes(spec))


@pytest.mark.parametrize("name", TASKS)
def test_the_task_toml_parses_and_its_kind_accepts_it(name: str) -> None:
    spec = load_task(name)
    assert kind_of(spec).problems(spec) == []
    assert (spec.root / "task.md").is_file()


def test_baseline_and_solutions_match_the_reference_on_irregular_shapes(interpreted) -> None:
    spec, results = interpreted
    assert spec.solutions(), f"tasks/{spec.name}/solutions/ has no solution"
    for label in ["baseline", *spec.solutions()]:
        assert failures(results, f"{label}/", probes=False) == []


def test_baseline_and_solutions_pass_every_probe_and_generic_edge(interpreted) -> None:
    spec, results = interpreted
    assert {k.split("probe:")[1] for k in results if "/probe:" in k} == set(
        load_reference(spec).PROBES
    )
    # every size edge and every value family ran (an inapplicable one is the exception)
    suite = {k.split("suite:")[1] for k in results if "/suite:" in k}
    assert set(numerics.SIZE_EDGES) <= suite and len(suite) >= len(numerics.NAMES) - 2, suite
    for label in ["baseline", *spec.solutions()]:
        assert failures(results, f"{label}/", probes=True) == []


def test_outputs_have_the_declared_shape_and_dtype(interpreted) -> None:
    _, results = interpreted
    assert [k for k, v in results.items() if not v["spec_ok"]] == []


@pytest.mark.parametrize("name", KERNEL_TASKS)
def test_baseline_config_is_inside_the_declared_space(name: str) -> None:
    spec = load_task(name)
    config = json.loads((spec.workspace_template / "kernel_config.json").read_text())
    assert set(config) == set(spec.space)
    spec.validate_config(config, source="kernel_config.json")

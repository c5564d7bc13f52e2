"""A declared task gets the generic adversarial inputs too (issue 26.1): a LayerNorm that takes
the variance as E[x^2] - mean^2 (catastrophic cancellation on rows with a large mean and a small
spread) is rejected by the guarded verify and named by numerical_probe, with by how much; its
honest two-pass twin passes both. Both ran clean before the suite existed: every edge of a
declared task scaled or zeroed whole tensors drawn around 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from harnesslab.tools.authoring.scaffold import write_task
from harnesslab.tools.authoring.task_new import plan_new
from harnesslab.tools.evaluation.probe import ProbeReport, numerical_probe
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.gpu import numerics
from harnesslab.tools.integrity.verify import Verdict, guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import TaskSpec

HERE = Path(__file__).resolve().parent / "numerics"


@pytest.fixture(scope="module")
def layernorm(tmp_path_factory: pytest.TempPathFactory) -> TaskSpec:
    plan = plan_new(
        "layernorm",
        f"{HERE / 'layernorm.py'}:layer_norm",
        kernel=f"{HERE / 'layernorm_two_pass.py'}:layer_norm",
        inputs=["x:rows,dim", "weight:dim", "bias:dim"],
        dims=["rows=8,dim=64"],
        dtypes=["float16", "float32"],
        ranges=["rows=4:12"],
    )
    return write_task(plan, tmp_path_factory.mktemp("declared") / "layernorm")


def run(task: TaskSpec, kernel: str, tmp: Path) -> tuple[Verdict, ProbeReport]:
    cfg = Settings(state_dir=tmp / "state", interpret="always")
    ws = init_workspace(task.root, tmp / "ws", cfg)
    shutil.copy(HERE / kernel, ws.root / task.entry_file)

    async def go() -> tuple[Verdict, ProbeReport]:
        launcher = Launcher(cfg)
        try:
            with anyio.fail_after(300):
                verdict = await guarded_verify(ws, launcher, cfg)
                return verdict, await numerical_probe(ws, launcher)
        finally:
            await launcher.aclose()

    return anyio.run(go)


def test_a_layernorm_with_cancelling_variance_is_rejected_and_probed(layernorm, tmp_path) -> None:
    verdict, probe = run(layernorm, "layernorm_one_pass.py", tmp_path)
    assert verdict.verdict == "rejected", verdict.reasons
    assert "precision" in {r["code"] for r in verdict.reasons}  # the offset family's code
    assert probe.status == "failed" and "offset/float16" in probe.failing
    row = next(r for r in probe.results if r.probe == "offset" and r.dtype == "float16")
    assert row.family == "offset" and row.inputs and row.tolerance_ratio is not None
    assert row.tolerance_ratio > 1 and row.max_abs_err and row.why_it_matters
    assert all(r.passed for r in probe.results if r.probe in numerics.SIZE_EDGES)


def test_the_honest_two_pass_layernorm_passes_verify_and_every_probe(layernorm, tmp_path) -> None:
    verdict, probe = run(layernorm, "layernorm_two_pass.py", tmp_path)
    assert verdict.verdict == "passed", verdict.reasons
    assert probe.status == "passed", probe.failing
    assert {r.probe for r in probe.results} == set(numerics.NAMES)
    assert {r.dtype for r in probe.results} == {"float16", "float32"}

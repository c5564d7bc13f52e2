"""The guarded verify on a real GPU (tests/gpu/conftest.py marks it gpu and skips it without
one): every shipped task's honest kernels pass record -> replay -> check -> time, and the
GPU-only cheats are rejected or harmless. benchmarks/integrity2_gpu.py runs the same on a device host with timings."""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path

import anyio
import pytest

from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.verify import Verdict, guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace
from harnesslab.tools.task.spec import load_task

HERE = Path(__file__).parent
CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats"


def verify(ws: Workspace, settings: Settings, **kw) -> Verdict:
    async def go() -> Verdict:
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(600):
                return await guarded_verify(ws, launcher, settings, **kw)
        finally:
            await launcher.aclose()

    return anyio.run(go)


@pytest.mark.parametrize("task", ["rmsnorm_gate", "swiglu", "softmax", "matmul"])
def test_every_honest_kernel_passes_the_replayed_verify(tmp_path: Path, task: str) -> None:
    spec = load_task(task)
    settings = Settings(state_dir=tmp_path / "state")
    for n, path in enumerate(
        [spec.workspace_template / spec.entry_file, *spec.solutions().values()]
    ):
        ws = init_workspace(task, tmp_path / f"ws{n}", settings)
        shutil.copy(path, ws.root / spec.entry_file)
        v = verify(ws, settings)
        assert v.verdict == "passed", (path.name, v.reasons)
        assert v.certifies == "correctness_and_speed" and v.sandbox == "full"


@pytest.mark.parametrize("path", sorted((CORPUS / "gpu").glob("*.py")), ids=lambda p: p.stem)
def test_a_gpu_only_cheat_is_rejected_or_harmless(tmp_path: Path, path: Path) -> None:
    want = re.search(r"^gpu: (\S+)", path.read_text(), re.M).group(1)  # type: ignore[union-attr]
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    honest = re.sub(r"# -- exploit.*?# -- end exploit\n", "", path.read_text(), flags=re.S)
    (ws.root / "kernel.py").write_text(honest)
    verify(ws, settings)  # the honest twin becomes the incumbent
    shutil.copy(path, ws.root / "kernel.py")
    v = verify(ws, settings, enforce_scan=False)
    if want == "harmless":
        assert v.verdict == "rejected" or (
            v.verdict == "passed"
            and not v.is_new_best
            and (v.incumbent or {}).get("speedup", 0) < 1.03
        ), v.reasons
    else:
        assert v.verdict == "rejected" and want in {r["code"] for r in v.reasons}, v.reasons


def test_a_kernel_that_builds_dataclasses_and_namedtuples_in_its_call_passes(
    tmp_path: Path,
) -> None:
    """guard_child's monkey_patch on a GPU host too: the classes a call makes for itself
    (cheats/honest/class_builder.py) are not patches, and the replayed verify passes it."""
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    shutil.copy(CORPUS / "honest" / "class_builder.py", ws.root / "kernel.py")
    v = verify(ws, settings)
    assert v.verdict == "passed", v.reasons
    assert v.certifies == "correctness_and_speed" and v.sandbox == "full"

"""The stage: the installed harness, a task's reference and candidates, mirrored to executors
without what the host writes itself."""

from __future__ import annotations

import pytest

from harnesslab.tools.execution.executor import LocalExecutor
from harnesslab.tools.execution.staging import HARNESS, RUNNER_FILES, Stage, runner_source
from harnesslab.tools.gpu import staged_name
from harnesslab.tools.task.spec import load_task


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_a_tampered_staged_harness_is_replaced_by_the_installed_one(tmp_path):
    stage = Stage(tmp_path / "stage")
    task = load_task("rmsnorm_gate")
    (stage.root / HARNESS).mkdir(parents=True)
    (stage.root / HARNESS / "runner.py").write_text("print('not the runner')\n")
    stage.stage_task(task)
    for name in RUNNER_FILES:  # flat on the GPU host: each file by its basename
        assert (stage.root / HARNESS / staged_name(name)).read_bytes() == runner_source(name)
    staged = sorted(p.name for p in (stage.root / HARNESS).iterdir())
    assert staged == sorted(staged_name(n) for n in RUNNER_FILES)
    assert (stage.root / "tasks" / task.name / "reference.py").is_file()


def test_a_candidate_is_staged_once_under_its_workspace_scope(tmp_path):
    stage = Stage(tmp_path / "stage")
    rel = stage.stage_candidate({"kernel.py": b"A"}, "d1", scope="ws1")
    assert rel == "candidates/ws1/d1"
    assert stage.stage_candidate({"kernel.py": b"B"}, "d1", scope="ws1") == rel  # content-keyed
    assert (stage.root / rel / "kernel.py").read_bytes() == b"A"
    assert stage.stage_candidate({"kernel.py": b"A"}, "d1", scope="ws2") == "candidates/ws2/d1"
    assert not [p for p in (stage.root / "candidates" / "ws1").iterdir() if p.name != "d1"]


@pytest.mark.anyio
async def test_publish_mirrors_the_stage_to_every_executor_but_not_what_the_host_writes(tmp_path):
    stage = Stage(tmp_path / "stage")
    for host_written in ("scratch", "tcache"):
        (stage.root / host_written).mkdir()
        (stage.root / host_written / "x").write_text("the host's own")
    hosts = [LocalExecutor(tmp_path / "host1"), LocalExecutor(tmp_path / "host2")]
    await stage.publish(load_task("rmsnorm_gate"), hosts)
    for ex in hosts:
        mirrored = tmp_path / ex.root.name / "stage"
        assert (mirrored / HARNESS / "runner.py").read_bytes() == runner_source()
        assert not (mirrored / "scratch").exists() and not (mirrored / "tcache").exists()

"""A warm runner whose allocation (or connection) went away while it started is that loss, not a
broken host: the launcher passes the executor's classified error on with started=False, so the
call starts a new worker on a new allocation (tools/execution/warm.py, RETRY_FRESH). On Slurm a
step gone when its policy is written is asked about its job, as a step that stopped answering
is. In the suite under load, `scancel` of an idle allocation and the next call's new worker
raced: the worker was started on the cancelled job, its policy write failed, and the call
failed `remote_env` ("the warm runner's sandbox did not take its policy")."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import make_launcher
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.execution.executor import InteractiveProcess
from harnesslab.tools.execution.slurm import SlurmInteractive
from harnesslab.tools.task import load_task

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gone(InteractiveProcess):
    """A started process that is gone when written to, with `error`."""

    pid = 0

    def __init__(self, error: Exception) -> None:
        self.error, self.killed = error, False

    async def send_line(self, line: str) -> None:
        raise self.error

    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        return None

    async def kill(self) -> None:
        self.killed = True


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("allocation_lost", "allocation_lost"), ("dropped", "dropped"), ("crashed", "remote_env")],
)
async def test_a_worker_that_lost_its_allocation_before_its_policy_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, expected: str
) -> None:
    launcher = make_launcher(tmp_path)
    slot = launcher.slots[0]
    proc = Gone(ExecutorError("it went", kind=kind, started=True))

    async def start(*args: object, **kwargs: object) -> InteractiveProcess:
        return proc

    monkeypatch.setattr(slot.executor, "start", start)
    with pytest.raises(ExecutorError) as err:
        await launcher.start_worker(slot, "evaluate", load_task("rmsnorm_gate"), {}, 30.0, "w.log")
    assert err.value.kind == expected and err.value.started is False
    assert proc.killed


class Scheduler:
    """The part of SlurmExecutor a step asks when it stops answering."""

    on_this_machine = False

    def __init__(self, lost: bool) -> None:
        self.lost, self.asked = lost, 0

    async def _check_lost(self, stderr: str, *, ended: bool = False) -> None:
        self.asked += 1
        assert ended
        if self.lost:
            raise ExecutorError("the allocation was cancelled", kind="allocation_lost")


@pytest.mark.parametrize("lost", [True, False])
async def test_a_slurm_step_gone_when_written_to_asks_whether_its_job_is(lost: bool) -> None:
    scheduler = Scheduler(lost)
    step = SlurmInteractive(
        scheduler,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        "hl-step",
        Gone(ExecutorError("the warm worker was gone", kind="crashed", started=False)),
        None,
    )
    with pytest.raises(ExecutorError) as err:
        await step.send_line("{}")
    assert scheduler.asked == 1
    assert err.value.kind == ("allocation_lost" if lost else "crashed")

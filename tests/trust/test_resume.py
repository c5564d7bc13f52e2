"""Attack: `harnesslab run --resume` read its run state from the workspace, so a forged
`runs/<id>/state.json` chose the agent command it ran and the process groups it killed (with
no start time recorded, any pid). Run state lives in the trusted store; a leftover process
group is killed only when its leader's recorded start time matches."""

from __future__ import annotations

import subprocess
import sys

from harnesslab.tools.loop.state import RunConfig, RunState, kill_leftovers, process_start

from .support import cli, init_ws


def victim() -> subprocess.Popen:
    """An unrelated process group of this user: the kill target the forger names."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_a_forged_run_state_in_the_workspace_runs_nothing_and_kills_nothing(
    tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    pwned = tmp_path / "PWNED"
    proc = victim()
    try:
        config = RunConfig(
            task="rmsnorm_gate",
            workspace=root,
            runner="exec",
            agent_cmd=f"{sys.executable} -c \"open({str(pwned)!r}, 'w')\" {{prompt_file}}",
            build="never",
        )
        state = RunState(run_id="r1", config=config, active=[{"pid": proc.pid}])
        folder = root / ".harnesslab/runs/r1"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(state.model_dump_json())

        code, _, err = cli(
            ["run", "-w", str(root), "--resume", "r1"], tmp_path, monkeypatch, capsys
        )
        assert code == 2 and "no run 'r1'" in err
        assert not pwned.exists()
        assert proc.poll() is None  # still running: not ours to kill
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_leftover_group_is_killed_only_when_its_start_time_matches():
    unrecorded, wrong, ours = victim(), victim(), victim()
    try:
        killed = kill_leftovers(
            [
                {"pid": unrecorded.pid},
                {"pid": wrong.pid, "start": "1"},
                {"pid": ours.pid, "start": process_start(ours.pid)},
            ]
        )
        assert killed == [ours.pid]
        assert ours.wait(timeout=10) is not None
        assert unrecorded.poll() is None and wrong.poll() is None
    finally:
        for proc in (unrecorded, wrong, ours):
            proc.kill()
            proc.wait(timeout=10)

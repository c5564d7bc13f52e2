"""Attack: read the hidden final cases. `harnesslab verify --json` (task.md tells the agent to
run it), guarded_final_verify's answer, the ledger's view and every other file in the
workspace must not give a hidden case's shape: not its name, not its sizes, and not the
per-case bytes, GB/s or times from which a shape follows. The operator's `--reveal-cases`
shows them. The task is rmsnorm_gate with its 6 hidden cases drawn from fewer rows
(`small_rmsnorm`): what the verify publishes is the same, it costs less on the interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.task_server import build_task_server
from harnesslab.tests.conftest_shared import small_rmsnorm
from harnesslab.tools.state.secrets_store import workspace_secret
from harnesslab.tools.task.spec import Case, load_task

from .support import agent_readable_text, cli, init_ws, settings_for

PER_CASE = ("median_us", "p10_us", "p90_us", "gbps", "pct_of_copy_bw", "shape", "rows", "dim")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(small_rmsnorm(tmp_path_factory.mktemp("task") / "rmsnorm_small", count=6))


def hidden_cases(tmp: Path, root: Path, task: str) -> list[Case]:
    seed = workspace_secret(settings_for(tmp), root)["seed"]
    final = load_task(task).final
    assert final is not None
    return final.draw(seed)


def assert_no_shape(text: str, cases: list[Case]) -> None:
    for case in cases:
        dims = "x".join(str(v) for v in case.shape.values())
        assert case.name not in text and dims not in text, case.name
        for key, value in case.shape.items():
            assert f'"{key}": {value}' not in text and f'"{key}":{value}' not in text, case.name


def per_case_numbers(obj: object) -> list[str]:
    """Keys giving a per-case time or size anywhere under a 'cases' list of hidden cases."""
    found: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "cases" and isinstance(value, list):
                for row in value:
                    if isinstance(row, dict) and str(row.get("name", "")).startswith("final"):
                        found += [k for k in PER_CASE if row.get(k) not in (None, {}, [])]
            found += per_case_numbers(value)
    elif isinstance(obj, list):
        for item in obj:
            found += per_case_numbers(item)
    return found


async def agent_calls(root: Path, tmp: Path) -> list:
    state = ServerState.open(root, settings_for(tmp))
    try:
        async with Client(build_task_server(state)) as client:
            with anyio.fail_after(240):
                return [
                    await client.call_tool("guarded_final_verify", {}),
                    await client.call_tool("rank_history", {"mode": "final"}),
                    await client.call_tool("inspect_context", {}),
                ]
    finally:
        await state.aclose()


def test_no_hidden_shape_reaches_cli_output_tool_answers_or_workspace_files(
    task, tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys, task)
    code, out, err = cli(["verify", "-w", str(root), "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    cases = hidden_cases(tmp_path, root, task)
    assert_no_shape(out + err, cases)
    assert per_case_numbers(json.loads(out)) == []

    ver, rank, ctx = anyio.run(agent_calls, root, tmp_path)
    assert ver.structured_content["verdict"] == "passed"
    for res in (ver, rank, ctx):
        text = json.dumps(res.structured_content)
        assert_no_shape(text, cases)
        assert per_case_numbers(res.structured_content) == []

    # Every file the agent can read: the ledger's view, telemetry, sweeps, run folders.
    files = agent_readable_text(root)
    assert_no_shape(files, cases)
    for path in root.rglob("*.json*"):
        for line in path.read_text().splitlines():
            try:
                assert per_case_numbers(json.loads(line)) == [], path
            except json.JSONDecodeError:
                break  # a pretty-printed document: checked whole below
        if path.suffix == ".json":
            assert per_case_numbers(json.loads(path.read_text())) == [], path


@pytest.mark.slow(
    "repeated by tests/servers/test_cli.py::test_init_then_eval_json_then_verify_json_succeed_on_"
    "the_cpu: its `verify --json --reveal-cases` shows exactly the drawn hidden cases"
)
def test_the_operator_sees_the_hidden_cases_only_with_reveal_cases(
    task, tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys, task)
    argv = ["verify", "-w", str(root), "--json", "--reveal-cases"]
    code, out, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert code == 0, err
    shown = {c["name"] for c in json.loads(out)["evidence"]["cases"]}
    assert shown == {c.name for c in hidden_cases(tmp_path, root, task)}

"""The kernel task server through the SDK's in-memory Client: every tool in both protocol modes
(legacy initialize handshake over in-memory streams; modern 2026-07-28 direct dispatch), bad
input, a workspace deleted mid-call, concurrent clients, command tasks, presets, telemetry.

Real runner calls (Triton CPU interpreter) happen only in the module-scoped `real` server; the
argument-handling tests use CannedLauncher (tests/servers/support.py).
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from harnesslab.servers.builtin import BUILTINS, BuiltinTool, register_builtin
from harnesslab.servers.task_server import build_task_server
from harnesslab.tools.errors import UsageError
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.state.ledger import Ledger
from harnesslab.tools.state.workspace import init_workspace

from .support import (
    SMALL,
    TOOL_NAMES,
    CannedLauncher,
    command_task,
    kernel_workspace,
    settings,
    state_for,
    text_of,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def real(tmp_path_factory):
    """One workspace and server with the real launcher, shared by the module (runner calls
    cost seconds on the interpreter)."""
    tmp = tmp_path_factory.mktemp("real")
    state = state_for(kernel_workspace(tmp).root, tmp)
    yield state, build_task_server(state)
    await state.aclose()


@pytest.fixture(scope="module")
async def canned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("canned")
    state = state_for(kernel_workspace(tmp).root, tmp, CannedLauncher(settings(tmp)))
    yield state, build_task_server(state)
    await state.aclose()


async def call(client: Client, tool: str, args: dict[str, Any] | None = None, **kw: Any):
    with anyio.fail_after(180):
        return await client.call_tool(tool, args or {}, **kw)


async def test_every_tool_answers_over_the_legacy_handshake_with_the_real_runner(real):
    await exercise_every_tool(*real, mode="legacy")


async def test_every_tool_answers_over_modern_direct_dispatch(canned):
    # "auto" on an in-process server is the 2026-07-28 direct dispatch. The real runner in this
    # mode is covered by the self-test (tests/servers/test_stdio_e2e.py).
    await exercise_every_tool(*canned, mode="auto")


async def exercise_every_tool(state, server, *, mode: str) -> None:
    canned = isinstance(state.launcher, CannedLauncher)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with Client(server, mode=mode) as client:
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        assert modern == (mode == "auto")
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == TOOL_NAMES
        for tool in listed.values():
            assert tool.annotations is not None and tool.output_schema is not None
            assert "Next" in tool.description or "next" in tool.description
            assert not tool.input_schema.get("required")  # every argument has a default

        ctx = await call(client, "inspect_context")
        assert not ctx.is_error, text_of(ctx)
        assert ctx.structured_content["task"]["name"] == "rmsnorm_gate"
        assert "hidden_final_domain" in ctx.structured_content["task"]

        obj = await call(client, "run_objective", {"cases": [SMALL]}, progress_callback=on_progress)
        assert not obj.is_error, text_of(obj)
        assert obj.structured_content["status"] == "passed"
        assert [c["name"] for c in obj.structured_content["cases"]] == [SMALL]
        assert any(SMALL in (m or "") for _, _, m in progress)
        assert json.loads(text_of(obj))["candidate"] == obj.structured_content["candidate"]

        progress.clear()
        sw = await call(
            client,
            "sweep_kernel_config",
            {"space": {"num_warps": [2, 4]}, "cases": [SMALL], "max_configs": 2},
            progress_callback=on_progress,
        )
        assert not sw.is_error, text_of(sw)
        assert sw.structured_content["tried"] == 2 and sw.structured_content["ok"] == 2
        assert len(progress) >= 2  # one per config
        # The runner streams each config's cases too: progress counts configs, one total,
        # strictly growing (MCP), ending at the total and never past it.
        done = [d for d, _, _ in progress]
        assert done == sorted(set(done)) and len({t for _, t, _ in progress}) == 1
        assert done[-1] == progress[-1][1] == 2

        pr = await call(client, "numerical_probe", {"probes": ["zero_rows"], "dtypes": ["float16"]})
        assert not pr.is_error, text_of(pr)
        assert pr.structured_content["status"] == "passed"

        ver = await call(client, "guarded_final_verify")
        assert not ver.is_error, text_of(ver)
        if not canned:  # the canned runner cannot answer the verifier's integrity checks
            assert ver.structured_content["verdict"] == "passed", text_of(ver)
            assert len(ver.structured_content["cases"]) == state.workspace.task.final.count
        assert "final0" not in text_of(ver)  # hidden case names and shapes stay on the server

        rank = await call(client, "rank_history", {"limit": 5})
        assert not rank.is_error, text_of(rank)
        assert rank.structured_content["best"]["is_best"] is True

        back = await call(client, "restore_best_checkpoint")
        assert not back.is_error, text_of(back)

        prof = await call(client, "profile_kernel", {"case": SMALL})
        assert prof.is_error and "no GPU" in text_of(prof)  # CI has no GPU: a clear answer

        health = await call(client, "remote_health_check", {"runner": mode == "legacy"})
        assert not health.is_error, text_of(health)
        assert health.structured_content["hosts"][0]["reachable"] is True

    rec = [r for r in state.telemetry.records() if r["tool"] == "run_objective"][-1]
    assert rec["args"] == ["cases"] and rec["status"] == "ok"


BAD_INPUT = [
    ("run_objective", {"warmup": -1}, ["warmup", "0..100"]),
    ("run_objective", {"repeats": 1000}, ["repeats", "1..200"]),
    ("run_objective", {"warmup": "lots"}, ["warmup", "integer"]),
    ("run_objective", {"cases": ["nope"]}, ["cases", "nope", SMALL]),
    ("run_objective", {"cases": ["../../etc/passwd"]}, ["cases"]),
    ("run_objective", {"cases": ["x; rm -rf ~"]}, ["cases"]),
    ("run_objective", {"cases": "1024x1024_fp16 && reboot"}, ["cases"]),
    ("run_objective", {"bogus": 1}, ["bogus", "warmup"]),
    ("sweep_kernel_config", {"space": {"num_warps": [3]}}, ["num_warps", "1,2,4,8,16,32"]),
    ("sweep_kernel_config", {"space": {"bogus": [1]}}, ["bogus", "num_warps"]),
    ("sweep_kernel_config", {"space": {"num_warps": []}}, ["num_warps"]),
    ("sweep_kernel_config", {"max_configs": 0}, ["max_configs", "1..256"]),
    ("numerical_probe", {"probes": ["nope"]}, ["probes", "zero_rows"]),
    ("numerical_probe", {"probes": ["zero_rows$(id)"]}, ["probes"]),
    ("numerical_probe", {"dtypes": ["int8"]}, ["dtypes", "float16"]),
    ("rank_history", {"mode": "best"}, ["mode", "dev"]),
    ("rank_history", {"limit": 0}, ["limit", "1..100"]),
    ("restore_best_checkpoint", {"candidate": "../../kernel.py"}, ["candidate"]),
    ("restore_best_checkpoint", {"candidate": "deadbeef"}, ["deadbeef", "rank_history"]),
    ("profile_kernel", {"case": "`reboot`"}, ["case"]),
    ("profile_kernel", {"repeats": 99}, ["repeats", "1..20"]),
    ("inspect_context", {"recent": "many"}, ["recent"]),
]


@pytest.mark.parametrize(("tool", "args", "expected"), BAD_INPUT)
async def test_bad_input_is_a_tool_error_naming_the_argument_and_allowed_values(
    canned, tool, args, expected
):
    state, server = canned
    ledger_before = len(Ledger(state.workspace.history_path).records())
    async with Client(server, mode="legacy") as client:
        res = await call(client, tool, args)
        assert res.is_error
        for word in expected:
            assert word in text_of(res), (word, text_of(res))
        assert "Next" in text_of(res)
        alive = await call(client, "inspect_context")  # the server keeps serving
        assert not alive.is_error
    assert len(Ledger(state.workspace.history_path).records()) == ledger_before
    assert state.telemetry.records()[-2]["status"] in ("bad_input", "tool_error")


@pytest.mark.parametrize("tool", ["run_objective", "sweep_kernel_config", "guarded_final_verify"])
async def test_a_workspace_deleted_mid_call_is_a_tool_error_and_is_not_recreated(tmp_path, tool):
    launcher = CannedLauncher(settings(tmp_path))
    state = state_for(kernel_workspace(tmp_path).root, tmp_path, launcher)
    root = state.workspace.root

    async def delete_workspace(request: dict[str, Any]) -> None:
        shutil.rmtree(root)

    launcher.before_result = delete_workspace
    async with Client(build_task_server(state), mode="legacy") as client:
        res = await call(client, tool, {"cases": [SMALL]} if tool != "guarded_final_verify" else {})
        assert res.is_error and "does not exist" in text_of(res), text_of(res)
        again = await call(client, "inspect_context")
        assert again.is_error and "does not exist" in text_of(again)
    assert not root.exists()  # no ledger, checkpoint or telemetry write brought it back
    await state.aclose()


class TracingLauncher(Launcher):
    """The real launcher, recording which call each runner event belongs to; `on_first` runs
    at the first event of the first call, i.e. while that call holds the GPU lock."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.trace: list[int] = []
        self.on_first = None

    async def call(self, request, **kw):
        me = id(request)
        inner = kw.pop("on_event", None)

        async def on_event(ev):
            if ev.get("event") == "case":
                first = not self.trace
                self.trace.append(me)
                if first and self.on_first is not None:
                    await self.on_first()
            if inner is not None:
                maybe = inner(ev)
                if maybe is not None:
                    await maybe

        return await super().call(request, on_event=on_event, **kw)


async def test_gpu_work_is_serialized_while_inspect_context_is_not_blocked(tmp_path):
    launcher = TracingLauncher(settings(tmp_path))
    state = state_for(kernel_workspace(tmp_path).root, tmp_path, launcher)
    server = build_task_server(state)
    two = {"cases": [SMALL, "768x2048_fp16"]}
    seen: dict[str, Any] = {}
    async with Client(server, mode="legacy") as a, Client(server, mode="legacy") as b:

        async def while_gpu_busy() -> None:
            seen["locked"] = launcher.slots[0].lock.locked()
            with anyio.fail_after(10):  # would deadlock if inspect_context waited for the GPU
                seen["inspect"] = await b.call_tool("inspect_context", {})

        launcher.on_first = while_gpu_busy
        results = {}

        async def run(name: str, client: Client) -> None:
            results[name] = await call(client, "run_objective", two)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", a)
            tg.start_soon(run, "b", b)
    assert seen["locked"] is True
    assert not seen["inspect"].is_error
    assert seen["inspect"].structured_content["executor"]["slots"][0]["busy"] is True
    assert all(not r.is_error for r in results.values())
    # Serialized: all case events of one call come before all of the other's.
    assert len(launcher.trace) == 4
    assert launcher.trace[0] == launcher.trace[1] and launcher.trace[2] == launcher.trace[3]
    await state.aclose()


async def test_a_command_task_serves_generic_tools_verifies_and_refuses_kernel_only_ones(tmp_path):
    root = command_task(tmp_path, "50")
    state = state_for(root, tmp_path)
    async with Client(build_task_server(state)) as client:
        first = await call(client, "run_objective")
        assert not first.is_error, text_of(first)
        assert first.structured_content["score"] == 50.0
        assert first.structured_content["command"]["exit_code"] == 0
        (root / "solution.txt").write_text("20\n")
        second = await call(client, "run_objective")
        assert second.structured_content["is_new_best"] is True
        assert second.structured_content["delta_vs_best_pct"] == pytest.approx(-60.0)
        (root / "solution.txt").write_text("crash\n")
        broken = await call(client, "run_objective")
        assert broken.structured_content["status"] == "failed"
        assert "exited with 3" in broken.structured_content["reason"]
        rank = await call(client, "rank_history", {"include_failed": True})
        assert [c["score"] for c in rank.structured_content["candidates"]] == [20.0, 50.0, None]
        back = await call(client, "restore_best_checkpoint")
        assert back.structured_content["changed"] == ["solution.txt"]
        assert (root / "solution.txt").read_text() == "20\n"
        ctx = await call(client, "inspect_context")
        assert ctx.structured_content["task"]["kind"] == "command"
        for tool in ("sweep_kernel_config", "numerical_probe"):
            res = await call(client, tool)
            assert res.is_error and "kernel tasks" in text_of(res), text_of(res)
        # guarded_final_verify runs the task's final objective
        # (tests/tools/evaluation/test_command_tasks.py)
        verified = await call(client, "guarded_final_verify")
        assert not verified.is_error, text_of(verified)
        assert verified.structured_content["verdict"] == "passed"
        assert verified.structured_content["score"] == 20.0
    await state.aclose()


@pytest.mark.slow  # ~25 s: runners on the interpreter; the library tests are faster
async def test_a_step_task_serves_its_trace_table_and_its_verify(
    tmp_path,
):
    ws = init_workspace("decode_step", tmp_path / "ws", settings(tmp_path))
    state = state_for(ws.root, tmp_path)
    async with Client(build_task_server(state)) as client:
        res = await call(client, "run_objective", {"cases": ["fixed_fp16"]})
        assert not res.is_error, text_of(res)
        out = res.structured_content
        assert out["status"] == "passed" and out["score_unit"].startswith("us (sum over the dev")
        (case,) = out["cases"]
        assert [b["bucket"] for b in case["buckets"]] == [64, "all"]
        assert case["buckets"][-1]["p50_us"] == case["median_us"] == out["score"]
        ctx = await call(client, "inspect_context")
        task = ctx.structured_content["task"]
        assert task["kind"] == "step" and set(task["dev_traces"]) == {
            "fixed_fp16", "dynamic_fp16", "dynamic_bf16"
        }  # fmt: skip
        assert set(task["launch_space"]) == {"block_n", "num_warps", "splits"}
        assert ctx.structured_content["config"] == {"block_n": 32, "num_warps": 4,
                                                    "splits": 8}  # fmt: skip
        rank = await call(client, "rank_history")
        assert rank.structured_content["best"]["candidate"] == out["candidate"]
        verify = await call(client, "guarded_final_verify")
        assert not verify.is_error, text_of(verify)
        shown = verify.structured_content
        assert shown["verdict"] == "passed" and shown["certifies"] == "step_outputs"
        assert shown["unverified"] == ["step_work", "speed"] and shown["score"] > 0
        assert shown["score_unit"].startswith("us (sum over the hidden traces of the p50")
        assert "traces" not in shown["evidence"] and "rank_history" in shown["next_step"]
        ranked = await call(client, "rank_history", {"mode": "final"})
        assert ranked.structured_content["best"]["score"] == shown["score"]
    await state.aclose()


async def test_presets_are_removed_from_the_schema_and_fixed_for_every_call(tmp_path):
    launcher = CannedLauncher(settings(tmp_path))
    state = state_for(kernel_workspace(tmp_path).root, tmp_path, launcher)
    server = MCPServer("generated")
    name = register_builtin(
        server,
        BUILTINS["run_objective"],
        state,
        name="score_small",
        description="Score the small case only.",
        presets={"cases": [SMALL], "repeats": 5},
    )
    with pytest.raises(UsageError, match="warmup"):
        register_builtin(server, BUILTINS["run_objective"], state, presets={"warmup": 10**6})
    async with Client(server) as client:
        (tool,) = (await client.list_tools()).tools
        assert tool.name == name == "score_small"
        assert set(tool.input_schema["properties"]) == {"warmup"}
        res = await call(client, "score_small", {"warmup": 2})
        assert [c["name"] for c in res.structured_content["cases"]] == [SMALL]
        assert launcher.requests[-1]["repeats"] == 5 and launcher.requests[-1]["warmup"] == 2
        fixed = await call(client, "score_small", {"cases": ["768x2048_fp16"]})
        assert fixed.is_error and "fixed by this server" in text_of(fixed)
    await state.aclose()


async def test_telemetry_records_every_call_with_argument_names_but_no_values(canned):
    state, server = canned
    before = len(state.telemetry.records())
    async with Client(server) as client:
        await call(client, "run_objective", {"cases": [SMALL], "warmup": 3})
        await call(client, "run_objective", {"cases": ["no-such-case"]})
        await call(client, "rank_history", {"limit": 1000})
    recs = state.telemetry.records()[before:]
    assert [r["status"] for r in recs] == ["ok", "tool_error", "bad_input"]
    assert recs[0]["args"] == ["cases", "warmup"] and recs[0]["result_bytes"] > 0
    for r in recs:
        assert {"time", "server", "tool", "args", "duration_ms", "status", "result_bytes"} <= set(r)
        assert r["server"] == "test-server"
    allowed = {"time", "server", "tool", "args", "duration_ms", "status", "result_bytes", "error"}
    assert all(set(r) <= allowed | {"gpu"} for r in recs)
    # GPU tools are marked (the loop sums their time); the others are not
    assert [r.get("gpu") for r in recs] == [True, True, None]
    raw = state.workspace.telemetry_path.read_text()
    assert SMALL not in raw and "no-such-case" not in raw  # names only, never values


class _In(BaseModel):
    pass


class _Out(BaseModel):
    ok: bool


async def _boom(state, args, ctx):
    raise RuntimeError("boom in handler")


async def test_an_unexpected_exception_is_logged_and_answered_and_the_server_keeps_serving(
    canned, caplog
):
    state, _ = canned
    server = MCPServer("crashy")
    crashy = BuiltinTool(
        name="crashy",
        title="Crash",
        description="Always raises. Next: nothing.",
        input_model=_In,
        output_model=_Out,
        handler=_boom,
        read_only=True,
        destructive=False,
        idempotent=True,
    )
    register_builtin(server, crashy, state)
    register_builtin(server, BUILTINS["inspect_context"], state)
    caplog.set_level(logging.ERROR, logger="harnesslab.servers")
    async with Client(server) as client:
        res = await call(client, "crashy")
        assert res.is_error and "RuntimeError: boom in handler" in text_of(res)
        assert "Next" in text_of(res)
        assert not (await call(client, "inspect_context")).is_error
    assert any(r.exc_info and "crashy" in r.getMessage() for r in caplog.records)
    assert state.telemetry.records()[-2]["status"] == "crash"


async def test_rank_history_is_paginated_and_marks_the_incumbent(tmp_path):
    state = state_for(kernel_workspace(tmp_path).root, tmp_path, CannedLauncher(settings(tmp_path)))
    ledger = Ledger(state.workspace.history_path)
    for i in range(25):
        ledger.append(
            {
                "mode": "dev",
                "case_set": "all",
                "candidate": f"{i:016x}",
                "status": "passed",
                "score": 100.0 - i,
            }
        )
    async with Client(build_task_server(state)) as client:
        first = (await call(client, "rank_history", {"limit": 10})).structured_content
        assert first["total"] == 25 and first["next_offset"] == 10
        assert first["best"]["candidate"] == f"{24:016x}" and first["candidates"][0]["is_best"]
        last = (await call(client, "rank_history", {"offset": 20, "limit": 10})).structured_content
        assert len(last["candidates"]) == 5 and last["next_offset"] is None
        assert [c["rank"] for c in last["candidates"]] == [21, 22, 23, 24, 25]
    await state.aclose()

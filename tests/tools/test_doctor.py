"""`harnesslab doctor`'s checks in process: what is missing, with the command that fixes it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from harnesslab.tools.doctor import run_doctor
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

LIMIT_S = 120


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def settings(tmp: Path) -> Settings:
    return Settings(
        state_dir=tmp / "state",
        interpret="always",
        claude_command=str(tmp / "no" / "claude"),
        codex_command=str(tmp / "no" / "codex"),
        claude_config_dir=tmp / "claude-home",
        codex_home=tmp / "codex-home",
    )


@pytest.mark.anyio
async def test_a_missing_workspace_gets_the_init_command_and_skips_the_client_configs(tmp_path):
    with anyio.fail_after(LIMIT_S):
        report = await run_doctor(tmp_path / "ws", settings(tmp_path), executor=False)
    checks = {c.name: c for c in report.checks}
    assert not report.ok
    assert checks["workspace"].status == "missing"
    assert checks["workspace"].fix.startswith(f"harnesslab init -w {tmp_path / 'ws'}")
    assert checks["claude config"].status == "skipped"


@pytest.mark.anyio
async def test_a_fresh_workspace_has_a_working_executor_and_misses_the_clients(tmp_path):
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings(tmp_path))
    with anyio.fail_after(LIMIT_S):
        report = await run_doctor(ws.root, settings(tmp_path))
    checks = {c.name: c for c in report.checks}
    assert checks["workspace"].status == "ok"
    assert checks["executor"].status == "ok", checks["executor"]
    for client, package in (("claude", "@anthropic-ai/claude-code"), ("codex", "@openai/codex")):
        cli = checks[f"{client} CLI"]
        assert cli.status == "missing" and f"npm install -g {package}@" in cli.fix
        config = checks[f"{client} config"]
        assert config.status == "missing" and "--write --approve" in config.fix
    assert not report.ok

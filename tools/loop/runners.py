"""Agent runners: one interface over the programs that play the agent in a loop iteration.

A runner gets a `Turn` (phase, prompt, workspace, MCP config file, result file, time limit,
session to resume) and returns a `TurnOutcome` (tools/loop/turn.py: process groups, capped
output, the CLI's own error in a failed turn's reason).

- exec: any command template with placeholders {prompt_file} {workspace} {mcp_config}
  {result_file} {phase} {session_id} {turn_dir}.
- claude, codex: the agent CLIs from npm (tools/loop/agent_clis.py), checked before the first turn.
- autopilot: the built-in MCP client (harnesslab.servers.autopilot), spawned like any agent.
"""

from __future__ import annotations

import shlex
import sys
from typing import Literal

from ..catalog import AUTOPILOT_MODULE
from ..errors import UsageError
from ..settings import Settings
from .agent_clis import ClaudeRunner, CliRunner, CodexRunner, codex_mcp_overrides
from .turn import AgentRunner, Phase, Turn, TurnOutcome, read_result

RunnerName = Literal["exec", "claude", "codex", "autopilot"]
PLACEHOLDERS = ("prompt_file", "workspace", "mcp_config", "result_file", "phase", "session_id")


def _placeholders(turn: Turn) -> dict[str, str]:
    return {
        "prompt_file": str(turn.prompt_file),
        "workspace": str(turn.workspace),
        "mcp_config": str(turn.mcp_config),
        "result_file": str(turn.result_file),
        "phase": turn.phase,
        "session_id": turn.session_id or "",
        "turn_dir": str(turn.dir),
    }


class ExecRunner(AgentRunner):
    """Any command. The template is split like a shell line, then each word's placeholders are
    filled, so paths with spaces stay one argument."""

    name = "exec"

    def __init__(
        self,
        template: str,
        extra_args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(extra_args, env=env)
        if not template.strip():
            raise UsageError(
                "the exec runner needs a command template.",
                next_step="pass --agent-cmd 'my-agent --prompt {prompt_file} --out {result_file}'",
            )
        try:
            self.words = shlex.split(template)
        except ValueError as exc:
            raise UsageError(f"--agent-cmd: {exc}", next_step="check the quoting") from exc
        fake = dict.fromkeys((*PLACEHOLDERS, "turn_dir"), "x")
        for word in self.words:
            try:
                word.format(**fake)
            except (KeyError, IndexError, ValueError) as exc:
                raise UsageError(
                    f"--agent-cmd: bad placeholder in {word!r} ({exc}).",
                    next_step="placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS),
                ) from exc

    def program(self) -> str:
        return self.words[0]

    def argv(self, turn: Turn) -> list[str]:
        values = _placeholders(turn)
        return [w.format(**values) for w in self.words] + self.extra_args


class AutopilotRunner(AgentRunner):
    """The built-in MCP client with a fixed strategy; no LLM, nothing to install."""

    name = "autopilot"

    async def preflight(self) -> str:
        return "the built-in autopilot (no LLM)"

    def argv(self, turn: Turn) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            AUTOPILOT_MODULE,
            "--phase",
            turn.phase,
            "--workspace",
            str(turn.workspace),
            "--mcp-config",
            str(turn.mcp_config),
            "--result-file",
            str(turn.result_file),
            "--prompt-file",
            str(turn.prompt_file),
            "--time-limit-s",
            f"{turn.timeout_s:g}",
        ]
        if turn.session_id:
            argv += ["--session-id", turn.session_id]
        return argv + self.extra_args


def build_runner(
    name: RunnerName,
    *,
    agent_cmd: str = "",
    extra_args: list[str] | None = None,
    settings: Settings | None = None,
    env: dict[str, str] | None = None,
) -> AgentRunner:
    """The runner for `name`; raises UsageError for an unknown name or a missing template.
    `settings` names the claude and codex programs (HARNESSLAB_CLAUDE_COMMAND, ...)."""
    if name == "exec":
        return ExecRunner(agent_cmd, extra_args, env=env)
    if agent_cmd:
        raise UsageError(
            f"--agent-cmd is only for --runner exec (got --runner {name}).",
            next_step="drop --agent-cmd, or use --runner exec",
        )
    if name == "claude":
        program = settings.claude_command if settings else None
        return ClaudeRunner(extra_args, program=program, env=env)
    if name == "codex":
        program = settings.codex_command if settings else None
        return CodexRunner(extra_args, program=program, env=env)
    if name == "autopilot":
        return AutopilotRunner(extra_args, env=env)
    raise UsageError(f"unknown runner {name!r}.", next_step="use exec, claude, codex or autopilot")


__all__ = [
    "AgentRunner",
    "AutopilotRunner",
    "ClaudeRunner",
    "CliRunner",
    "CodexRunner",
    "ExecRunner",
    "Phase",
    "RunnerName",
    "Turn",
    "TurnOutcome",
    "build_runner",
    "codex_mcp_overrides",
    "read_result",
]

"""Agent runners: one interface over the programs that play the agent in a loop iteration.

A runner gets a `Turn` (phase, prompt, workspace, MCP config file, result file, time limit,
session to resume) and returns a `TurnOutcome`. Every runner is a child process in its own
process group: a timeout or a cancel (Ctrl-C) kills the group with everything it started, and a
group that outlives its leader is killed too. Output goes to files in the turn's folder, capped
(head kept, then the tail), so a flooding agent cannot fill the disk.

- exec: any command template with placeholders {prompt_file} {workspace} {mcp_config}
  {result_file} {phase} {session_id} {turn_dir}.
- claude: `claude -p PROMPT --mcp-config FILE --output-format json`, session resumed with
  `--resume ID` for the build and repair turns.
- codex: `codex exec --json PROMPT` with the MCP servers passed as `-c mcp_servers.*` overrides,
  resumed with `codex exec resume ID`.
- autopilot: the built-in MCP client (harnesslab.servers.autopilot), spawned like any agent.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .agent_process import OUTPUT_CAP_BYTES, run_process
from .errors import EnvironmentProblem, UsageError
from .storage import atomic_write_text

Phase = Literal["attempt", "build", "repair"]
RunnerName = Literal["exec", "claude", "codex", "autopilot"]
PLACEHOLDERS = ("prompt_file", "workspace", "mcp_config", "result_file", "phase", "session_id")


class Turn(BaseModel):
    """One runner invocation. `dir` is the turn's folder in the run directory."""

    phase: Phase
    prompt: str
    dir: Path
    workspace: Path
    mcp_config: Path
    timeout_s: float = Field(gt=0)
    session_id: str | None = Field(default=None, description="resume this session")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    output_cap_bytes: int = OUTPUT_CAP_BYTES

    @property
    def prompt_file(self) -> Path:
        return self.dir / "prompt.md"

    @property
    def result_file(self) -> Path:
        return self.dir / "result.json"

    @property
    def stdout_file(self) -> Path:
        return self.dir / "stdout.txt"

    @property
    def stderr_file(self) -> Path:
        return self.dir / "stderr.txt"


class TurnOutcome(BaseModel):
    """What a turn did. `result` is the agent's result.json (its claim, never trusted)."""

    phase: Phase
    status: Literal["ok", "failed", "timeout", "interrupted", "not_started"]
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    session_id: str | None = None
    result: dict[str, Any] | None = None
    result_error: str = Field(default="", description="why result.json could not be used")
    output_dropped_bytes: int = 0
    error: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0


def read_result(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The agent's result.json, or (None, why not)."""
    if not path.is_file():
        return None, "the agent wrote no result.json"
    try:
        data = json.loads(path.read_text(errors="replace"))
    except json.JSONDecodeError as exc:
        return None, f"result.json is not valid JSON ({exc.msg} at line {exc.lineno})"
    if not isinstance(data, dict):
        return None, "result.json is not a JSON object"
    return data, ""


class AgentRunner(ABC):
    """Base class: subclasses say how to build argv and how to find the session id."""

    name: str = "runner"
    install_hint: str = ""

    def __init__(self, extra_args: list[str] | None = None) -> None:
        self.extra_args = list(extra_args or [])

    def preflight(self) -> None:
        """Raise EnvironmentProblem when the runner cannot start (binary missing)."""
        program = self.program()
        if shutil.which(program) is None and not Path(program).is_file():
            raise EnvironmentProblem(
                f"runner {self.name!r}: {program!r} is not installed or not on PATH.",
                next_step=self.install_hint or "install it, or use --runner autopilot",
            )

    def program(self) -> str:
        return self.name

    @abstractmethod
    def argv(self, turn: Turn) -> list[str]: ...

    def session_from_output(self, turn: Turn) -> str | None:
        return None

    async def run(
        self,
        turn: Turn,
        *,
        on_start: Callable[[int], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> TurnOutcome:
        turn.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(turn.prompt_file, turn.prompt)
        turn.result_file.unlink(missing_ok=True)
        started_at = time.time()
        try:
            proc = await run_process(
                self.argv(turn),
                cwd=turn.workspace,
                env={
                    **turn.env,
                    "HARNESSLAB_RESULT_FILE": str(turn.result_file),
                    "HARNESSLAB_PHASE": turn.phase,
                },
                timeout_s=turn.timeout_s,
                stdout_file=turn.stdout_file,
                stderr_file=turn.stderr_file,
                cap_bytes=turn.output_cap_bytes,
                on_start=on_start,
                on_exit=on_exit,
            )
        except EnvironmentProblem as exc:
            return TurnOutcome(
                phase=turn.phase,
                status="not_started",
                error=str(exc),
                started_at=started_at,
                finished_at=time.time(),
            )
        result, why = read_result(turn.result_file)
        session = self.session_from_output(turn) or turn.session_id
        if result and isinstance(result.get("session_id"), str):
            session = result["session_id"]
        status: Literal["ok", "failed", "timeout"]
        if proc.timed_out:
            status = "timeout"
            error = f"{self.name} {turn.phase} timed out after {turn.timeout_s:.0f}s; killed"
        elif proc.exit_code != 0:
            status = "failed"
            error = f"{self.name} {turn.phase} exited with {proc.exit_code}: " + _tail(
                turn.stderr_file
            )
        else:
            status, error = "ok", ""
        return TurnOutcome(
            phase=turn.phase,
            status=status,
            exit_code=proc.exit_code,
            timed_out=proc.timed_out,
            duration_s=proc.duration_s,
            session_id=session,
            result=result,
            result_error=why,
            output_dropped_bytes=proc.dropped_bytes,
            error=error,
            started_at=started_at,
            finished_at=time.time(),
        )


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])[:500]


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

    def __init__(self, template: str, extra_args: list[str] | None = None) -> None:
        super().__init__(extra_args)
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


class ClaudeRunner(AgentRunner):
    name = "claude"
    install_hint = "install Claude Code (npm install -g @anthropic-ai/claude-code) and log in"

    def argv(self, turn: Turn) -> list[str]:
        servers = list(json.loads(turn.mcp_config.read_text()).get("mcpServers", {}))
        argv = [
            "claude",
            "-p",
            turn.prompt,
            "--mcp-config",
            str(turn.mcp_config),
            "--strict-mcp-config",
            "--output-format",
            "json",
        ]
        if turn.session_id:
            argv += ["--resume", turn.session_id]
        if not any(a.startswith("--permission-mode") for a in self.extra_args):
            argv += ["--permission-mode", "acceptEdits"]
        if servers and "--allowedTools" not in self.extra_args:
            argv += ["--allowedTools", ",".join(f"mcp__{s}" for s in servers)]
        return argv + self.extra_args

    def session_from_output(self, turn: Turn) -> str | None:
        # --output-format json prints one object at the end: {"type": "result", "session_id": ...}
        for line in reversed(_lines(turn.stdout_file)):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
                return obj["session_id"]
        return None


class CodexRunner(AgentRunner):
    name = "codex"
    install_hint = "install the Codex CLI (npm install -g @openai/codex) and log in"

    def argv(self, turn: Turn) -> list[str]:
        argv = ["codex", "exec", "--json", "--skip-git-repo-check", "-C", str(turn.workspace)]
        if not any(a.startswith(("--sandbox", "--full-auto", "-s")) for a in self.extra_args):
            argv.append("--full-auto")
        argv += codex_mcp_overrides(turn.mcp_config) + self.extra_args
        if turn.session_id:
            return [*argv, "resume", turn.session_id, turn.prompt]
        return [*argv, turn.prompt]

    def session_from_output(self, turn: Turn) -> str | None:
        for line in _lines(turn.stdout_file):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("type") in ("thread.started", "session.created"):
                sid = obj.get("thread_id") or obj.get("session_id")
                if isinstance(sid, str):
                    return sid
        return None


def codex_mcp_overrides(mcp_config: Path) -> list[str]:
    """The Claude-format MCP config as Codex `-c mcp_servers.NAME.*=TOML` overrides."""
    servers = json.loads(mcp_config.read_text()).get("mcpServers", {})
    out: list[str] = []
    for name, spec in servers.items():
        key = f"mcp_servers.{name}"
        out += ["-c", f"{key}.command={json.dumps(spec['command'])}"]
        out += ["-c", f"{key}.args={json.dumps(spec.get('args', []))}"]
        if spec.get("env"):
            pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in spec["env"].items())
            out += ["-c", f"{key}.env={{ {pairs} }}"]
    return out


class AutopilotRunner(AgentRunner):
    """The built-in MCP client with a fixed strategy; no LLM, nothing to install."""

    name = "autopilot"

    def preflight(self) -> None:
        return None

    def argv(self, turn: Turn) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "harnesslab.servers.autopilot",
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
        ]
        if turn.session_id:
            argv += ["--session-id", turn.session_id]
        return argv + self.extra_args


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def build_runner(
    name: RunnerName, *, agent_cmd: str = "", extra_args: list[str] | None = None
) -> AgentRunner:
    """The runner for `name`; raises UsageError for an unknown name or a missing template."""
    if name == "exec":
        return ExecRunner(agent_cmd, extra_args)
    if agent_cmd:
        raise UsageError(
            f"--agent-cmd is only for --runner exec (got --runner {name}).",
            next_step="drop --agent-cmd, or use --runner exec",
        )
    runners: dict[str, type[AgentRunner]] = {
        "claude": ClaudeRunner,
        "codex": CodexRunner,
        "autopilot": AutopilotRunner,
    }
    if name not in runners:
        raise UsageError(
            f"unknown runner {name!r}.", next_step="use exec, claude, codex or autopilot"
        )
    return runners[name](extra_args)


__all__ = [
    "AgentRunner",
    "AutopilotRunner",
    "ClaudeRunner",
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

"""One agent turn and the runner interface: what a runner is given (`Turn`), what it reports
(`TurnOutcome`), and the base class every runner (exec, claude, codex, autopilot) derives from.

Every runner is a child process in its own process group: a timeout or a cancel (Ctrl-C) kills
the group with everything it started, and a group that outlives its leader is killed too.
Output goes to files in the turn's folder, capped (head kept, then the tail), so a flooding agent
cannot fill the disk. A failed turn's `error` carries the agent's own words: its CLI's error
message where the runner knows the CLI's output format, else the last lines of stderr or stdout.
"""

from __future__ import annotations

import json
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import EnvironmentProblem
from ..state.storage import atomic_write_text
from .agent_process import OUTPUT_CAP_BYTES, ProbeOutcome, probe, run_process

Phase = Literal["attempt", "build", "repair"]
TurnStatus = Literal["ok", "failed", "timeout", "interrupted", "not_started"]
PROBE_TIMEOUT_S = 30.0  # an agent CLI answers --version/--help/status in < 1 s when healthy


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
    plugin_dir: Path | None = Field(
        default=None,
        description="a Claude Code plugin folder with the turn's skills (the toolkit's, from "
        "the toolkit and the trusted store), for a runner that reads no project settings",
    )

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
    status: TurnStatus
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


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def output_tail(turn: Turn, lines: int = 3) -> str:
    """The last lines of the turn's stderr, else of its stdout (some CLIs report there). A
    Rust backtrace after the message (codex prints one on a fatal error) is left out."""
    for path in (turn.stderr_file, turn.stdout_file):
        kept = [ln.strip() for ln in read_lines(path) if ln.strip()]
        if "Stack backtrace:" in kept:
            kept = kept[: kept.index("Stack backtrace:")]
        if kept:
            return " | ".join(kept[-lines:])[:500]
    return ""


class AgentRunner(ABC):
    """Base class: subclasses say how to build argv, how to find the session id, how to read
    their CLI's own error, and what to check before the first turn."""

    name: str = "runner"
    install_hint: str = ""

    def __init__(
        self,
        extra_args: list[str] | None = None,
        *,
        program: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.extra_args = list(extra_args or [])
        self._program = program
        self.env = dict(env or {})
        self._ready: str | None = None

    def program(self) -> str:
        return self._program or self.name

    def resolved_program(self) -> str:
        """The program's path; EnvironmentProblem when it is not installed."""
        program = self.program()
        found = shutil.which(program)
        if found is None and Path(program).is_file():
            found = program
        if found is None:
            raise EnvironmentProblem(
                f"runner {self.name!r}: {program!r} is not installed or not on PATH.",
                next_step=self.install_hint or "install it, or use --runner autopilot",
            )
        return found

    async def preflight(self) -> str:
        """Check, before the first turn, that the runner can start; returns a one-line
        description of what will run. Raises EnvironmentProblem saying what to fix."""
        return self.resolved_program()

    async def ready(self) -> str:
        """`preflight` once per runner: a new run checks before it creates anything, and the
        loop it starts would check again (a CLI's checks take a few seconds)."""
        if self._ready is None:
            self._ready = await self.preflight()
        return self._ready

    async def probe(self, *args: str) -> ProbeOutcome:
        """Run the runner's program with `args` (no tokens spent: --version, --help, status)."""
        argv = [self.resolved_program(), *args]
        out = await probe(argv, env=self.env, timeout_s=PROBE_TIMEOUT_S)
        if out.timed_out:
            raise EnvironmentProblem(
                f"`{self.name} {' '.join(args)}` did not answer within {PROBE_TIMEOUT_S:.0f} s.",
                next_step=f"run `{self.program()} {' '.join(args)}` by hand to see what it waits for",
            )
        return out

    @abstractmethod
    def argv(self, turn: Turn) -> list[str]: ...

    def session_from_output(self, turn: Turn) -> str | None:
        return None

    def cli_error(self, turn: Turn) -> str:
        """The agent CLI's own error message from the turn's output, '' if it reported none."""
        return ""

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
                    **self.env,
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
        said = self.cli_error(turn)
        status: TurnStatus
        if proc.timed_out:
            status = "timeout"
            error = f"{self.name} {turn.phase} timed out after {turn.timeout_s:.0f}s; killed"
        elif proc.exit_code != 0:
            status = "failed"
            error = f"{self.name} {turn.phase} exited with {proc.exit_code}: " + (
                said or output_tail(turn) or "no output"
            )
        elif said:  # exit 0, but the CLI's own result says the turn failed
            status, error = "failed", f"{self.name} {turn.phase} reported an error: {said}"
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


__all__ = [
    "PROBE_TIMEOUT_S",
    "AgentRunner",
    "Phase",
    "Turn",
    "TurnOutcome",
    "TurnStatus",
    "output_tail",
    "read_lines",
    "read_result",
]

"""The Claude Code and Codex runners: argv for today's CLIs, their own error messages, and the
checks that run before the first turn.

Built for, and tested in CI against, the versions pinned in tests/agent_clis/package.json
(Claude Code 2.1.330, codex-cli 0.169.0); the flags were read from their `--help`:
- claude: `claude --print --output-format json --mcp-config FILE --strict-mcp-config
  --setting-sources user --plugin-dir DIR --permission-mode acceptEdits --permission-prompts
  none --allowedTools mcp__NAME,... [--resume ID] -- PROMPT`. `--permission-prompts none`
  denies anything that would prompt instead of waiting for an answer nobody gives; the result
  object on stdout carries `session_id`, `is_error` and the CLI's message in `result` ("Not
  logged in · Please run /login"). Only the toolkit's servers run (`--strict-mcp-config`), and
  nothing of the workspace's `.claude/` is read (`--setting-sources user`: no project or local
  hooks, settings, approvals or skills; measured: a SessionStart hook in
  `.claude/settings.local.json` runs without it and not with it); the turn's skills come from
  the toolkit's plugin folder (`--plugin-dir`, skills named `harnesslab:NAME`).
- codex: `codex exec [resume ID] --json --skip-git-repo-check -c sandbox_mode="workspace-write"
  -c approval_policy="never" -c projects={"WS"={trust_level="untrusted"}}
  -c mcp_servers.NAME.*=... [--ignore-rules] -- PROMPT`. `codex exec` has no `--full-auto` and
  no `-a` any more, and `codex exec resume` takes neither `-s` nor `-C`: the sandbox and
  approval policy go in as config overrides, which both accept, and the turn runs in the
  workspace as its working directory. Codex has no flag that skips a project's `.codex/`
  layer, and reads it only in a trusted project: the `projects` override makes the workspace
  untrusted for the turn (measured: `codex mcp list` then shows none of its
  `.codex/config.toml` servers), so its servers, hooks and settings are not read;
  `--ignore-rules` is added when the workspace has `.codex/rules` (execpolicy rules that allow
  commands). The servers' tools are approved (default_tools_approval_mode="approve"): exec
  cancels a tool call that waits for an approval. Events are JSON lines (`thread.started`
  carries the session id, `turn.failed` and `error` the CLI's message).

`preflight` checks, spending no tokens: the program exists; its help lists every flag a turn
uses and the turn's options followed by `--help` parse (a rejected flag or value fails here,
not in every turn); Codex loads the config overrides (`codex mcp list`); the CLI is logged in
(`claude auth status`, `codex login status`). Each failure says what to run.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from ..errors import EnvironmentProblem
from ..gpu import wire
from ..meta.client_setup import folder_key
from ..state.projection import ServerEntry, codex_entry, toml_key, toml_value
from .turn import AgentRunner, Turn, read_lines

CLAUDE_PACKAGE, CLAUDE_TESTED = "@anthropic-ai/claude-code", "2.1.330"
CODEX_PACKAGE, CODEX_TESTED = "@openai/codex", "0.169.0"
SAMPLE_SESSION = "00000000-0000-4000-8000-000000000000"
_FLAG = re.compile(r"--[A-Za-z][\w-]*")


def mcp_server_names(mcp_config: Path) -> list[str]:
    return list(json.loads(mcp_config.read_text()).get("mcpServers", {}))


def _has(args: list[str], *prefixes: str) -> bool:
    return any(a.startswith(prefixes) for a in args)


def _json_objects(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON objects among an agent CLI's output lines (hostile: wire's depth-checked reader)."""
    return [obj for obj in map(wire.json_object, lines) if obj is not None]


class CliRunner(AgentRunner):
    """A runner whose program is an agent CLI from npm: flags checked against its help."""

    package = ""
    tested = ""

    def options(self, turn: Turn) -> list[str]:
        """argv without the prompt (the prompt follows `--`)."""
        raise NotImplementedError

    def argv(self, turn: Turn) -> list[str]:
        return [*self.options(turn), "--", turn.prompt]

    def help_args(self, turn: Turn) -> list[str]:
        """Arguments that print the help listing this turn's flags."""
        return ["--help"]

    def update_hint(self) -> str:
        return f"install the tested version: npm install -g {self.package}@{self.tested}"

    async def version(self) -> str:
        out = await self.probe("--version")
        if not out.ok:
            raise EnvironmentProblem(
                f"`{self.program()} --version` failed: {out.tail()}",
                next_step=f"reinstall it: npm install -g {self.package}@{self.tested}",
            )
        found = re.search(r"\d+\.\d+\.\d+\S*", out.stdout)
        return found.group(0) if found else out.stdout.strip()[:80]

    async def check_flags(self, version: str) -> None:
        with tempfile.TemporaryDirectory(prefix="harnesslab-preflight-") as tmp:
            config = Path(tmp) / "mcp.json"
            config.write_text(json.dumps({"mcpServers": {"harnesslab": {"command": "true"}}}))
            (Path(tmp) / ".codex" / "rules").mkdir(parents=True)  # every conditional flag too
            for session in (None, SAMPLE_SESSION):
                turn = Turn(
                    phase="attempt" if session is None else "build",
                    prompt="preflight",
                    dir=Path(tmp),
                    workspace=Path(tmp),
                    mcp_config=config,
                    timeout_s=1,
                    session_id=session,
                    plugin_dir=Path(tmp),
                )
                await self._check_turn_flags(turn, version)

    async def _check_turn_flags(self, turn: Turn, version: str) -> None:
        options = self.options(turn)
        helped = await self.probe(*self.help_args(turn))
        listed = set(_FLAG.findall(helped.stdout + helped.stderr))
        missing = sorted({m.group(0) for a in options[1:] if (m := _FLAG.fullmatch(a))} - listed)
        what = f"{self.name} {version}"
        if missing:
            raise EnvironmentProblem(
                f"{what} does not list {', '.join(missing)} in `{self.name} "
                f"{' '.join(self.help_args(turn))}` (harnesslab's turns are built for "
                f"{self.tested}).",
                next_step=self._fix_for(missing),
            )
        parsed = await self.probe(*options[1:], "--help")
        if not parsed.ok:
            raise EnvironmentProblem(
                f"{what} rejects the turn's arguments: {parsed.tail()}",
                next_step=self._fix_for([a for a in self.extra_args if a in parsed.stderr]),
            )

    def _fix_for(self, offending: list[str]) -> str:
        if any(a in self.extra_args for a in offending):
            return f"drop or fix --agent-arg {' '.join(offending)}"
        return self.update_hint()


class ClaudeRunner(CliRunner):
    name = "claude"
    package, tested = CLAUDE_PACKAGE, CLAUDE_TESTED
    install_hint = (
        f"install Claude Code: npm install -g {CLAUDE_PACKAGE}@{CLAUDE_TESTED}, "
        "then log in with `claude auth login`"
    )

    def options(self, turn: Turn) -> list[str]:
        servers = mcp_server_names(turn.mcp_config)
        argv = [
            self.program(),
            "--print",
            "--output-format",
            "json",
            "--mcp-config",
            str(turn.mcp_config),
            "--strict-mcp-config",
        ]
        if not _has(self.extra_args, "--setting-sources"):
            argv += ["--setting-sources", "user"]  # no hook, setting or skill of the workspace
        if turn.plugin_dir is not None:
            argv += ["--plugin-dir", str(turn.plugin_dir)]
        if not _has(self.extra_args, "--permission-mode", "--dangerously-skip-permissions"):
            argv += ["--permission-mode", "acceptEdits"]
        if not _has(self.extra_args, "--permission-prompts"):
            argv += ["--permission-prompts", "none"]
        if servers and not _has(self.extra_args, "--allowedTools", "--allowed-tools"):
            argv += ["--allowedTools", ",".join(f"mcp__{s}" for s in servers)]
        if turn.session_id:
            argv += ["--resume", turn.session_id]
        return argv + self.extra_args

    def _result(self, turn: Turn) -> dict[str, Any] | None:
        # --output-format json prints one object at the end: {"type": "result", ...}
        for obj in reversed(_json_objects(read_lines(turn.stdout_file))):
            if obj.get("type") == "result" or "session_id" in obj:
                return obj
        return None

    def session_from_output(self, turn: Turn) -> str | None:
        obj = self._result(turn) or {}
        sid = obj.get("session_id")
        return sid if isinstance(sid, str) else None

    def cli_error(self, turn: Turn) -> str:
        obj = self._result(turn)
        if not obj or not obj.get("is_error"):
            return ""
        message = str(obj.get("result") or obj.get("subtype") or "is_error without a message")
        status = obj.get("api_error_status")
        return (message + (f" (API status {status})" if status else ""))[:500]

    async def preflight(self) -> str:
        path = self.resolved_program()
        version = await self.version()
        await self.check_flags(version)
        out = await self.probe("auth", "status", "--json")
        try:
            status = json.loads(out.stdout)
        except json.JSONDecodeError:
            status = None
        if not isinstance(status, dict):
            raise EnvironmentProblem(
                f"`{self.program()} auth status --json` did not answer with JSON: {out.tail()}",
                next_step=self.update_hint(),
            )
        if not status.get("loggedIn"):
            raise EnvironmentProblem(
                f"Claude Code {version} is not logged in (`claude auth status`: loggedIn false).",
                next_step="run `claude auth login` (or start `claude` and type /login), or set "
                "ANTHROPIC_API_KEY; then start the run again",
            )
        return f"Claude Code {version} at {path}, logged in ({status.get('authMethod', '?')})"


class CodexRunner(CliRunner):
    name = "codex"
    package, tested = CODEX_PACKAGE, CODEX_TESTED
    install_hint = (
        f"install the Codex CLI: npm install -g {CODEX_PACKAGE}@{CODEX_TESTED}, "
        "then log in with `codex login`"
    )

    def options(self, turn: Turn) -> list[str]:
        argv = [self.program(), "exec"]
        if turn.session_id:
            argv += ["resume", turn.session_id]
        argv += ["--json", "--skip-git-repo-check"]
        extra = self.extra_args
        bypass = _has(extra, "--dangerously-bypass")
        if not (
            bypass or _has(extra, "-s", "--sandbox") or any("sandbox_mode" in a for a in extra)
        ):
            argv += ["-c", 'sandbox_mode="workspace-write"']
        if not (bypass or any("approval_policy" in a for a in extra)):
            argv += ["-c", 'approval_policy="never"']
        argv += untrusted_project(turn.workspace)
        if (turn.workspace / ".codex" / "rules").exists():
            argv.append("--ignore-rules")
        return argv + codex_mcp_overrides(turn.mcp_config) + self.extra_args

    def help_args(self, turn: Turn) -> list[str]:
        return ["exec", "resume", "--help"] if turn.session_id else ["exec", "--help"]

    def session_from_output(self, turn: Turn) -> str | None:
        for obj in _json_objects(read_lines(turn.stdout_file)):
            if obj.get("type") in ("thread.started", "session.created"):
                sid = obj.get("thread_id") or obj.get("session_id")
                if isinstance(sid, str):
                    return sid
        return None

    def cli_error(self, turn: Turn) -> str:
        message = ""
        for obj in _json_objects(read_lines(turn.stdout_file)):
            kind = obj.get("type")
            if kind == "turn.failed":
                err = obj.get("error")
                message = str(err.get("message") if isinstance(err, dict) else err)
            elif kind == "error" and obj.get("message"):
                message = str(obj["message"])
            elif kind == "turn.completed":
                message = ""  # errors before a completed turn were retries that recovered
        return message[:500]

    async def check_config(self, version: str) -> None:
        """`codex mcp list` loads the config with the turn's -c overrides: a bad key or value
        (an unknown sandbox mode, a malformed server table) fails here."""
        with tempfile.TemporaryDirectory(prefix="harnesslab-preflight-") as tmp:
            config = Path(tmp) / "mcp.json"
            config.write_text(json.dumps({"mcpServers": {"harnesslab": {"command": "true"}}}))
            turn = Turn(
                phase="attempt",
                prompt="",
                dir=Path(tmp),
                workspace=Path(tmp),
                mcp_config=config,
                timeout_s=1,
            )
            options = self.options(turn)
            overrides = [
                x for i, a in enumerate(options) if a == "-c" for x in ("-c", options[i + 1])
            ]
            out = await self.probe("mcp", "list", "--json", *overrides)
        if not out.ok:
            raise EnvironmentProblem(
                f"codex {version} does not load the turn's config overrides: {out.tail(6)}",
                next_step=self._fix_for(self.extra_args) if self.extra_args else self.update_hint(),
            )

    async def preflight(self) -> str:
        path = self.resolved_program()
        version = await self.version()
        await self.check_flags(version)
        await self.check_config(version)
        if "--oss" in self.extra_args:  # a local model provider needs no login
            return f"codex {version} at {path} (local provider)"
        out = await self.probe("login", "status")
        if not out.ok:
            raise EnvironmentProblem(
                f"Codex {version} is not logged in (`codex login status`: {out.tail(1)}).",
                next_step="run `codex login` (ChatGPT account), or "
                "`printenv OPENAI_API_KEY | codex login --with-api-key`; then start the run again",
            )
        return f"codex {version} at {path}, {out.tail(1) or 'logged in'}"


def untrusted_project(workspace: Path) -> list[str]:
    """The override that makes Codex treat the workspace as untrusted for one invocation, so
    that it reads nothing of the workspace's `.codex/` layer (servers, hooks, settings): Codex
    keys trust on the folder in the user config's `projects` table, which this replaces."""
    value = toml_value({folder_key(workspace): {"trust_level": "untrusted"}})
    return ["-c", f"projects={value}"]


def codex_mcp_overrides(mcp_config: Path) -> list[str]:
    """The Claude-format MCP config as Codex `-c mcp_servers.NAME.*=TOML` overrides, with the
    startup and tool timeouts a GPU tool needs (Codex's defaults, 10 s and 60 s, cut a sweep)
    and the tools approved: `codex exec` cancels a tool call that needs an approval ("interactive
    approval is unavailable in exec mode"), and the loop's servers are harnesslab's own or
    qualified ones (the claude runner allows them with --allowedTools)."""
    servers = json.loads(mcp_config.read_text()).get("mcpServers", {})
    out: list[str] = []
    for name, spec in servers.items():
        entry = ServerEntry(
            name=name,
            command=spec["command"],
            args=spec.get("args", []),
            cwd=spec.get("cwd"),
            env=spec.get("env", {}),
        )
        table = {**codex_entry(entry), "default_tools_approval_mode": "approve"}
        for key, value in table.items():
            out += ["-c", f"mcp_servers.{toml_key(name)}.{key}={toml_value(value)}"]
    return out


__all__ = [
    "CLAUDE_PACKAGE",
    "CLAUDE_TESTED",
    "CODEX_PACKAGE",
    "CODEX_TESTED",
    "ClaudeRunner",
    "CliRunner",
    "CodexRunner",
    "codex_mcp_overrides",
    "mcp_server_names",
    "untrusted_project",
]

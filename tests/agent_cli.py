"""The real agent CLIs for the runner and client-config tests, pinned in
tests/agent_clis/package.json (CI: `npm ci --prefix tests/agent_clis`), run sealed off:

- HOME (and with it ~/.claude.json, ~/.claude/, ~/.codex/) is a fresh temporary folder, so no
  login of the machine's user is ever read;
- every variable that could carry a credential or pick a provider is removed;
- every proxy variable and both providers' base URLs point at a closed loopback port, so a CLI
  that tried to reach a model provider anyway would fail at once instead of spending tokens.

Tests that need a CLI skip, saying how to install it, when it is not there.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "agent_clis"
PINNED: dict[str, str] = json.loads((HERE / "package.json").read_text())["devDependencies"]
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens there
SECRET = re.compile(
    r"(API_KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|PROXY)|^(ANTHROPIC|CLAUDE|OPENAI|CODEX|AWS|AZURE|"
    r"GOOGLE|GCLOUD|VERTEX|BEDROCK|CLOUDSDK)",
    re.IGNORECASE,
)
CLI_TIMEOUT_S = 60  # each of these CLI calls answers in < 5 s here


def cli_path(name: str) -> Path:
    """The pinned CLI, or a skip that says how to install it."""
    path = HERE / "node_modules" / ".bin" / name
    wanted = PINNED[PACKAGES[name]]
    if not path.exists():
        pytest.skip(
            f"{name} not installed: run `npm ci --prefix tests/agent_clis` "
            f"({PACKAGES[name]}@{wanted}; CI does)"
        )
    found = _version(path)
    if wanted not in found:
        pytest.skip(
            f"{path} does not run as {name} {wanted} (`--version`: {found!r}); reinstall with "
            "`npm ci --prefix tests/agent_clis` (Claude Code's postinstall must run)"
        )
    return path


@functools.cache
def _version(path: Path) -> str:
    with tempfile.TemporaryDirectory(prefix="harnesslab-cli-home-") as home:
        try:
            res = subprocess.run(
                [str(path), "--version"],
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                env=sealed_env(Path(home)),
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return repr(exc)
    return res.stdout.strip() or res.stderr.strip()[-500:]


def sealed_env(home: Path) -> dict[str, str]:
    """The environment for a CLI: this process's, minus credentials, in a fresh HOME."""
    env = {k: v for k, v in os.environ.items() if not SECRET.search(k)}
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        HTTPS_PROXY=DEAD,
        HTTP_PROXY=DEAD,
        ALL_PROXY=DEAD,
        https_proxy=DEAD,
        http_proxy=DEAD,
        ANTHROPIC_BASE_URL=DEAD,
        OPENAI_BASE_URL=f"{DEAD}/v1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    return env


def seal(monkeypatch: pytest.MonkeyPatch, home: Path) -> dict[str, str]:
    """Apply sealed_env to this process (runners start their CLI with os.environ)."""
    env = sealed_env(home)
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def run_cli(
    name: str, *args: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cli_path(name)), *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


__all__ = ["CLI_TIMEOUT_S", "PINNED", "cli_path", "run_cli", "seal", "sealed_env"]

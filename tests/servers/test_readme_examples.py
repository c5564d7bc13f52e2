"""The README and docs/ as a new user reads them. The MCP SDK example runs as written against a
real `serve --transport http` with a token (only the host name is replaced), "Your own kernel"
goes from a function to a verdict, the Quick start, the client setup and the shared HTTP server
run as written; every other `harnesslab` command shown (GPU, SSH, Slurm) must at least parse,
every Python block compile and the TOML block load; the Inspector command names the version
the tests pin."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import pytest

from .support import kernel_workspace, serving_url

ROOT = Path(__file__).resolve().parents[2]
HARNESSLAB = Path(sys.executable).parent / "harnesslab"
CLI = [str(HARNESSLAB)] if HARNESSLAB.is_file() else [sys.executable, "-m", "harnesslab.servers"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sdk_example() -> str:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("From your own Python agent with the official SDK:", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.anyio
async def test_the_readme_sdk_example_runs_clean_against_a_tokened_http_server(tmp_path):
    code = sdk_example()
    assert "http://gpu-box:8765/mcp" in code and "progress_callback=" in code
    ws = kernel_workspace(tmp_path)
    env = {
        **os.environ,
        "HARNESSLAB_STATE_DIR": str(tmp_path / "state"),
        "HARNESSLAB_INTERPRET": "always",
        "HARNESSLAB_TOKEN": "s3cret",
    }
    argv = [*CLI, "serve", "-w", str(ws.root), "--transport", "http", "--port", "0"]
    async with await anyio.open_process(argv, env=env) as server:
        try:
            with anyio.fail_after(60):
                url = await serving_url(server)
            script = tmp_path / "example.py"
            script.write_text(code.replace("http://gpu-box:8765/mcp", url))
            with anyio.fail_after(240):
                run = await anyio.run_process([sys.executable, str(script)], check=False, env=env)
        finally:
            server.terminate()
    out, err = run.stdout.decode(), run.stderr.decode()
    assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "  [" in out  # the progress callback ran
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("  [")]
    assert len(lines) == 2  # inspect_context's next step, then the score and its next step


def own_kernel_example() -> tuple[list[str], list[str]]:
    """README "Your own kernel": its two Python files and its first shell block's commands."""
    section = (ROOT / "README.md").read_text().split("### Your own kernel", 1)[1]
    section = section.split("\n### ", 1)[0]
    files = [b.split("```", 1)[0] for b in section.split("```python\n")[1:3]]
    shell = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [ln.split(" #", 1)[0].strip() for ln in shell.splitlines()]
    return files, [c for c in commands if c and not c.startswith("#")]


@pytest.mark.slow(
    "repeats, through four CLI processes (110 s of a worker), what stays fast in "
    "tests/tasks/test_byok.py::test_eval_sweep_probe_and_guarded_verify_pass_on_the_interpreter "
    "(task new's scaffold to a passed verify), tests/servers/test_cli.py::"
    "test_init_then_eval_json_then_verify_json_succeed_on_the_cpu (the CLI's eval and verify) "
    "and test_every_harnesslab_command_in_the_readme_and_docs_parses (this example's commands)"
)
def test_the_readme_own_kernel_example_goes_from_a_function_to_a_passed_verdict(tmp_path):
    files, commands = own_kernel_example()
    (tmp_path / "myop.py").write_text(files[0])
    (tmp_path / "my_kernel.py").write_text(files[1])
    assert [c.split()[1] for c in commands] == ["task", "init", "eval", "verify"]
    env = {
        **os.environ,
        "HARNESSLAB_STATE_DIR": str(tmp_path / "state"),
        "HARNESSLAB_INTERPRET": "always",
    }
    outputs = []
    for line in commands:
        argv = line.split()
        assert argv[0] == "harnesslab"
        run = subprocess.run(
            [*CLI, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, f"{line}\n{run.stdout}\n{run.stderr}"
        outputs.append(run.stdout)
    assert "baseline matches the reference on every dev case" in outputs[0]
    assert "verdict: passed" in outputs[-1]


# -- every command the README and docs/ show ---------------------------------------------------

DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "tools").rglob("README.md")),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL = ("bash", "sh", "shell", "console")
SUBSHELL = re.compile(r"\$\([^)]*\)")  # $(date +%F), $(openssl rand -hex 16): one word


def blocks(text: str, langs: tuple[str, ...]) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang in langs]


def section(title: str) -> str:
    """The README's section under `title` (up to the next heading of any level)."""
    text = (ROOT / "README.md").read_text()
    return re.split(r"^#+ ", text.split(f"{title}\n", 1)[1], flags=re.M)[0]


def harnesslab_argvs(line: str) -> list[list[str]]:
    """The harnesslab command lines in one shell line: `VAR=v` and `sudo -u USER` prefixes
    dropped, `&&` / `;` / `(...)` split, comments and `$(...)` handled."""
    words = shlex.split(SUBSHELL.sub("X", line), comments=True)
    argvs: list[list[str]] = [[]]
    for w in words:
        if w in ("&&", ";", "||") or w.startswith("("):
            argvs.append([] if w.startswith(("&", ";", "|")) else [w.lstrip("(")])
        else:
            argvs[-1].append(w.rstrip(")"))
    out = []
    for argv in argvs:
        while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv[:1] == ["sudo"]:
            argv = argv[3:] if argv[1:2] == ["-u"] else argv[1:]
            while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                argv = argv[1:]
        if argv[:1] == ["harnesslab"]:
            out.append(argv)
    return out


def shell_lines(block: str) -> list[str]:
    return [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]


def inline_commands(text: str) -> list[list[str]]:
    """`harnesslab ...` in running text (outside fenced blocks) with at least one flag: a
    mention of a command (`harnesslab task new`) or one with an ellipsis is not a command line
    to check."""
    prose = FENCE.sub("", text)
    found = []
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if "harnesslab " not in span or "..." in span or "|" in span:
            continue
        for argv in harnesslab_argvs(span):
            if any(w.startswith("-") for w in argv):
                found.append(argv)
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    out = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        where = str(doc.relative_to(ROOT))
        for block in blocks(text, SHELL):
            for line in shell_lines(block):
                out += [(where, argv) for argv in harnesslab_argvs(line)]
        out += [(where, argv) for argv in inline_commands(text)]
    return out


def test_every_harnesslab_command_in_the_readme_and_docs_parses(capsys):
    """GPU-, SSH- and cluster-only commands cannot run here; each is at least a command line
    `harnesslab` accepts (the threat model's `--token-env` was not)."""
    from harnesslab.servers.cli import parse

    found = documented_commands()
    assert len(found) >= 40, found  # the extraction works
    bad = []
    for where, argv in found:
        try:
            parse(argv[1:])
        except SystemExit as done:  # --version and --help exit 0
            if done.code == 0:
                continue
            bad.append(f"{where}: {shlex.join(argv)}\n  {capsys.readouterr().err.strip()}")
    assert not bad, "\n".join(bad)


def test_every_python_and_toml_block_of_the_readme_is_valid():
    from harnesslab.tools.task.spec import parse_task

    readme = (ROOT / "README.md").read_text()
    for i, block in enumerate(blocks(readme, ("python",))):
        compile(block, f"README python block {i}", "exec")
    tomls = blocks(readme, ("toml",))
    assert tomls
    for block in tomls:
        tomllib.loads(block)
        if 'kind = "command"' in block:
            parse_task(block, ROOT)


def test_the_inspector_command_names_the_tested_version():
    pinned = json.loads((ROOT / "tests" / "servers" / "package.json").read_text())
    version = pinned["devDependencies"]["@modelcontextprotocol/inspector"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    mentions = re.findall(r"npx @modelcontextprotocol/inspector(@[\w.]+)?", readme)
    assert mentions and all(m == f"@{version}" for m in mentions), (mentions, version)


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLAUDE_CONFIG_DIR", "CODEX_HOME")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        **env,
        "HOME": str(home),  # `config --approve` writes ~/.claude.json and ~/.codex/config.toml
        "HARNESSLAB_STATE_DIR": str(tmp_path / "state"),
        "HARNESSLAB_INTERPRET": "always",
        "COLUMNS": "80",
        **extra,
    }


def run_documented(argv: list[str], tmp_path: Path, env: dict[str, str]):
    return subprocess.run(
        [*CLI, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_quick_start_and_the_client_setup_run_as_written(tmp_path):
    """README "Quick start" (init, eval, verify --json, doctor) and "Use it from Claude Code /
    Codex" (config claude/codex --write --approve, doctor), in that order, in one folder: no
    traceback, the exit codes the README gives, and eval's and doctor's output within 80
    columns."""
    env = cli_env(tmp_path)
    quick, setup = (
        [a for ln in shell_lines(blocks(section(title), SHELL)[0]) for a in harnesslab_argvs(ln)]
        for title in ("## Quick start", "## Use it from Claude Code / Codex")
    )
    assert [a[1] for a in quick] == ["init", "eval", "verify", "doctor"]
    assert [a[1] for a in setup] == [
        "init",
        "config",
        "config",
        "doctor",
        "config",
    ]  # the last: --prune
    for argv in [*quick, *setup[1:]]:
        run = run_documented(argv, tmp_path, env)
        line = shlex.join(argv)
        assert "Traceback" not in run.stderr, f"{line}\n{run.stderr}"
        assert run.returncode in ((0, 1) if argv[1] == "doctor" else (0,)), f"{line}\n{run.stderr}"
        if argv[1] in ("eval", "doctor"):
            assert max(len(ln.rstrip()) for ln in run.stdout.splitlines()) <= 80, run.stdout
        if argv[1] == "verify":
            assert json.loads(run.stdout)["verdict"] == "passed"
    assert (tmp_path / "ws" / ".mcp.json").is_file()
    assert (tmp_path / "ws" / ".codex" / "config.toml").is_file()


@pytest.mark.anyio
async def test_the_shared_http_server_and_its_client_entry_run_as_written(tmp_path):
    """README "Over MCP": the shared server (`--host 0.0.0.0`, a token from HARNESSLAB_TOKEN;
    any free port instead of 8765) starts, and the client entry for it is written."""
    lines = shell_lines(blocks(section("### 1. Over MCP: a running server"), SHELL)[0])
    argvs = [a for ln in lines for a in harnesslab_argvs(ln)]
    serve = next(a for a in argvs if "--transport" in a)
    entry = next(a for a in argvs if "--token-env" in a)
    assert any(ln.startswith("export HARNESSLAB_TOKEN=") for ln in lines)
    ws = kernel_workspace(tmp_path)
    env = cli_env(tmp_path, HARNESSLAB_TOKEN="s3cret")
    port = serve.index("--port") + 1
    argv = [*CLI, *serve[1:port], "0", *serve[port + 1 :]]
    argv[argv.index("ws")] = str(ws.root)
    async with await anyio.open_process(argv, env=env) as server:
        try:
            with anyio.fail_after(60):
                url = await serving_url(server)
        finally:
            server.terminate()
    assert url.endswith("/mcp")
    (tmp_path / "ws").mkdir(exist_ok=True)
    made = run_documented(entry, tmp_path, env)
    assert made.returncode == 0, made.stderr
    config = json.loads((tmp_path / "ws" / ".mcp.json").read_text())
    assert "HARNESSLAB_TOKEN" in json.dumps(config)


def test_make_install_takes_torch_from_the_cpu_index():
    """The CPU venv gets PyTorch's CPU wheel (a machine without a local wheel pulled the
    multi-GB CUDA one)."""
    dry = subprocess.run(
        ["make", "-n", "-B", "install", "VENV=/nonexistent/venv"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = dry.stdout.replace("\\\n", " ").splitlines()
    torch_line = next(ln for ln in lines if "pip install" in ln and "torch==" in ln)
    assert "https://download.pytorch.org/whl/cpu" in torch_line, torch_line

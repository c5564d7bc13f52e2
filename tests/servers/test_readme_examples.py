"""The README's MCP SDK example, run as written against a real `serve --transport http` with a
token (only the host name is replaced): it must finish without a traceback and print the
progress its callback receives."""

from __future__ import annotations

import os
import subprocess
import sys
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

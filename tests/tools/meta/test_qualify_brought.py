"""Servers brought from elsewhere (HarnessGym's among them) through `harnesslab qualify`: a
Content-Length framed server fails startup with a message that says so, and "tests": null in a
manifest means no tests, not a missing folder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import make_workspace

# What a HarnessGym server does on stdio: LSP-style frames, headers then a body, both ways.
FRAMED_SERVER = textwrap.dedent(
    """
    import json, sys

    def read_frame(stream):
        headers = {}
        while True:
            line = stream.readline()
            if not line:
                return None
            if line in (b"\\r\\n", b"\\n"):
                break
            key, sep, value = line.decode("ascii", "replace").partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise ValueError("missing Content-Length header")
        return json.loads(stream.read(int(headers["content-length"])))

    def write_frame(obj):
        body = json.dumps(obj).encode()
        sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
        sys.stdout.buffer.flush()

    if "--self-test" in sys.argv:
        sys.exit(0)
    while True:
        msg = read_frame(sys.stdin.buffer)
        if msg is None:
            break
        if msg.get("id") is not None:
            write_frame({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                "serverInfo": {"name": "framed", "version": "0"}}})
    """
)
LINE_SERVER = textwrap.dedent(
    '''
    import sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("brought")


    @server.tool()
    async def echo(text: str) -> dict[str, str]:
        """Echo the text back."""
        return {"text": text}


    if __name__ == "__main__":
        if "--self-test" in sys.argv:
            sys.exit(0)
        server.run()
    '''
)


def brought(folder: Path, source: str, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "server.py").write_text(source)
    manifest = {
        "name": name,
        "command": sys.executable,
        "args": ["{server_dir}/server.py"],
        "startup_timeout_s": 5,
        "tools": [{"name": "echo", "probe_args": {"text": "hi"}, "timeout_s": 10}],
        "self_test": {"args": ["{server_dir}/server.py", "--self-test"], "timeout_s": 30},
        "tests": None,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def qualify(path: Path, ws: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", "qualify", str(path), "-w", str(ws), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={"HARNESSLAB_STATE_DIR": str(state / "state"), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def ws_root(tmp_path: Path) -> Path:
    return make_workspace(tmp_path).root


def test_a_content_length_framed_server_fails_startup_saying_so(tmp_path, ws_root):
    res = qualify(brought(tmp_path / "framed", FRAMED_SERVER, "framed"), ws_root, tmp_path)
    report = json.loads(res.stdout)
    startup = next(c for c in report["checks"] if c["name"] == "startup")
    # Before: "no answer to initialize within 5s" and an empty stderr section.
    assert res.returncode == 1 and not startup["passed"]
    assert "Content-Length headers" in startup["evidence"]
    assert "one JSON-RPC message per line" in startup["evidence"]
    assert "one JSON message per line" in startup["next_step"]


def test_tests_null_means_no_tests_not_a_missing_folder(tmp_path, ws_root):
    res = qualify(brought(tmp_path / "plain", LINE_SERVER, "brought"), ws_root, tmp_path)
    report = json.loads(res.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    # Before: own_tests failed with "no tests folder" although the manifest said "tests": null.
    assert checks["own_tests"]["passed"], checks["own_tests"]
    assert "null" in checks["own_tests"]["evidence"]
    assert res.returncode == 0 and report["passed"], res.stdout[-3000:]

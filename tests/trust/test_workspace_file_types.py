"""Fuzz: every workspace file a tool reads, replaced by the wrong type of thing (a folder, a FIFO,
non-UTF-8 bytes, a 5000-digit integer, JSON nested 200000 deep, an empty file), under every tool
of the task server. Each call answers with a result or a ToolError that names the file; none is
an internal error, none names a file descriptor ("Is a directory: 9"), and the server keeps
serving once the file is fixed. The gate is tools/state/workspace_files.py."""

from __future__ import annotations

import os
import shutil

import pytest

from .support import SMALL, canned_state, init_ws, text_of, tool_calls

pytestmark = pytest.mark.anyio

CALLS = [
    ("inspect_context", {}),
    ("run_objective", {"cases": [SMALL]}),
    ("sweep_kernel_config", {"space": {"num_warps": [2, 4]}, "cases": [SMALL]}),
    ("numerical_probe", {"probes": ["zero_rows"]}),
    ("rank_history", {}),
    ("restore_best_checkpoint", {}),
    ("remote_health_check", {}),
]
WRONG = {
    "folder": None,
    "fifo": None,
    "binary": b"\xff\xfe\x00\x01",
    "bignum": b'{"num_warps": ' + b"9" * 5000 + b"}",
    "deep": b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "empty": b"",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def plant(path, wrong: str) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if wrong == "folder":
        path.mkdir()
        (path / "x").write_text("{}")
    elif wrong == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(WRONG[wrong])


@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("name", ["kernel_config.json", "kernel.py"])
async def test_a_workspace_file_of_the_wrong_type_is_a_clear_error_under_every_tool(
    tmp_path, monkeypatch, capsys, name, wrong
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    good = (root / name).read_bytes()
    plant(root / name, wrong)
    state = canned_state(root, tmp_path)
    try:
        results = await tool_calls(state, *CALLS)
        for (tool, _), res in zip(CALLS, results, strict=True):
            text = text_of(res)
            assert "internal error" not in text, (tool, text)
            assert "Is a directory" not in text and "Errno" not in text, (tool, text)
            if res.is_error:
                assert name in text or tool == "restore_best_checkpoint", (tool, text)
        plant(root / name, "empty")
        (root / name).write_bytes(good)
        (ok,) = await tool_calls(state, ("inspect_context", {}))
        assert not ok.is_error, text_of(ok)
    finally:
        await state.aclose()

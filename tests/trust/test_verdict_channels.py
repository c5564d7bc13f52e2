"""Attack: read a hidden case out through the verdict. The candidate sees every hidden case's
inputs while it runs; whatever a public verdict repeats of that run is a channel out of the
sandbox. tools/integrity/cheats/cpu/error_readout.py writes a value V (the case's dim times
SCALE) where the reference is exactly 0, and a verdict that published the error gave V back.

Pinned here: `harnesslab verify --json`, guarded_final_verify's answer and its progress, the
ledger's reason (inspect_context) and its view in the workspace carry neither V nor any number
that depends on it, so two candidates that fail the same hidden case with different values get
byte-identical public verdicts. The operator's `--reveal-cases` still shows V."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.task_server import build_task_server
from harnesslab.tools.integrity.verdict_view import public_verdict
from harnesslab.tools.integrity.verify import Verdict
from harnesslab.tools.state.secrets_store import workspace_secret
from harnesslab.tools.task.spec import load_task

from .support import TASK, cli, init_ws, settings_for

pytestmark = pytest.mark.slow
CHEAT = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats/cpu/error_readout.py"
SCALES = (1.0, 0.625)  # two values written where the reference is 0
# Public fields that differ between two verdicts for reasons no run chooses: the candidate's
# hash (its source), the ledger record's id, the copy bandwidth (measured before any candidate
# process exists: noise of the machine).
OWN = {"candidate", "record_id", "copy_gbps"}
HEARTBEAT = re.compile(r"guarded verify running \(\d+ s\)")  # on a timer, never per case


def readout(root: Path, scale: float) -> None:
    text = CHEAT.read_text()
    assert "SCALE = 1.0" in text
    (root / "kernel.py").write_text(text.replace("SCALE = 1.0", f"SCALE = {scale}"))


def first_dim(tmp: Path, root: Path) -> int:
    final = load_task(TASK).final
    assert final is not None
    return final.draw(workspace_secret(settings_for(tmp), root)["seed"])[0].shape["dim"]


def without(obj: Any, keys: set[str]) -> Any:
    if isinstance(obj, dict):
        return {k: without(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [without(v, keys) for v in obj]
    return obj


def numbers(obj: Any) -> list[float]:
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in numbers(v)]
    return [float(obj)] if isinstance(obj, int | float) and not isinstance(obj, bool) else []


def texts(obj: Any, key: str = "") -> list[str]:
    """Every reason and detail text (hashes and ids left out: hex digits match by chance)."""
    if isinstance(obj, dict):
        return [t for k, v in obj.items() for t in texts(v, k)]
    if isinstance(obj, list):
        return [t for v in obj for t in texts(v, key)]
    return [obj] if isinstance(obj, str) and key in ("reason", "detail", "next_step") else []


def assert_no_value_near(obj: Any, value: float) -> None:
    """No number within 2% of `value` (fp16/bf16 rounding of what was written), and no text
    that spells it."""
    obj = without(obj, OWN)
    near = [n for n in numbers(obj) if abs(n - value) <= 0.02 * value]
    assert near == [], f"{value} came back as {near}"
    for text in texts(obj):
        for shown in (
            f"{value:g}",
            f"{value:.3g}",
            f"{value:.2e}",
            f"{value:.3g}".replace("+0", "+"),
        ):
            assert shown not in text, f"{shown} is in {text!r}"


async def mcp_verify(root: Path, tmp: Path) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """guarded_final_verify's answer, its progress messages, and inspect_context's answer."""
    messages: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    state = ServerState.open(root, settings_for(tmp))
    try:
        async with Client(build_task_server(state)) as client:
            with anyio.fail_after(300):
                ver = await client.call_tool(
                    "guarded_final_verify", {}, progress_callback=on_progress
                )
                ctx = await client.call_tool("inspect_context", {})
        assert not ver.is_error and not ctx.is_error
        return ver.structured_content, messages, ctx.structured_content
    finally:
        await state.aclose()


def test_a_value_written_where_the_reference_is_zero_never_comes_back(
    tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    dim = first_dim(tmp_path, root)
    a, b = SCALES
    readout(root, a)
    code, out, err = cli(["verify", "-w", str(root), "--json"], tmp_path, monkeypatch, capsys)
    public_a = json.loads(out)
    assert code == 1 and public_a["verdict"] == "rejected", err
    assert public_a["reasons"][0]["code"] == "wrong_output"
    assert_no_value_near(public_a, dim * a)

    ver, messages, ctx = anyio.run(mcp_verify, root, tmp_path)
    assert ver["verdict"] == "rejected" and ver["reasons"] == public_a["reasons"]
    assert_no_value_near(ver, dim * a)
    assert_no_value_near(ctx, dim * a)  # the ledger's reason, as inspect_context shows it
    assert_no_value_near(json.loads((root / ".harnesslab/history.json").read_text()), dim * a)
    # Progress says nothing of the cases: not how many ran, nor which one ended it.
    assert messages and all(HEARTBEAT.fullmatch(m) for m in messages), messages

    # Another value, the operator's view: it holds the figure and where it was written...
    readout(root, b)
    argv = ["verify", "-w", str(root), "--json", "--reveal-cases"]
    _, out, _ = cli(argv, tmp_path, monkeypatch, capsys)
    full = Verdict.model_validate_json(out)
    err_b = full.result.cases[0].max_abs_err
    assert err_b is not None and abs(err_b - dim * b) <= 0.02 * dim * b
    # the edge where the reference is zero: the generic suite's "zeros" or the task's probe
    assert re.search(r"\((zeros|zero_rows)\)", full.reasons[0]["detail"]), full.reasons
    assert full.evidence["checks"]["calls_checked"] > full.evidence["checks"]["calls_passed"]
    # ...and what an agent gets of it is byte for byte the first candidate's.
    public_b = json.loads(json.dumps(public_verdict(full)))
    assert json.dumps(without(public_a, OWN), sort_keys=True) == json.dumps(
        without(public_b, OWN), sort_keys=True
    )

"""Helpers for the task-server tests: workspaces, states, a canned launcher, a command task.

`CannedLauncher` is the real Launcher (slots, GPU locks, staging) whose runner answers from a
template instantly: the tests of argument handling, presets, pagination and fuzzing need the
server's behaviour, not the Triton interpreter's seconds per case.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harnesslab.servers.builtin import ServerState
from harnesslab.tools.execution.launcher import Launcher, RunnerCall
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.telemetry import Telemetry
from harnesslab.tools.state.workspace import Workspace, init_workspace, open_workspace

SMALL = "1024x1024_fp16"
TOOL_NAMES = {
    "inspect_context",
    "run_objective",
    "sweep_kernel_config",
    "numerical_probe",
    "guarded_final_verify",
    "rank_history",
    "restore_best_checkpoint",
    "profile_kernel",
    "remote_health_check",
}
ENV = {
    "device": "canned",
    "torch": "0",
    "triton": "0",
    "interpret": True,
    "meaningful": False,
}


def settings(tmp: Path) -> Settings:
    return Settings(state_dir=tmp / "state", interpret="always")


def state_for(root: Path, tmp: Path, launcher: Launcher | None = None) -> ServerState:
    cfg = settings(tmp)
    ws = open_workspace(root, cfg)
    return ServerState(
        workspace=ws,
        launcher=launcher or Launcher(cfg),
        settings=cfg,
        telemetry=Telemetry(ws.telemetry_path, "test-server", guard=ws.root),
        name="test-server",
    )


def kernel_workspace(tmp: Path) -> Workspace:
    return init_workspace("rmsnorm_gate", tmp / "ws", settings(tmp))


def _case(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": c["name"],
        "dtype": c["dtype"],
        "shape": c["shape"],
        "passed": True,
        "status": "passed",
        "median_us": 10.0,
        "p10_us": 9.0,
        "p90_us": 11.0,
        "spread": 0.2,
    }


def canned_result(req: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    mode = req.get("mode")
    if mode in ("evaluate", "verify"):
        cases = [_case(c) for c in req["cases"]]
        res = {"status": "passed", "score_us": 10.0 * len(cases), "cases": cases}
        events = [{"event": "case", **c} for c in cases]
    elif mode == "sweep":
        configs = [
            {
                "config": cfg,
                "status": "passed",
                "score_us": 10.0 + float(cfg.get("num_warps", 0)),
                "reason": "",
                "cases": [_case(c) for c in req["cases"]],
            }
            for cfg in req["configs"]
        ]
        res = {"status": "passed", "configs": configs}
        events = [{"event": "config", "index": i, **c} for i, c in enumerate(configs)]
    elif mode == "probe":
        probes = [
            {"probe": p, "dtype": d, "passed": True, "reason": "", "max_abs_err": 0.0}
            for p in req["probes"]
            for d in req["dtypes"]
        ]
        res = {"status": "passed", "probes": probes}
        events = [{"event": "probe", **p} for p in probes]
    else:
        res, events = {"status": "passed", "copy_gbps": 1.0}, []
    return {**res, "env": ENV, "mode": mode}, events


class CannedLauncher(Launcher):
    """A Launcher whose runner answers instantly from a template, under the real slot lock.
    `before_result(request)` runs inside the lock, before the answer (a hook for tests)."""

    def __init__(self, cfg: Settings) -> None:
        super().__init__(cfg)
        self.requests: list[dict[str, Any]] = []
        self.before_result: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    async def call(self, request: dict[str, Any], **kw: Any) -> RunnerCall:
        slot = kw.get("slot") or self.pick()
        on_event = kw.get("on_event")
        async with slot.lock:
            self.requests.append(request)
            if self.before_result is not None:
                await self.before_result(request)
            result, events = canned_result(request)
            for ev in events:
                if on_event is not None:
                    maybe = on_event(ev)
                    if maybe is not None:
                        await maybe
        self.last_env = ENV
        return RunnerCall(
            result={"event": "result", **result},
            events=[*events, {"event": "result", **result}],
            exit_code=0,
            timed_out=False,
            stderr_tail="",
            host="canned",
            gpu_index=0,
            wall_s=0.001,
        )


SCORE_PY = textwrap.dedent(
    """
    import json, pathlib, sys
    text = pathlib.Path("solution.txt").read_text().strip()
    if text == "crash":
        print("boom", file=sys.stderr)
        sys.exit(3)
    print("a log line before the JSON")
    print(json.dumps({"best_us": float(text), "note": "lower is better"}))
    """
)


def command_task(tmp: Path, value: str = "50") -> Path:
    """A command task folder: task.toml + task.md + score.py + the editable solution.txt."""
    root = tmp / "cmdtask"
    root.mkdir()
    (root / "task.toml").write_text(
        textwrap.dedent(
            f"""
            name = "cmdtask"
            summary = "Make best_us small by editing solution.txt."
            kind = "command"
            editable = ["solution.txt"]
            objective = "{sys.executable} score.py"
            score_key = "best_us"
            """
        )
    )
    (root / "task.md").write_text("Lower best_us is better.\n")
    (root / "score.py").write_text(SCORE_PY)
    (root / "solution.txt").write_text(value + "\n")
    return root


def text_of(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def serving_url(proc) -> str:
    """The URL `harnesslab serve --transport http` prints on stderr once it listens."""
    buf = b""
    assert proc.stderr is not None
    async for chunk in proc.stderr:
        buf += chunk
        for line in buf.decode(errors="replace").splitlines():
            if "serving on " in line:
                return line.split("serving on ", 1)[1].strip()
    raise AssertionError(f"server exited: {buf.decode(errors='replace')[-2000:]}")

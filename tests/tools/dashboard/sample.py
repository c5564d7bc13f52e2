"""A workspace with something to show, written through the real writers (run state, ledger and
hidden results via record_run, checkpoints, telemetry, the registry), in well under a second:
the dashboard's unit tests read it back. Nothing here runs a kernel."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harnesslab.tools.evaluation.recording import record_run
from harnesslab.tools.loop.state import Best, Iteration, RunConfig, RunState, RunStore, Score
from harnesslab.tools.loop.turn import TurnOutcome
from harnesslab.tools.meta.bundle import QualificationReport
from harnesslab.tools.meta.qualify_checks import Check
from harnesslab.tools.meta.registry import record_generated, record_qualification
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.storage import hash_files
from harnesslab.tools.state.telemetry import Telemetry
from harnesslab.tools.state.workspace import Candidate, Workspace, init_workspace

# A hidden case's shape and its per-case timing: the page must never show them.
HIDDEN_ROWS, HIDDEN_DIM, HIDDEN_US = 12347, 6781, 4242.4242
RUN_ID = "run-a"
T0 = time.time() - 1000  # the sample run began this long ago


def settings(tmp: Path) -> Settings:
    return Settings(state_dir=tmp / "state", interpret="always")


def kernel_files(ws: Workspace, marker: str) -> dict[str, bytes]:
    files = ws.editable_files()
    files["kernel.py"] = files["kernel.py"] + f"\n# {marker}\n".encode()
    return files


def record(ws: Workspace, files: dict[str, bytes], mode: str, score: float, **extra: Any) -> str:
    hidden = None
    if mode == "final":
        hidden = [
            {
                "name": "final0_fp16",
                "shape": {"rows": HIDDEN_ROWS, "dim": HIDDEN_DIM},
                "median_us": HIDDEN_US,
            }
        ]
    done = record_run(
        ws,
        Candidate.of(files),
        {
            "meaningful": False,
            "sandbox": "full",
            "geomean_pct_of_copy_bw": 12.5,
            "certifies": "outputs" if mode == "final" else None,
            # An old ledger's final record kept per-case figures: the page shows none of them.
            "cases": [
                {
                    "name": "final0_fp16",
                    "shape": {"rows": HIDDEN_ROWS, "dim": HIDDEN_DIM},
                    "median_us": HIDDEN_US,
                }
            ]
            if mode == "final"
            else [],
            **extra,
        },
        mode=mode,
        case_set="final-abc" if mode == "final" else "dev",
        status="passed",
        score=score,
        hidden=hidden,
    )
    return done.record_id


def score(value: float | None, candidate: str, verdict: str = "passed") -> Score:
    return Score(
        verdict=verdict,  # type: ignore[arg-type]
        score_us=value,
        candidate=candidate,
        case_set="final-abc",
        certifies="outputs" if verdict == "passed" else "nothing",
        reasons=[] if verdict == "passed" else ["the output was wrong on a hidden case"],
        wall_s=2.0,
    )


def turn(status: str, start: float, seconds: float) -> TurnOutcome:
    return TurnOutcome(
        phase="attempt",
        status=status,  # type: ignore[arg-type]
        duration_s=seconds,
        started_at=start,
        finished_at=start + seconds,
    )


def write_run(ws: Workspace, base: str, better: str) -> RunState:
    """A run of 3 planned iterations: baseline, a new best, a rejected attempt, a third still
    scoring."""
    cfg = RunConfig(task="rmsnorm_gate", workspace=ws.root, iterations=3)
    state = RunState(run_id=RUN_ID, config=cfg, created_at=T0, status="running")
    state.baseline = score(100.0, base)
    state.iterations = [
        Iteration(
            index=1,
            step="done",
            started_at=T0 + 10,
            finished_at=T0 + 60,
            attempt=turn("ok", T0 + 10, 30),
            score=score(80.0, better),
            new_best=True,
            build_skipped="build never",
        ),
        Iteration(
            index=2,
            step="done",
            started_at=T0 + 60,
            finished_at=T0 + 100,
            attempt=turn("timeout", T0 + 60, 30),
            score=score(None, base, "rejected"),
        ),
        Iteration(index=3, step="score", running="score", started_at=T0 + 100),
    ]
    state.best = Best(score_us=80.0, candidate=better, iteration=1, case_set="final-abc")
    store = RunStore(ws, RUN_ID)
    store.save(state)
    return state


def sample_workspace(tmp: Path) -> Workspace:
    ws = init_workspace("rmsnorm_gate", tmp / "ws", settings(tmp))
    base_files, better_files = kernel_files(ws, "base"), kernel_files(ws, "better")
    record(ws, base_files, "dev", 50.0)
    record(ws, base_files, "final", 100.0)
    record(ws, better_files, "final", 80.0)
    write_run(ws, hash_files(base_files), hash_files(better_files))
    # Telemetry stamps the wall clock: these calls fall in iteration 3 (running since T0 + 100).
    tel = Telemetry(ws.telemetry_path, "harnesslab-task", guard=ws.root)
    for tool, status, ms in [
        ("run_objective", "ok", 100.0),
        ("run_objective", "ok", 300.0),
        ("run_objective", "tool_error", 200.0),
        ("sweep_kernel_config", "ok", 900.0),
    ]:
        assert tel.record(tool, arg_names=[], duration_s=ms / 1e3, status=status) is not None  # type: ignore[arg-type]
    record_generated(ws, "rmsnorm-tuned", ["sweep_winning_region"])
    record_qualification(
        ws,
        QualificationReport(
            server="rmsnorm-tuned",
            server_dir=str(ws.root / ".harnesslab/mcp/rmsnorm-tuned"),
            passed=False,
            checks=[
                Check(name="self_test", passed=True, evidence="3 tools answered"),
                Check(name="cheats", passed=False, evidence="<script>alert(1)</script> passed"),
            ],
            tools=["sweep_winning_region"],
            duration_s=4.5,
            bundle_hash="feedbeef",
            qualified_at=time.time(),
        ),
    )
    return ws


__all__ = ["HIDDEN_DIM", "HIDDEN_ROWS", "HIDDEN_US", "RUN_ID", "T0", "sample_workspace", "settings"]

"""The step verify's incumbent comparison on a GPU at task.toml's sizes (tests/gpu/conftest.py
marks these gpu): the best checkpoint timed beside the candidate in the same verify, A B B A per
half segment (gpu/verify/step_timed.py), in a sandboxed process and device arena of its own.

The same eager step under a new hash (a comment appended) is its own incumbent: every trace has
both times, the comparison is meaningful, and the speedup is near 1 (two separate verifies of
that step scored 27204.9 and 22030.2 us on an H100: the interleaving is what makes them
comparable). The printed rows are the measurement; the bound only catches a comparison that is
not made in the same stretch of time."""

from __future__ import annotations

import anyio

from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.step_verify import guarded_step_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace


def test_the_same_step_under_a_new_hash_is_timed_beside_itself_within_a_few_percent(tmp_path):
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("decode_step", tmp_path / "ws", settings)
    eager = (ws.root / "kernel.py").read_text()

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(1200):
                first = await guarded_step_verify(ws, launcher, settings)
                (ws.root / "kernel.py").write_text(eager + "\n# the same step, a new hash\n")
                return first, await guarded_step_verify(ws, launcher, settings)
        finally:
            await launcher.aclose()

    first, second = anyio.run(go)
    assert first.verdict == second.verdict == "passed", (first.reasons, second.reasons)
    inc = second.incumbent
    assert inc is not None and inc["hash"] == first.evidence["candidate"] and inc["meaningful"]
    phases = second.evidence.get("runner_phases_s") or {}
    print("first score", first.score_us, "second score", second.score_us)
    print("same verify: speedup", inc["speedup"], "rows", inc["cases"], "error", inc["error"])
    print("phases", {k: round(t, 2) for k, t in phases.items()},
          "wall", round(second.evidence.get("runner_wall_s") or 0, 1))  # fmt: skip
    assert inc["error"] is None and all(r["incumbent_passed"] for r in inc["cases"])
    assert phases.get("incumbent", 0) > 0
    assert 0.9 < inc["speedup"] < 1.1, inc

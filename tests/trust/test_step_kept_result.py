"""A decode step whose result is a tensor made before the step (a buffer kept in a module), filled
out of the recorder's sight (torch's _disable_current_modes, as the replay corpus's
hidden_cache_append does for the cache), so that no recorded call of the step touches it: the
only place the recorder meets the buffer is the step's result. The replay has no such storage;
the whole sandboxed step verify (step.replay "always": the eager step is torch operators only,
which the CPU records and replays) must refuse it in the harness's words for that
(`unreplayable`, foreign_tensor's sentence). Fails on step_record.py before 51a5c60, which named
the result after it had copied the recording's reasons: the recording then broke the schema
(forged_recording). A buffer the step writes with a recorded call (copy_) is named there, and
was refused as foreign before that fix too."""

from __future__ import annotations

from pathlib import Path

from harnesslab.tests.conftest_shared import make_workspace, verify_step
from harnesslab.tools.gpu.verify.step_schema import STEP_UNREPLAYABLE
from harnesslab.tools.task import load_task

BASELINE = load_task("decode_step").workspace_template / "kernel.py"
RETURN = '    return F.linear(_rmsnorm(x, w["final_norm"], c.eps), w["lm_head"])\n'
KEPT = """    logits = F.linear(_rmsnorm(x, w["final_norm"], c.eps), w["lm_head"])
    with _disable_current_modes():
        out = _KEPT.get(tuple(logits.shape))
        if out is None:
            out = _KEPT[tuple(logits.shape)] = torch.empty_like(logits)
        out.copy_(logits)
    return out


_KEPT: dict = {}
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402
"""


def test_a_step_returning_a_kept_buffer_is_unreplayable_in_the_harness_words(tmp_path: Path):
    text = BASELINE.read_text()
    assert text.count(RETURN) == 1  # the baseline's last line: the candidate below is built on it
    ws = make_workspace(tmp_path, "decode_step")
    ws.task.step.replay = "always"  # type: ignore[union-attr]
    _, v = verify_step(tmp_path, text.replace(RETURN, KEPT), ws)
    assert v.verdict == "rejected", v.reasons
    assert [r["code"] for r in v.reasons] == ["unreplayable"], v.reasons
    assert STEP_UNREPLAYABLE["foreign_tensor"] in v.reasons[0]["detail"], v.reasons

"""Every runner mode that imports agent code is started inside the sandbox: the modes the runner
dispatches (runner.MODES, and "health" in runner.handle), less the trusted parents that sandbox
their own children ("verify", "step_verify") and "health" (no candidate), are exactly the
launcher's SANDBOXED_MODES. A new mode (step_profile was one) that is not listed would run the
candidate unsandboxed."""

from __future__ import annotations

import pytest

from harnesslab.tools.execution.launcher import SANDBOXED_MODES
from harnesslab.tools.gpu import runner

TRUSTED_PARENTS = {"verify", "step_verify"}


def test_every_mode_that_imports_agent_code_is_sandboxed():
    modes = set(runner.MODES)
    assert {"evaluate", "step", "probe", "step_profile", "verify"} <= modes
    assert modes - TRUSTED_PARENTS == set(SANDBOXED_MODES)


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        runner.dispatch(None, {"mode": "nope"}, None, "nope")  # type: ignore[arg-type]
